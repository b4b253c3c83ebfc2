"""compressed-tensors microscaling formats: ``mxfp4-pack-quantized`` and ``mxfp8-quantized``.

Both keep one E8M0 scale per 32 values of a row, ``weight_scale`` U8 ``[out, in / 32]`` (the biased
exponent ``e``; ``F8_E8M0`` storage holds the same byte):

- ``mxfp4-pack-quantized``: ``weight_packed`` U8 ``[out, in / 2]``, two E2M1 values a byte, low nibble first.
- ``mxfp8-quantized``: ``weight`` F8_E4M3 ``[out, in]`` (the codes stand in the dense weight's name).

compressed-tensors' ``decompress`` turns the scale into ``2.0 ** (e - 127)`` in bfloat16 (exact: a power of
two; ``e = 255`` gives 2^128 = +inf, not the OCP rule's NaN) and multiplies the codes by it in bfloat16.
Here ``W = code * 2^(e - 127)`` is one float32 multiply (``minifloats``): the exact product except where
it leaves float32's range, so rounding it to bfloat16 gives the reference's value bit for bit. A read takes
only its rows of codes and scales. The C kernels (``native.fp4_rows``, ``native.scaled_rows``) compute the
same products in one pass; numpy is the reference and fallback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.engine.values import CodeValues, PairedNibbles, ScaledCodes
from ckptfs.packed.base import Absent, Context, Layout, Parts, check_ndim, check_shape, check_type, require
from ckptfs.packed.compressed import METHOD, scheme_for
from ckptfs.packed.detect import Method, Scheme
from ckptfs.packed import native
from ckptfs.packed.minifloats import E2M1_PAIRS, E4M3, E8M0_POW2, apply_blocks, e2m1_rows, e8m0_scales
from ckptfs.packed.nvfp4 import check_weight_args

GROUP = 32
MXFP4, MXFP8 = "mxfp4-pack-quantized", "mxfp8-quantized"
ROLES = ("weight_scale", "weight_zero_point", "input_global_scale")
SCHEMES = [Scheme(f"{METHOD}/{MXFP4}", METHOD, MXFP4, "mxfp", "weight_packed", ("weight_packed",) + ROLES,
                  marker_types=("U8",)),
           Scheme(f"{METHOD}/{MXFP8}", METHOD, MXFP8, "mxfp", "weight", ("weight",) + ROLES,
                  marker_types=("F8_E4M3",), requires=("weight_scale",))]
METHODS: list[Method] = []  # compressed-tensors' method is compressed.py's


def build(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any],
          context: Context | None = None) -> Layout:
    """A compressed-tensors ``mxfp4-pack-quantized`` or ``mxfp8-quantized`` layer (by its stored codes)."""
    fmt = MXFP4 if "weight_packed" in parts else MXFP8
    bits = 4 if fmt == MXFP4 else 8
    check_weight_args(scheme_for(prefix, settings, (fmt,)), "float", bits, GROUP)
    if "weight_zero_point" in parts:
        raise Absent(f"asymmetric {fmt} (weight_zero_point) is not supported")
    codes_role = "weight_packed" if bits == 4 else "weight"
    codes = require(parts, codes_role, prefix)
    scale = require(parts, "weight_scale", prefix)
    check_type(codes, ("U8",) if bits == 4 else ("F8_E4M3",))
    check_type(scale, ("U8", "F8_E8M0"))
    check_ndim(codes, 2)
    out, in_features = codes.shape[0], codes.shape[1] * (2 if bits == 4 else 1)
    if out == 0 or in_features == 0:
        raise Absent(f"{codes.name} has an empty shape {list(codes.shape)}")
    if in_features % GROUP:
        raise Absent(f"in_features {in_features} is not a multiple of the {fmt} group of {GROUP}")
    check_shape(scale, (out, in_features // GROUP), f"{fmt} of [{out}, {in_features}]")

    def kernel(reader: Parts, o0: int, o1: int, dest: np.ndarray) -> bool:
        s = e8m0_scales(reader.rows("weight_scale", o0, o1))
        stored = reader.rows(codes_role, o0, o1)
        if bits == 4:
            return native.fp4_rows(dest, stored, in_features // 2, E2M1_PAIRS, s, in_features // GROUP, in_features,
                                   GROUP, o1 - o0)
        return native.scaled_rows(dest, stored, E4M3, s, np.arange(o1 - o0, dtype=np.int64), GROUP)

    def decode(reader: Parts, o0: int, o1: int, dest: np.ndarray | None) -> np.ndarray:
        s = e8m0_scales(reader.rows("weight_scale", o0, o1))
        stored = reader.rows(codes_role, o0, o1)
        if bits == 4:
            return e2m1_rows(stored, s, GROUP, dest)
        values = dest.reshape(o1 - o0, in_features) if dest is not None else np.empty((o1 - o0, in_features),
                                                                                       np.float32)
        np.take(E4M3, stored, out=values, mode="clip")
        with np.errstate(over="ignore", invalid="ignore"):
            apply_blocks(values, s, None, GROUP)
        return values

    def computed(reader: Parts) -> CodeValues | None:
        """The layer for a mount's reads in C: MXFP4 as a flat run of nibbles (every row is whole groups of
        32), its scale bytes read with the codes and valued by the E8M0 table; MXFP8 as scaled codes with a
        scale row per row."""
        if bits == 4:
            if scale.source != codes.source:
                return None
            return PairedNibbles(reader.source_of(codes_role), codes.offset, out, in_features, E2M1_PAIRS, GROUP,
                                 out * in_features // GROUP, scale.offset, "table", E8M0_POW2)
        s = reader.derived("mxfp8:scales", ("weight_scale",), (out, in_features // GROUP),
                           lambda: e8m0_scales(reader.whole("weight_scale")))
        return ScaledCodes(reader.source_of(codes_role), codes.offset, out, in_features, E4M3, s, None, GROUP,
                           out, out, 1)

    parameters = {"format": fmt, "num_bits": bits, "group_size": GROUP, "formula": "code * 2.0 ** (e - 127)",
                  "reference_dtype": "BF16"}
    return Layout(f"{METHOD}/{fmt}", parameters, out, in_features, {codes_role: codes, "weight_scale": scale},
                  "F32", decode, kernel=kernel, computed_codes=computed)
