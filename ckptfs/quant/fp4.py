"""FP4 block types MXFP4 (OCP microscaling: E8M0 scale, 32 E2M1 values) and NVFP4 (4 UE4M3 scales, 64 E2M1).

Layouts and formulas: FORMATS.md section B, checked against ggml-quants.c ``dequantize_row_mxfp4`` /
``dequantize_row_nvfp4`` and ggml-impl.h. ggml keeps the E2M1 values doubled (``kvalues_mxfp4``, int8) and
halves the scale instead: ``ggml_e8m0_to_fp32_half(e)`` = 2^(e-128) built from bits (``0x00200000 << e``
for e < 2: float32 subnormals; e = 255 is 2^127, not NaN), ``ggml_ue4m3_to_fp32(x)`` = 0.5 * E4M3 without
sign (0x00 and 0x7F give 0, bit 7 is ignored). Each value is ``(float)kvalue * scale`` in float32.

Both scales are bytes, so every possible (scale byte, quant byte) pair has a precomputed pair of results
(the low nibble's and the high nibble's value, each the same float32 product ggml forms, overflow to inf
included). A block then costs one 8-byte gather per quant byte and a transpose into ggml's order (low
nibbles first, then high nibbles, per 32 / 16 elements).

Big-endian: gguf-py's converter swaps nothing for these types (they hold only bytes), so ``swap`` is the
identity.
"""

from __future__ import annotations

import numpy as np

from . import Codec, register_codec
from ._common import F32, field
from .iq_tables import KVALUES_FP4

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
    return np.ascontiguousarray(pairs, dtype=F32).view(np.float64).reshape(256 * 256)


_MXFP4_PAIRS = _pair_table(_e8m0_half())
_NVFP4_PAIRS = _pair_table(_ue4m3_half())


def _gather_pairs(table: np.ndarray, scale: np.ndarray, quants: np.ndarray) -> np.ndarray:
    """Values of u8 ``quants`` [..., k] under byte ``scale`` [..., 1]: float32 [..., 2, k] (lo nibbles, hi)."""
    idx = (scale.astype(np.uint16) << np.uint16(8)) | quants
    pairs = np.take(table, idx).view(F32).reshape(*quants.shape, 2)
    out = np.empty((*quants.shape[:-1], 2, quants.shape[-1]), dtype=F32)
    np.copyto(out, np.swapaxes(pairs, -1, -2))
    return out


def decode_mxfp4(blocks: np.ndarray) -> np.ndarray:
    return _gather_pairs(_MXFP4_PAIRS, field(blocks, 0, 1, "u1"), field(blocks, 1, 16, "u1")).reshape(-1, 32)


def decode_nvfp4(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    scales = field(blocks, 0, 4, "u1").reshape(n, 4, 1)
    quants = field(blocks, 4, 32, "u1").reshape(n, 4, 8)          # sub-block s: elements 16s + j / 16s + 8 + j
    return _gather_pairs(_NVFP4_PAIRS, scales, quants).reshape(n, 64)


def _byte_only_swap(blocks: np.ndarray) -> np.ndarray:
    """Big-endian -> little-endian for a block of single bytes: nothing moves (gguf-py's byteswap_noop)."""
    return blocks


register_codec(Codec("MXFP4", 32, 17, _F32, decode_mxfp4, swap=_byte_only_swap))
register_codec(Codec("NVFP4", 64, 36, _F32, decode_nvfp4, swap=_byte_only_swap))
