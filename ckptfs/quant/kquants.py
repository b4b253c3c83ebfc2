"""GGML's K-quants: 256-element super-blocks with per-sub-block scales (Q2_K..Q6_K) and Q8_K.

Layouts and formulas: docs/block-formats.md, checked against ggml-quants.c ``dequantize_row_q*_K``. ggml forms
each sub-block's float32 scale first (``d * sc``, and ``dmin * m`` for the mins) and then computes
``scale * q - min`` per element; the numpy code here keeps exactly that order, in float32, so the results
are bit-identical. Every unpacking step works on whole arrays: the element index is split into axes
(e.g. E = 128h + 32j + 16k + l becomes shape (n, 2, 4, 2, 16)) so that a reshape puts values in order.

Big-endian: only Q4_K (d, dmin) and Q6_K (d) are swappable, exactly the fields gguf-py's
``gguf_convert_endian.py`` swaps; the other K-quants have no defined big-endian layout here.
"""

from __future__ import annotations

import numpy as np

from ckptfs.quant import Codec, register_codec
from ckptfs.quant.native import accelerated
from ckptfs.quant._common import F32, f16_field, f32_field, field, offset_codes, swap_u16_fields

QK_K = 256
_SHIFT_2BIT = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)


def _scaled(codes: np.ndarray, scale: np.ndarray, minimum: np.ndarray | None = None) -> np.ndarray:
    """``scale * q (- minimum)`` per sub-block, float32, with scale/min broadcast along the last axis.

    ``codes``: the integer q as u8/i8[n, subblocks, per_subblock] (small integers: the float32 conversion is
    exact, as ggml's implicit int -> float is); ``scale``/``minimum``: f32[n, subblocks].
    """
    values = codes.astype(F32)
    np.multiply(values, scale[:, :, None], out=values)
    if minimum is not None:
        np.subtract(values, minimum[:, :, None], out=values)
    return values.reshape(codes.shape[0], QK_K)


def decode_q2_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    scales = field(blocks, 0, 16, "u1")
    qs = field(blocks, 16, 64, "u1").reshape(n, 2, 1, 32)
    codes = (qs >> _SHIFT_2BIT) & 3                       # (n, h, j, 16k + l)
    d, dmin = f16_field(blocks, 80), f16_field(blocks, 82)
    scale = d * (scales & 15).astype(F32)
    minimum = dmin * (scales >> 4).astype(F32)
    return _scaled(codes.reshape(n, 16, 16), scale, minimum)


