"""GGML's 1- and 2-bit types Q1_0 (128 elements: +-d) and Q2_0 (64 elements: (q - 1) * d).

Layouts and formulas: docs/block-formats.md (Q2_0 is ggml type 42, added 2026-07), checked against
ggml-quants.c ``dequantize_row_q1_0`` / ``dequantize_row_q2_0``. Both blocks are ``{fp16 d, u8 qs[16]}``
with element j in bit(s) j % 8 (j % 4) of byte j / 8 (j / 4), so one byte decodes to consecutive elements
and a table row per byte value gives values already in output order.

Q1_0: ggml writes ``bit ? d : neg_d`` with ``neg_d = -d``: negation only flips the sign bit (NaN included),
so the codec XORs the float32 bits of d with a per-bit sign mask instead of multiplying.
Q2_0: ggml writes ``((int)q - 1) * d``; the table holds the converted ``(float)(q - 1)`` values.
Neither type has a defined big-endian layout, so ``swap`` is None.
"""

from __future__ import annotations

import numpy as np

from ckptfs.quant import Codec, register_codec
from ckptfs.quant._common import F32, f16_field, field

_F32 = np.dtype(F32)
_BYTES = np.arange(256, dtype=np.uint16)

# _Q1_SIGNS[b, k] = 0 if bit k of b is set (+d) else the float32 sign bit (-d).
_Q1_SIGNS = np.where((_BYTES[:, None] >> np.arange(8)) & 1, 0, 0x80000000).astype(np.uint32)
# _Q2_VALUES[b, k] = (float)(((b >> 2k) & 3) - 1); a byte's 4 floats as one complex128 item for a fast take.
_Q2_VALUES = (((_BYTES[:, None] >> (2 * np.arange(4))) & 3).astype(np.int16) - 1).astype(F32)
_Q2_ROWS = np.ascontiguousarray(_Q2_VALUES).view(np.complex128).reshape(256)


def decode_q1_0(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    bits = np.take(_Q1_SIGNS, field(blocks, 2, 16, "u1"), axis=0).reshape(n, 128)
    np.bitwise_xor(bits, f16_field(blocks, 0).view(np.uint32), out=bits)
    return bits.view(F32)


def decode_q2_0(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    values = np.take(_Q2_ROWS, field(blocks, 2, 16, "u1")).view(F32).reshape(n, 64)
    np.multiply(values, f16_field(blocks, 0), out=values)
    return values


register_codec(Codec("Q1_0", 128, 18, _F32, decode_q1_0))
register_codec(Codec("Q2_0", 64, 18, _F32, decode_q2_0))
