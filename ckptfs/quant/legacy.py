"""GGML's original 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.

Layouts and formulas: docs/block-formats.md, checked against ggml-quants.c ``dequantize_row_q*``. ggml works
in float32 — ``y = q*d`` or ``y = q*d + m`` with the integer q converted first — and every step here is a
float32 numpy operation in that same order, so results are bit-identical to ggml's and gguf-py's.

Q8_1 is ggml's current 36-byte block (d, s, qs[32]); gguf-py's size table still says 40 (a pre-2024 layout),
so gguf-py is no reference for it. ``s`` (= d * sum(qs), an activation helper) is not needed to decode.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ckptfs.quant import Codec, register_codec
from ckptfs.quant.native import accelerated
from ckptfs.quant._common import F32, bits_le, f16_field, field, nibbles, offset_codes, swap_u16_fields

QK = 32


def _scale(codes: np.ndarray, d: np.ndarray, m: np.ndarray | None = None) -> np.ndarray:
    """``q * d (+ m)`` per block in float32, in ggml's order (the product is rounded before the sum).

    ``codes`` holds the integer q (u8/i8[n, 32]); its float32 conversion is exact, as ggml's ``(float)x`` is.
    """
    values = codes.astype(F32)
    np.multiply(values, d, out=values)
    if m is not None:
        np.add(values, m, out=values)
    return values


def decode_q4_0(blocks: np.ndarray) -> np.ndarray:
    return _scale(offset_codes(nibbles(field(blocks, 2, 16, "u1")), 8), f16_field(blocks, 0))


def decode_q4_1(blocks: np.ndarray) -> np.ndarray:
    return _scale(nibbles(field(blocks, 4, 16, "u1")), f16_field(blocks, 0), f16_field(blocks, 2))


def _five_bit_codes(blocks: np.ndarray, qh_at: int, qs_at: int) -> np.ndarray:
    """Q5 codes: nibble of element E, plus bit E of the 32-bit ``qh`` as bit 4."""
    codes = nibbles(field(blocks, qs_at, 16, "u1"))
    high = bits_le(blocks[:, qh_at:qh_at + 4])
    np.left_shift(high, 4, out=high)
    np.bitwise_or(codes, high, out=codes)
    return codes


def decode_q5_0(blocks: np.ndarray) -> np.ndarray:
    return _scale(offset_codes(_five_bit_codes(blocks, 2, 6), 16), f16_field(blocks, 0))


def decode_q5_1(blocks: np.ndarray) -> np.ndarray:
    return _scale(_five_bit_codes(blocks, 4, 8), f16_field(blocks, 0), f16_field(blocks, 2))


def _decode_q8(qs_at: int) -> Callable[[np.ndarray], np.ndarray]:
    def decode(blocks: np.ndarray) -> np.ndarray:
        return _scale(field(blocks, qs_at, QK, "i1"), f16_field(blocks, 0))

    return decode


decode_q8_0 = _decode_q8(2)
decode_q8_1 = _decode_q8(4)

_F32 = np.dtype(F32)
register_codec(Codec("Q4_0", QK, 18, _F32, accelerated("Q4_0", QK, decode_q4_0), swap=swap_u16_fields(0)))
register_codec(Codec("Q4_1", QK, 20, _F32, accelerated("Q4_1", QK, decode_q4_1)))
register_codec(Codec("Q5_0", QK, 22, _F32, accelerated("Q5_0", QK, decode_q5_0)))
register_codec(Codec("Q5_1", QK, 24, _F32, accelerated("Q5_1", QK, decode_q5_1)))
register_codec(Codec("Q8_0", QK, 34, _F32, accelerated("Q8_0", QK, decode_q8_0), swap=swap_u16_fields(0)))
register_codec(Codec("Q8_1", QK, 36, _F32, accelerated("Q8_1", QK, decode_q8_1)))