# Q3_K 6-bit scale i: low 4 bits from nibble i//8 of byte i%8, high 2 bits from bits 2(i//4) of byte 8 + i%4.
_I = np.arange(16)
_Q3_LO_BYTE, _Q3_LO_SHIFT = _I % 8, (4 * (_I // 8)).astype(np.uint8)
_Q3_HI_BYTE, _Q3_HI_SHIFT = 8 + _I % 4, (2 * (_I // 4)).astype(np.uint8)
_Q3_HMASK_SHIFT = np.arange(8, dtype=np.uint8).reshape(2, 4, 1)   # bit 4h + j


def _q3_scales(packed: np.ndarray) -> np.ndarray:
    low = (packed[:, _Q3_LO_BYTE] >> _Q3_LO_SHIFT) & 15
    high = (packed[:, _Q3_HI_BYTE] >> _Q3_HI_SHIFT) & 3
    return (low | (high << 4)).astype(np.int8) - np.int8(32)


def decode_q3_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    hmask = field(blocks, 0, 32, "u1").reshape(n, 1, 1, 32)
    qs = field(blocks, 32, 64, "u1").reshape(n, 2, 1, 32)
    codes = (qs >> _SHIFT_2BIT) & 3                        # (n, h, j, 16k + l)
    high = (hmask >> _Q3_HMASK_SHIFT) & 1
    codes |= high << 2                                     # a clear high bit means "minus 4":
    scale = f16_field(blocks, 108) * _q3_scales(field(blocks, 96, 12, "u1")).astype(F32)
    return _scaled(offset_codes(codes, 4).reshape(n, 16, 16), scale)


def scale_min_k4(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for j = 0..7 at once: 12 packed bytes -> eight 6-bit scales and mins."""
    n = packed.shape[0]
    sc = np.empty((n, 8), dtype=np.uint8)
    mn = np.empty((n, 8), dtype=np.uint8)
    first, second, third = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    np.bitwise_and(first, 63, out=sc[:, :4])
    np.bitwise_and(second, 63, out=mn[:, :4])
    sc[:, 4:] = (third & 15) | ((first >> 6) << 4)
    mn[:, 4:] = (third >> 4) | ((second >> 6) << 4)
    return sc, mn


def _k4_scale_min(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sc, mn = scale_min_k4(field(blocks, 4, 12, "u1"))
    return f16_field(blocks, 0) * sc.astype(F32), f16_field(blocks, 2) * mn.astype(F32)


def _k4_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K order E = 64c + 32t + l: nibble t of byte 32c + l -> u8[n, 4(c), 2(t), 32(l)]."""
    n = qs.shape[0]
    grouped = qs.reshape(n, 4, 1, 32)
    codes = np.empty((n, 4, 2, 32), dtype=np.uint8)
    np.bitwise_and(grouped, 15, out=codes[:, :, :1])
    np.right_shift(grouped, 4, out=codes[:, :, 1:])
    return codes


def decode_q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    scale, minimum = _k4_scale_min(blocks)
    codes = _k4_nibbles(field(blocks, 16, 128, "u1"))
    return _scaled(codes.reshape(n, 8, 32), scale, minimum)


_Q5_QH_SHIFT = np.arange(8, dtype=np.uint8).reshape(4, 2, 1)   # bit 2c + t


def decode_q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    scale, minimum = _k4_scale_min(blocks)
    codes = _k4_nibbles(field(blocks, 48, 128, "u1"))
    qh = field(blocks, 16, 32, "u1").reshape(n, 1, 1, 32)
    codes |= ((qh >> _Q5_QH_SHIFT) & 1) << 4
    return _scaled(codes.reshape(n, 8, 32), scale, minimum)


_Q6_QH_SHIFT = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)   # bits 2r


def decode_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    ql = field(blocks, 0, 128, "u1").reshape(n, 2, 1, 64)   # (h, -, 32(r&1) + l)
    codes = np.empty((n, 2, 2, 64), dtype=np.uint8)          # (h, r>>1, 32(r&1) + l) -> flattens to (h, r, l)
    np.bitwise_and(ql, 15, out=codes[:, :, :1])
    np.right_shift(ql, 4, out=codes[:, :, 1:])
    codes = codes.reshape(n, 2, 4, 32)
    qh = field(blocks, 128, 64, "u1").reshape(n, 2, 1, 32)
    codes |= ((qh >> _Q6_QH_SHIFT) & 3) << 4
    scale = f16_field(blocks, 208) * field(blocks, 192, 16, "i1").astype(F32)
    return _scaled(offset_codes(codes, 32).reshape(n, 16, 16), scale)


def decode_q8_k(blocks: np.ndarray) -> np.ndarray:
    values = field(blocks, 4, QK_K, "i1").astype(F32)
    np.multiply(values, f32_field(blocks, 0), out=values)
    return values


_F32 = np.dtype(F32)
register_codec(Codec("Q2_K", QK_K, 84, _F32, accelerated("Q2_K", QK_K, decode_q2_k)))
register_codec(Codec("Q3_K", QK_K, 110, _F32, accelerated("Q3_K", QK_K, decode_q3_k)))
register_codec(Codec("Q4_K", QK_K, 144, _F32, accelerated("Q4_K", QK_K, decode_q4_k), swap=swap_u16_fields(0, 2)))
register_codec(Codec("Q5_K", QK_K, 176, _F32, accelerated("Q5_K", QK_K, decode_q5_k)))
register_codec(Codec("Q6_K", QK_K, 210, _F32, accelerated("Q6_K", QK_K, decode_q6_k), swap=swap_u16_fields(208)))
register_codec(Codec("Q8_K", QK_K, 292, _F32, accelerated("Q8_K", QK_K, decode_q8_k)))
