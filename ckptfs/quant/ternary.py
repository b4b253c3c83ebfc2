"""GGML's ternary types TQ1_0 and TQ2_0 (BitNet b1.58 / TriLM weights): values in {-1, 0, +1} times d.

Layouts and formulas: docs/block-formats.md, checked against ggml-quants.c ``dequantize_row_tq1_0`` /
``dequantize_row_tq2_0``, which write ``(float)(q - 1) * d``: the small integer is converted exactly, then
multiplied in float32, which is what the last two numpy steps here do.

TQ1_0 packs 5 trits per byte as a base-3 fraction: trit n of byte b is ``((b * 3^n mod 256) * 3) >> 8``,
i.e. 0, 1 or 2 as ``b * 3^n mod 256`` is below 86, below 171, or not (two uint8 comparisons). TQ2_0 packs
4 two-bit codes per byte (E = 128g + 32l + m is bits 2l of byte 32g + m).

Why the code looks the way it does: numpy pays ~20 ns per inner loop, so whole-array steps over runs of 4 to
32 bytes (the natural shapes here) cost more than the arithmetic. Each block's bytes are therefore first
copied into output order in 16-byte units (one ``np.take`` of complex128 items: byte runs of 32 / 16 bytes
repeated once per trit or code position), after which every step runs over whole 256-byte rows. Blocks are
processed in chunks whose temporaries stay in the CPU cache. That still reads every value back several times
(1.3-2x gguf-py for TQ2_0, whose own decoder is a few whole-array steps), so where the optional C extension is
built it decodes both types in one pass instead (same float32 operations; see native.py).

Neither type has a defined big-endian layout (gguf-py's converter refuses them), so ``swap`` is None.
"""

from __future__ import annotations

import numpy as np

from ckptfs.quant import Codec, register_codec
from ckptfs.quant._common import F32, chunked, f16_field, field
from ckptfs.quant.native import accelerated

QK_K = 256
_F32 = np.dtype(F32)

# TQ1_0: 16-byte units of output order: qs[0:32] five times, qs[32:48] five times, qh[0:4] four times (unit 3
# of the source row); _TQ1_POW3 is 3^n for the trit each output byte holds.
_TQ1_UNITS = np.array([0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 2, 2, 2, 2, 3])
_TQ1_POW3 = np.concatenate([np.repeat(np.array([1, 3, 9, 27, 81]), width) for width in (32, 16)]
                           + [np.repeat(np.array([1, 3, 9, 27]), 4)]).astype(np.uint8)
# TQ2_0: qs[0:32] four times then qs[32:64] four times; the code of each byte is then at bits 2l, shifted down
# 8 bytes at a time (bits that cross into a neighbouring byte land above bit 1 and are masked off).
_TQ2_UNITS = np.array([0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3])
_TQ2_SHIFTS = np.tile(np.repeat(np.array([0, 2, 4, 6], dtype=np.uint64), 4), 2)
_LOW_2BITS = np.uint64(0x0303030303030303)


def _tq1_0_into(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    units = np.empty((n, 4), dtype=np.complex128)            # qs[0:48], then qh[0:4] repeated 4 times
    raw = units.view(np.uint8)
    raw[:, :48] = field(blocks, 0, 48, "u1")
    raw[:, 48:].view("<u4")[:] = field(blocks, 48, 1, "<u4")
    scaled = np.take(units, _TQ1_UNITS, axis=1).view(np.uint8)
    np.multiply(scaled, _TQ1_POW3, out=scaled)                # b * 3^n mod 256
    trits = np.subtract((scaled >= np.uint8(171)).view(np.int8), (scaled < np.uint8(86)).view(np.int8))
    np.copyto(out, trits, casting="unsafe")                   # (float)(trit - 1), exact
    np.multiply(out, f16_field(blocks, 52), out=out)


def _tq2_0_into(blocks: np.ndarray, out: np.ndarray) -> None:
    words = np.take(field(blocks, 0, 4, "c16"), _TQ2_UNITS, axis=1).view("<u8")
    np.right_shift(words, _TQ2_SHIFTS, out=words)
    np.bitwise_and(words, _LOW_2BITS, out=words)
    np.subtract(words.view(np.uint8), F32(1), out=out, dtype=F32)
    np.multiply(out, f16_field(blocks, 64), out=out)


decode_tq1_0 = chunked(_tq1_0_into, QK_K)
decode_tq2_0 = chunked(_tq2_0_into, QK_K)

register_codec(Codec("TQ1_0", QK_K, 54, _F32, accelerated("TQ1_0", QK_K, decode_tq1_0)))
register_codec(Codec("TQ2_0", QK_K, 66, _F32, accelerated("TQ2_0", QK_K, decode_tq2_0)))
