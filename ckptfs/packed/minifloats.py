"""Rows of E2M1 nibbles times one float32 scale per group of a row, and the small-float scale tables.

What the FP4 and MX schemes (``nvfp4``, ``mxfp``, ``gptoss``) share once each has combined its scales into
one float32 per group in its reference's order: ``W[r, i] = code_value[r, i] * s[r, i // g]``, one float32
multiply per value (``scaled``'s block multiply, as for the FP8 family), so the result is the reference's
float32 product, overflow to infinity and ``0 * inf = NaN`` included. The code values come from the tables in ``ckptfs.quant.floats``, built from the
bit layouts and checked there against ml_dtypes; nibbles are low first (element ``2i`` in the low nibble of
byte ``i``), as every FP4 producer here packs them.

E8M0 scales, ``2^(e - 127)``: the OCP rule makes ``e = 255`` NaN (``floats.F8_E8M0_TABLE``); the
references of the schemes that store them do otherwise, each in its own way, and each scheme follows its own:

- compressed-tensors computes the scale ``2.0 ** (e - 127)`` first: ``2^128`` is +inf, so a block with
  ``e = 255`` decodes to ±inf (NaN for a zero code): :data:`E8M0_POW2`;
- transformers (gpt-oss) ``ldexp``s the code by ``e - 127``: the exact ``code * 2^128``, finite for a code of
  0.5 (``2^127``), +inf from 1 up, ±0 for zero. ``(2 * code) * 2^(e - 128)`` is that same value for every
  ``e`` (both factors exact, one rounding): :data:`E2M1_DOUBLE_PAIRS` and :data:`E8M0_HALF`, the form ggml
  also decodes MXFP4 in.
"""

from __future__ import annotations

import numpy as np

from ckptfs.packed.scaled import _apply_blocks as apply_blocks
from ckptfs.quant.floats import F4_E2M1_TABLE, F8_E4M3_TABLE, F8_E8M0_TABLE

#: float32 of each E4M3 (OCP e4m3fn) byte: 0x7F and 0xFF are NaN.
E4M3 = F8_E4M3_TABLE
#: the pair of float32 values of each byte of two E2M1 nibbles (low nibble first): ``[256, 2]``.
E2M1_PAIRS = np.ascontiguousarray(np.stack([F4_E2M1_TABLE[np.arange(256) & 15],
                                            F4_E2M1_TABLE[np.arange(256) >> 4]], axis=1))
#: ``2^(e - 127)`` of each E8M0 byte as compressed-tensors computes it: 255 is 2^128 = +inf.
E8M0_POW2 = F8_E8M0_TABLE.copy()
E8M0_POW2[255] = np.inf
#: twice the E2M1 pair values, and ``2^(e - 128)`` of each E8M0 byte (all finite): their product is
#: ``ldexp(code, e - 127)``.
E2M1_DOUBLE_PAIRS = E2M1_PAIRS * np.float32(2)
E8M0_HALF = np.ldexp(np.float32(1), np.arange(256) - 128).astype(np.float32)


def e2m1_rows(codes: np.ndarray, scales: np.ndarray, group: int, out: np.ndarray | None = None,
              pairs: np.ndarray = E2M1_PAIRS) -> np.ndarray:
    """``u8 codes[rows, in / 2]`` (two E2M1 nibbles a byte, valued by ``pairs``) times ``float32
    scales[rows, in / group]``: float32 ``[rows, in]``, into ``out`` (float32, ``rows * in`` elements,
    contiguous) when given."""
    rows, half = codes.shape
    width = 2 * half
    result = out.reshape(rows, width) if out is not None else np.empty((rows, width), np.float32)
    np.take(pairs, codes, axis=0, out=result.reshape(rows, half, 2), mode="clip")
    with np.errstate(over="ignore", invalid="ignore"):
        apply_blocks(result, scales, None, group)
    return result


def e4m3_scales(codes: np.ndarray) -> np.ndarray:
    """E4M3 scale bytes as exact float32."""
    return np.take(E4M3, codes)


def e8m0_scales(codes: np.ndarray, table: np.ndarray = E8M0_POW2) -> np.ndarray:
    """E8M0 scale bytes as float32 by ``table`` (:data:`E8M0_POW2` or :data:`E8M0_HALF`)."""
    return np.take(table, codes)
