"""FP4 block types MXFP4 (OCP microscaling: E8M0 scale, 32 E2M1 values) and NVFP4 (4 UE4M3 scales, 64 E2M1).

Layouts and formulas: docs/block-formats.md, checked against ggml-quants.c ``dequantize_row_mxfp4`` /
``dequantize_row_nvfp4`` and ggml-impl.h. ggml keeps the E2M1 values doubled (``kvalues_mxfp4``, int8) and
halves the scale instead: ``ggml_e8m0_to_fp32_half(e)`` = 2^(e-128) built from bits (``0x00200000 << e``
for e < 2: float32 subnormals; e = 255 is 2^127, not NaN), ``ggml_ue4m3_to_fp32(x)`` = 0.5 * E4M3 without
sign (0x00 and 0x7F give 0, bit 7 is ignored). Each value is ``(float)kvalue * scale`` in float32.

Both scales are bytes, so every (scale byte, a | b << 4) pair of nibbles has a precomputed pair of results
``(kvalue[a] * s, kvalue[b] * s)``, each the same float32 product ggml forms (overflow to inf included).
Two output-adjacent nibbles (ggml's order: per 32 / 16 elements the low nibbles, then the high ones) are
packed into one byte with uint64 shifts and masks, the scale byte goes above it, and one 8-byte gather per
two values produces the output with no multiply. Blocks are decoded in chunks whose temporaries stay in the
CPU cache.

Big-endian: gguf-py's converter swaps nothing for these types (they hold only bytes), so ``swap`` is the
identity.
"""

from __future__ import annotations

import numpy as np

from ckptfs.quant import Codec, register_codec
from ckptfs.quant._common import F32, chunked, field
from ckptfs.quant.iq_tables import KVALUES_FP4

_F32 = np.dtype(F32)


def _e8m0_half() -> np.ndarray:
    """ggml_e8m0_to_fp32_half for every byte: float32 with bits 0x00200000 << e (e < 2) or (e - 1) << 23."""
    e = np.arange(256, dtype=np.uint32)
    return np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32).view(F32)


def _ue4m3_half() -> np.ndarray:
    """ggml_ue4m3_to_fp32 for every byte (already times 0.5); every value is exact in float32."""
    x = np.arange(256)
    exp, man = (x >> 3) & 15, x & 7
    raw = np.where(exp == 0, np.ldexp(man.astype(np.float64), -9), np.ldexp(1.0 + man / 8.0, exp - 7))
    raw[(x == 0) | (x == 0x7F)] = 0.0
    return (raw * 0.5).astype(F32)


def _pair_table(scales: np.ndarray) -> np.ndarray:
    """(scale byte << 8 | quant byte) -> the float32 pair (kvalue[lo] * s, kvalue[hi] * s), as one 8-byte item."""
    b = np.arange(256)
    kv = KVALUES_FP4.astype(F32)
    with np.errstate(over="ignore"):
        pairs = np.stack([kv[b & 15][None, :] * scales[:, None], kv[b >> 4][None, :] * scales[:, None]], axis=-1)
    return np.ascontiguousarray(pairs, dtype=F32).view(np.uint64).reshape(256 * 256)


_MXFP4_PAIRS = _pair_table(_e8m0_half())
_NVFP4_PAIRS = _pair_table(_ue4m3_half())
_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_EVEN_BYTES = np.uint64(0x00FF00FF00FF00FF)


def _scaled_pairs(table: np.ndarray, quants: np.ndarray, scales: np.ndarray, group: int, out: np.ndarray) -> None:
    """``out`` = values of u8 ``quants[n, k]`` in groups of ``group`` bytes (each: its low nibbles, then its
    high nibbles) under the byte ``scales[n, k / group]``: float32 [n, 2k]."""
    n, width = quants.shape
    words = np.ascontiguousarray(quants).view("<u8")
    codes = np.empty((2, n, width // 8), dtype="<u8")         # low nibbles, high nibbles
    np.bitwise_and(words, _NIBBLES, out=codes[0])
    np.right_shift(words, np.uint64(4), out=codes[1])
    np.bitwise_and(codes[1], _NIBBLES, out=codes[1])
    # Byte 2i of each word becomes nibble 2i | nibble 2i+1 << 4, byte 2i+1 is cleared for the scale.
    np.bitwise_or(codes, codes >> np.uint64(4), out=codes)
    np.bitwise_and(codes, _EVEN_BYTES, out=codes)
    lanes = codes.view("<u2").reshape(2, n, width // group, group // 2)
    np.bitwise_or(lanes, scales.astype(np.uint16)[:, :, None] << np.uint16(8), out=lanes)
    # Every u16 index is inside the 65536-entry table, so mode="clip" only skips numpy's buffered bounds check.
    np.take(table, lanes.transpose(1, 2, 0, 3), out=out.view(np.uint64).reshape(n, width // group, 2, group // 2),
            mode="clip")


def _mxfp4_into(blocks: np.ndarray, out: np.ndarray) -> None:
    _scaled_pairs(_MXFP4_PAIRS, field(blocks, 1, 16, "u1"), field(blocks, 0, 1, "u1"), 16, out)


def _nvfp4_into(blocks: np.ndarray, out: np.ndarray) -> None:
    _scaled_pairs(_NVFP4_PAIRS, field(blocks, 4, 32, "u1"), field(blocks, 0, 4, "u1"), 8, out)


decode_mxfp4 = chunked(_mxfp4_into, 32)
decode_nvfp4 = chunked(_nvfp4_into, 64)


def _byte_only_swap(blocks: np.ndarray) -> np.ndarray:
    """Big-endian -> little-endian for a block of single bytes: nothing moves (gguf-py's byteswap_noop)."""
    return blocks


register_codec(Codec("MXFP4", 32, 17, _F32, decode_mxfp4, swap=_byte_only_swap))
register_codec(Codec("NVFP4", 64, 36, _F32, decode_nvfp4, swap=_byte_only_swap))
