"""GPTQ (AutoGPTQ / GPTQModel checkpoints): ``qweight``, ``qzeros``, ``scales`` and ``g_idx`` per layer.

Stored layout (transformers' ``[out, in]`` weight, transposed and packed):

- ``qweight`` int32 ``[in * bits / 32, out]``: each column packs its ``in`` values densely along the rows,
  value ``i`` at bit ``bits * i`` of the column's words read as one little-endian bit string (for 3 bits a
  value can straddle two words; for 2, 4 and 8 bits this is the usual ``32 / bits`` values per word).
- ``qzeros`` int32 ``[groups, out * bits / 32]``: zero points, packed the same way along each row.
- ``scales`` fp16 ``[groups, out]``; ``g_idx`` int32 ``[in]``: the group of each input column (a permutation
  of groups under ``desc_act``; ``i // group_size`` otherwise, and when ``g_idx`` is not stored).
- ``groups = ceil(in / group_size)``; ``group_size = -1`` means one group.

``W[o, i] = scales[g, o] * (q[i, o] - z[g, o])`` with ``g = g_idx[i]``, computed in the scales' dtype, where
``z`` is the stored field plus one in the original ("v1", ``checkpoint_format: gptq``) format and the field
itself in ``gptq_v2``. The +1 is not wrapped (a stored 2^bits - 1 means a zero point of 2^bits), as in
AutoGPTQ's torch dequantization (``qlinear_cuda``) and its CUDA kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.packed import native
from ckptfs.packed.bits import packed_words, round_to, scale_to_f32, unpack_fields
from ckptfs.packed.detect import Method, Scheme, one_format
from ckptfs.packed.base import (INT32_TYPES, INT_TYPES, SCALE_TYPES, Absent, Context, Layout, Parts, check_ndim,
                                check_shape, check_type, f16_fast, gathered, group_index_fast, int_setting, require)

ROLES = ("qweight", "qzeros", "scales", "g_idx")
BITS = (2, 3, 4, 8)
FORMATS = ("gptq", "gptq_v2")
SCHEMES = [Scheme("gptq", "gptq", "", "gptq", "qweight", ROLES)]
METHODS = [Method("gptq", one_format)]


def build(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any],
          context: Context | None = None) -> Layout:
    bits = int_setting(settings, "bits", "w_bit")
    if bits not in BITS:
        raise Absent(f"GPTQ bits={bits} is not supported (2, 3, 4 or 8)")
    group_size = int_setting(settings, "group_size", default=-1)
    if group_size == 0 or group_size < -1:
        raise Absent(f"GPTQ group_size={group_size} is not valid")
    fmt = str(settings.get("checkpoint_format") or settings.get("format") or "gptq").lower()
    if fmt not in FORMATS:
        raise Absent(f"GPTQ checkpoint_format {fmt!r} is not supported (gptq or gptq_v2)")

    qweight = require(parts, "qweight", prefix)
    qzeros = require(parts, "qzeros", prefix)
    scales = require(parts, "scales", prefix)
    check_type(qweight, INT32_TYPES)
    check_type(qzeros, INT32_TYPES)
    check_type(scales, SCALE_TYPES)
    check_ndim(qweight, 2)
    rows, out = qweight.shape
    g_idx = parts.get("g_idx")
    if g_idx is not None:
        if g_idx.damaged:
            raise Absent(f"part {g_idx.name} is damaged: {g_idx.damaged}")
        check_type(g_idx, INT_TYPES)
        check_ndim(g_idx, 1)
        in_features = g_idx.shape[0]
        check_shape(qweight, (packed_words(in_features, bits), out), f"{bits}-bit packing of {g_idx.name}")
    else:
        if rows * 32 % bits:
            raise Absent(f"{qweight.name} has {rows} rows, not a whole number of {bits}-bit columns")
        in_features = rows * 32 // bits
    gsize = in_features if group_size == -1 else group_size
    groups = -(-in_features // gsize) if in_features else 0
    why = f"bits={bits} group_size={group_size}"
    check_shape(scales, (groups, out), why)
    check_shape(qzeros, (groups, packed_words(out, bits)), why)
    if out == 0 or in_features == 0:
        raise Absent(f"{qweight.name} has an empty shape {list(qweight.shape)}")

    v1 = fmt == "gptq"
    used = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
    if g_idx is not None:
        used["g_idx"] = g_idx
    parameters = {"bits": bits, "group_size": group_size, "groups": groups,
                  "desc_act": bool(settings.get("desc_act", False)), "sym": bool(settings.get("sym", True)),
                  "checkpoint_format": fmt, "g_idx": g_idx is not None}

    tag = f"gptq:b{bits}:{'v1' if v1 else 'v2'}"

    def inputs(reader: Parts, o0: int, o1: int):
        """Rows [o0, o1)'s zero points (int16), scales (float32) and the group index (None: the default),
        from the per-layer arrays both decoders share (cached)."""
        def zeros_t() -> np.ndarray:  # [out, groups]: each output row's zero point per group
            fields = unpack_fields(reader.whole("qzeros"), bits, out).astype(np.int16)
            return np.ascontiguousarray((fields + 1 if v1 else fields).T)

        def scales_t() -> np.ndarray:  # [out, groups] float32
            return np.ascontiguousarray(scale_to_f32(reader.whole("scales"), scales.storage_type).T)

        z = reader.derived(tag + ":zeros_t", ("qzeros",), (out, groups), zeros_t)[o0:o1]
        s = reader.derived("scales_t", ("scales",), (out, groups), scales_t)[o0:o1]
        return z, s, _group_index(reader, g_idx, in_features, gsize, groups)

    def decode(reader: Parts, o0: int, o1: int, dest: np.ndarray | None) -> np.ndarray:
        z, s, g = inputs(reader, o0, o1)
        z = z.astype(np.float32)
        # qweight's columns are the weight's rows: transposed once per layer (cached), so that a tile of rows
        # is contiguous instead of one word from each of thousands of rows
        words = reader.derived("qweight_t", ("qweight",), (out, rows),
                               lambda: reader.read_whole("qweight").T)[o0:o1]   # [o1 - o0, packed in]
        q = unpack_fields(words, bits, in_features)                          # [o1 - o0, in] uint8
        values = group_index_fast(q, z, s, gsize, dest) if g is None else gathered(q, z, s, g, dest)
        return round_to(values, scales.storage_type, f16_fast(reader, "scales", scales.storage_type, 1 << bits))

    def kernel(reader: Parts, o0: int, o1: int, dest: np.ndarray) -> bool:
        z, s, g = inputs(reader, o0, o1)
        # qweight as stored (cached whole): row o's word k is qweight[k, o], one column stride apart
        words = reader.whole("qweight").reshape(-1)[o0:]
        return native.dequantize_rows(dest, words, bits, in_features, z, s, gsize, scales.storage_type, g,
                                      row_step=1, word_step=out)

    return Layout("gptq", parameters, out, in_features, used, scales.storage_type, decode, kernel=kernel)


def _group_index(reader: Parts, g_idx: TensorInfo | None, in_features: int, gsize: int,
                 groups: int) -> np.ndarray | None:
    """The stored group of each input column, or None when it is the default ``i // group_size``."""
    if g_idx is None:
        return None

    def build() -> np.ndarray:
        values = reader.whole("g_idx").astype(np.int64)
        if values.size and (values.min() < 0 or values.max() >= groups):
            bad = values[(values < 0) | (values >= groups)][0]
            raise Absent(f"{g_idx.name} holds group {int(bad)}, outside 0..{groups - 1}")
        return values

    g = reader.derived("gptq:g_idx", ("g_idx",), (in_features,), build)
    default = reader.derived("gptq:g_idx_default", ("g_idx",), (1,),
                             lambda: np.array([np.array_equal(g, np.arange(in_features) // gsize)], np.int8))
    return None if default[0] else g
