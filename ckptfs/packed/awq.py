"""AWQ (AutoAWQ checkpoints, 4-bit with zero points): ``qweight``, ``qzeros``, ``scales`` per layer.

Two packings, named by the ``version`` setting:

- GEMM: ``qweight`` int32 ``[in, out / 8]``, ``qzeros`` int32 ``[groups, out / 8]``, ``scales`` fp16
  ``[groups, out]``. Nibble ``k`` (bits ``4k..4k+3``) of word ``c`` holds output column ``8c + ORDER[k]``,
  ``ORDER = [0, 2, 4, 6, 1, 3, 5, 7]`` (AutoAWQ's ``WQLinear_GEMM.from_linear``), so column ``8c + j`` is
  nibble ``REVERSE_ORDER[j]``, ``REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]`` (its ``reverse_awq_order``).
- GEMV: ``qweight`` int32 ``[out, in / 8]`` with nibble ``k`` of word ``c`` = input column ``8c + k`` (the
  natural order), ``qzeros`` int32 ``[out, W]`` and ``scales`` fp16 ``[out, 8 W]`` where ``W`` is the groups
  rounded up (``calculate_zeros_width``): the first ``groups`` entries of each row are used.

``W[o, i] = (q - z) * s`` for the group ``i // group_size``, computed in fp16 as AutoAWQ's
``dequantize_gemm`` does (GEMV has no dequantizer of its own: its values are defined the same way).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.packed import native
from ckptfs.packed.bits import round_to, scale_to_f32, unpack_fields
from ckptfs.packed.detect import Method, Scheme, one_format
from ckptfs.packed.base import (INT32_TYPES, SCALE_TYPES, Absent, Context, Layout, Parts, check_ndim, check_shape,
                                check_type, f16_fast,
                                group_index_fast, int_setting, require)

ROLES = ("qweight", "qzeros", "scales")
REVERSE_ORDER = np.array([0, 4, 1, 5, 2, 6, 3, 7])
VERSIONS = ("gemm", "gemv")
SCHEMES = [Scheme("awq", "awq", "", "awq", "qweight", ROLES)]
METHODS = [Method("awq", one_format)]


def build(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any],
          context: Context | None = None) -> Layout:
    bits = int_setting(settings, "bits", "w_bit")
    if bits != 4:
        raise Absent(f"AWQ bits={bits} is not supported (4)")
    group_size = int_setting(settings, "group_size", "q_group_size", default=-1)
    if group_size == 0 or group_size < -1:
        raise Absent(f"AWQ group_size={group_size} is not valid")
    version = str(settings.get("version") or "gemm").lower()
    if version not in VERSIONS:
        raise Absent(f"AWQ version {version!r} is not supported (gemm or gemv)")
    if not settings.get("zero_point", True):
        raise Absent("AWQ without zero points (zero_point: false) is not supported")

    qweight = require(parts, "qweight", prefix)
    qzeros = require(parts, "qzeros", prefix)
    scales = require(parts, "scales", prefix)
    for info in (qweight, qzeros):
        check_type(info, INT32_TYPES)
        check_ndim(info, 2)
    check_type(scales, SCALE_TYPES)
    check_ndim(scales, 2)
    if version == "gemm":
        in_features, out = qweight.shape[0], qweight.shape[1] * 8
    else:
        out, in_features = qweight.shape[0], qweight.shape[1] * 8
    if out == 0 or in_features == 0:
        raise Absent(f"{qweight.name} has an empty shape {list(qweight.shape)}")
    gsize = in_features if group_size == -1 else group_size
    if in_features % gsize:
        raise Absent(f"in_features {in_features} is not a multiple of group_size {group_size}")
    groups = in_features // gsize
    why = f"AWQ {version} group_size={group_size}"
    parameters = {"bits": bits, "group_size": group_size, "groups": groups, "version": version,
                  "zero_point": True}
    used = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
    st = scales.storage_type

    if version == "gemm":
        check_shape(scales, (groups, out), why)
        check_shape(qzeros, (groups, out // 8), why)

        def inputs(reader: Parts, o0: int, o1: int):
            """Rows [o0, o1)'s zero points (int16) and scales (float32), cached per layer, shared by both
            decoders."""
            def zeros_t() -> np.ndarray:
                return _gemm_rows(np.ascontiguousarray(reader.whole("qzeros").T)).astype(np.int16)

            def scales_t() -> np.ndarray:
                return np.ascontiguousarray(scale_to_f32(reader.whole("scales"), st).T)

            z = reader.derived("awq-gemm:zeros_t", ("qzeros",), (out, groups), zeros_t)[o0:o1]
            s = reader.derived("scales_t", ("scales",), (out, groups), scales_t)[o0:o1]
            return z, s

        def decode(reader: Parts, o0: int, o1: int, dest: np.ndarray | None) -> np.ndarray:
            z, s = inputs(reader, o0, o1)
            # qweight's columns pack the weight's rows: transposed once per layer (cached, see gptq)
            words = reader.derived("qweight_t", ("qweight",), (out // 8, in_features),
                                   lambda: reader.read_whole("qweight").T)[o0 // 8: -(-o1 // 8)]
            q = _gemm_rows(words)[o0 - o0 // 8 * 8:][:o1 - o0]
            return round_to(group_index_fast(q, z.astype(np.float32), s, gsize, dest), st,
                            f16_fast(reader, "scales", st, 16))

        def kernel(reader: Parts, o0: int, o1: int, dest: np.ndarray) -> bool:
            z, s = inputs(reader, o0, o1)
            # qweight as stored (cached whole): column c packs rows 8c..8c+7, word i of it is qweight[i, c]
            words = reader.whole("qweight").reshape(-1)[o0 // 8:]
            return native.dequantize_rows(dest, words, 4, in_features, z, s, gsize, st, awq_phase=o0 % 8,
                                          row_step=1, word_step=out // 8)

        return Layout("awq", parameters, out, in_features, used, st, decode, row_align=8, kernel=kernel)

    width = qzeros.shape[1]
    if width * 8 < groups:
        raise Absent(f"{qzeros.name} has shape {list(qzeros.shape)}, too narrow for {groups} groups ({why})")
    check_shape(qzeros, (out, width), why)
    if scales.shape[0] != out or scales.shape[1] < groups:
        raise Absent(f"{scales.name} has shape {list(scales.shape)}, {why} expects [{out}, >= {groups}]")

    def decode_gemv(reader: Parts, o0: int, o1: int, dest: np.ndarray | None) -> np.ndarray:
        q = unpack_fields(reader.rows("qweight", o0, o1), 4, in_features)
        z = unpack_fields(reader.rows("qzeros", o0, o1), 4, groups).astype(np.float32)
        s = scale_to_f32(reader.rows("scales", o0, o1)[:, :groups], st)
        return round_to(group_index_fast(q, z, s, gsize, dest), st, f16_fast(reader, "scales", st, 16))

    def kernel_gemv(reader: Parts, o0: int, o1: int, dest: np.ndarray) -> bool:
        z = unpack_fields(reader.rows("qzeros", o0, o1), 4, groups).astype(np.int16)
        s = scale_to_f32(reader.rows("scales", o0, o1)[:, :groups], st)
        return native.dequantize_rows(dest, reader.rows("qweight", o0, o1), 4, in_features, z, s, gsize, st)

    return Layout("awq", parameters, out, in_features, used, st, decode_gemv, kernel=kernel_gemv)


def _gemm_rows(words_t: np.ndarray) -> np.ndarray:
    """GEMM-packed words, transposed (``int32[c, n]``: word ``c`` of each of ``n`` inputs or groups), as the
    weight's rows ``uint8[8c, n]``: row ``8c + j`` is nibble ``REVERSE_ORDER[j]`` of each word ``c``."""
    c, n = words_t.shape
    nibbles = unpack_fields(words_t, 4, 8 * n).reshape(c, n, 8)[:, :, REVERSE_ORDER]
    return np.ascontiguousarray(nibbles.transpose(0, 2, 1)).reshape(8 * c, n)
