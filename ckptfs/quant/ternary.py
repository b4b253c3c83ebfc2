"""GGML's ternary types TQ1_0 and TQ2_0 (BitNet b1.58 / TriLM weights): values in {-1, 0, +1} times d.

Layouts and formulas: FORMATS.md section B, checked against ggml-quants.c ``dequantize_row_tq1_0`` /
``dequantize_row_tq2_0``, which write ``(float)(q - 1) * d``. Every stored byte is decoded through a table
of its already converted ``(float)(q - 1)`` values (one row per byte value), so a block costs one gather and
one float32 multiply per element, the same operation ggml does.

TQ1_0 packs 5 trits per byte as a base-3 fraction: trit n of byte b is ``((b * 3^n mod 256) * 3) >> 8``.
TQ2_0 packs 4 two-bit codes per byte. Neither has a defined big-endian layout (gguf-py's converter refuses
them), so ``swap`` is None.
"""

from __future__ import annotations

import numpy as np

from . import Codec, register_codec
from ._common import F32, f16_field, field

QK_K = 256
_F32 = np.dtype(F32)
_BYTES = np.arange(256, dtype=np.uint16)

# _TRITS[b, n] = (float)(trit n of byte b - 1), n < 5: the uint8 product wraps mod 256 as in ggml.
_TRITS = np.stack([((((_BYTES * 3 ** n) & 0xFF) * 3) >> 8).astype(np.int16) - 1 for n in range(5)], axis=1).astype(F32)
# _CODES2[b, l] = (float)(((b >> 2l) & 3) - 1); one byte's 4 floats viewed as one complex128 item, because
# np.take moves one 16-byte item about as fast as one 4-byte item.
_CODES2 = np.stack([((_BYTES >> (2 * l)) & 3).astype(np.int16) - 1 for l in range(4)], axis=1).astype(F32)
_CODES2_ROWS = _CODES2.view(np.complex128).reshape(256)


def decode_tq1_0(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = f16_field(blocks, 52)[:, :, None]
    trits = np.take(_TRITS, field(blocks, 0, 52, "u1"), axis=0)          # (n, byte, trit n)
    out = np.empty((n, QK_K), dtype=F32)
    # E = 32n + m from qs[m] (m < 32); E = 160 + 16n + m from qs[32 + m] (m < 16); E = 240 + 4n + m from qh[m].
    np.multiply(trits[:, 0:32].transpose(0, 2, 1), d, out=out[:, 0:160].reshape(n, 5, 32))
    np.multiply(trits[:, 32:48].transpose(0, 2, 1), d, out=out[:, 160:240].reshape(n, 5, 16))
    np.multiply(trits[:, 48:52, :4].transpose(0, 2, 1), d, out=out[:, 240:256].reshape(n, 4, 4))
    return out


def decode_tq2_0(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    values = np.take(_CODES2_ROWS, field(blocks, 0, 64, "u1")).view(F32).reshape(n, 2, 32, 4)  # (n, g, m, l)
    out = np.empty((n, 2, 4, 32), dtype=F32)                                   # E = 128g + 32l + m
    np.multiply(values.transpose(0, 1, 3, 2), f16_field(blocks, 64)[:, :, None, None], out=out)
    return out.reshape(n, QK_K)


register_codec(Codec("TQ1_0", QK_K, 54, _F32, decode_tq1_0))
register_codec(Codec("TQ2_0", QK_K, 66, _F32, decode_tq2_0))
