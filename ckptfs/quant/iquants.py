"""GGML's I-quants: IQ4_NL, IQ4_XS and the lattice-grid types IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S.

Layouts and formulas: docs/block-formats.md, checked against ggml-quants.c ``dequantize_row_iq*``. ggml forms
one float32 scale per sub-block (e.g. IQ2_XXS ``db = d * (0.5f + s) * 0.25f``) and then writes
``db * grid[j] * (sign ? -1 : 1)``. Multiplying by +-1 is exact and IEEE rounding is symmetric, so
``db * (sign ? -grid[j] : grid[j])`` is the same float32 bit for bit (NaNs aside, whose sign bit ggml does not
define either); that lets the codecs gather grid rows with their signs already applied, 8 int8 values per
uint64, and do a single float32 multiply per element.

Signs are applied to gathered rows without a table per (grid row, sign pattern): a byte mask m (0xFF where the
sign bit is set) negates a byte by ``(g ^ m) + (m & 1)``; every grid byte is >= 1, so ``g ^ 0xFF`` <= 0xFE and
the ``+1`` never carries into the next byte, which lets all 8 bytes of a row be negated in one uint64 step.

IQ4_NL / IQ4_XS: two output-adjacent nibbles are packed into one byte with uint64 shifts and masks, and that
byte indexes a table of float32 value pairs, so a gather moves two converted values at a time.

numpy pays ~20 ns per inner loop, so every step is laid out to run over long contiguous rows, and blocks are
decoded in chunks whose temporaries stay in the CPU cache instead of streaming the whole tensor through memory
once per step.

No type here has a defined big-endian layout (gguf-py's converter refuses them), so ``swap`` is None.
"""

from __future__ import annotations

import numpy as np

from ckptfs.quant import Codec, register_codec
from ckptfs.quant._common import F32, chunked, f16_field, field, nibbles
from ckptfs.quant.iq_tables import (IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
                        KVALUES_IQ4NL)

QK_K = 256
_F32 = np.dtype(F32)
_U64 = np.dtype("<u8")


def _rows(grid: np.ndarray) -> np.ndarray:
    """A grid's int8 rows as one integer each (8 bytes -> u8, 4 bytes -> u4), for single-item gathers."""
    return np.ascontiguousarray(grid).view("<u8" if grid.shape[1] == 8 else "<u4").reshape(grid.shape[0])


# _SIGN_MASKS[s]: 0xFF in byte j where bit j of the sign byte s is set; _KSIGN_MASKS: the same for ksigns[7 bits].
_SIGN_MASKS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little") * np.uint8(0xFF)
_SIGN_MASKS = _SIGN_MASKS.view(_U64).reshape(256)
_KSIGN_MASKS = _SIGN_MASKS[KSIGNS_IQ2XS]
_LOW_BITS = np.uint64(0x0101010101010101)

_IQ2XXS_ROWS = _rows(IQ2XXS_GRID)
_IQ2XS_ROWS = _rows(IQ2XS_GRID)
_IQ2S_ROWS = _rows(IQ2S_GRID)
_IQ3XXS_ROWS = _rows(IQ3XXS_GRID)
_IQ3S_ROWS = _rows(IQ3S_GRID)
# IQ1_S/IQ1_M: row (delta bit << 11 | index) holds 8 * (grid[j] + delta) as int8 (-9, -7, -1, 1, 7, 9). ggml's
# ``dl * (grid[j] + delta)`` equals ``(dl * 0.125f) * (8 * (grid[j] + delta))`` bit for bit: both operands
# are scaled by exact powers of two (dl >= 2^-24 stays normal) and the exact product is rounded once.
_IQ1_ROWS = _rows(np.concatenate([8 * IQ1S_GRID + 1, 8 * IQ1S_GRID - 1]).astype(np.int8))
_F32_EIGHTH = F32(0.125)
# Sub-block scale factors as float32, converted like ggml's int -> float: 0.5f + s, 1 + 2s, 2s + 1.
_HALF_PLUS = (np.arange(16) + 0.5).astype(F32)
_ODD = (2 * np.arange(16) + 1).astype(F32)
_SHIFTS_7 = np.array([0, 7, 14, 21], dtype=np.uint32)
_SHIFTS_2 = np.array([0, 2, 4, 6], dtype=np.uint8)
_SHIFTS_3 = np.array([0, 3, 6, 9], dtype=np.uint16)
_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8)
_BIT_SHIFTS = np.arange(8, dtype=np.uint8)

# IQ4: byte (a | b << 4) -> the float32 pair (kvalues[a], kvalues[b]) as one 8-byte item.
_BYTE = np.arange(256)
_IQ4_PAIRS = (np.stack([KVALUES_IQ4NL[_BYTE & 15], KVALUES_IQ4NL[_BYTE >> 4]], axis=1).astype(F32)
              .view(_U64).reshape(256))
_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_EVEN_BYTES = np.uint64(0x00FF00FF00FF00FF)
# IQ4_XS 6-bit sub-block scale -> (ls - 32) as float32 (ggml: ``d * (ls - 32)``, int converted first).
_IQ4XS_SCALES = (np.arange(64) - 32).astype(F32)
_IQ4XS_SH_SHIFT = (2 * np.arange(8)).astype(np.uint16)


def _iq4_values(qs: np.ndarray) -> np.ndarray:
    """kvalues of the nibbles of u8 ``qs[n, 16g]`` in ggml's order (per 16 bytes: the 16 low nibbles, then
    the 16 high ones): f32[n, 32g]."""
    n, width = qs.shape
    words = np.ascontiguousarray(qs).view(_U64)
    pairs = np.empty((2, n, width // 8), dtype=_U64)          # low nibbles, high nibbles
    np.bitwise_and(words, _NIBBLES, out=pairs[0])
    np.right_shift(words, np.uint64(4), out=pairs[1])
    np.bitwise_and(pairs[1], _NIBBLES, out=pairs[1])
    # Byte 2i of each word becomes nibble 2i | nibble 2i+1 << 4 (the odd bytes are cleared): a pair index.
    np.bitwise_or(pairs, pairs >> np.uint64(4), out=pairs)
    np.bitwise_and(pairs, _EVEN_BYTES, out=pairs)
    order = pairs.view("<u2").reshape(2, n, width // 16, 8).transpose(1, 2, 0, 3)
    return np.take(_IQ4_PAIRS, order).view(F32).reshape(n, 2 * width)


def _iq4_nl_into(blocks: np.ndarray, out: np.ndarray) -> None:
    np.multiply(_iq4_values(field(blocks, 2, 16, "u1")), f16_field(blocks, 0), out=out)


def _iq4_xs_into(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    scales_l = nibbles(field(blocks, 4, 4, "u1")).reshape(n, 2, 4).transpose(0, 2, 1).reshape(n, 8)
    scales_h = (field(blocks, 2, 1, "<u2") >> _IQ4XS_SH_SHIFT) & 3
    ls = scales_l | (scales_h.astype(np.uint8) << 4)
    dl = np.take(_IQ4XS_SCALES, ls)
    np.multiply(dl, f16_field(blocks, 0), out=dl)
    values = _iq4_values(field(blocks, 8, 128, "u1")).reshape(n, 8, 32)
    np.multiply(values, dl[:, :, None], out=out.reshape(n, 8, 32))


def _apply_signs(rows: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Negate the int8 bytes of ``rows`` (u64) where ``masks`` has 0xFF, in place: ``(g ^ m) + (m & 1)``."""
    np.bitwise_xor(rows, masks, out=rows)
    np.bitwise_and(masks, _LOW_BITS, out=masks)
    np.add(rows, masks, out=rows)
    return rows


def _scaled(values: np.ndarray, scale: np.ndarray, out: np.ndarray) -> None:
    """``out = scale * values`` in float32 for int8 ``values`` (the grid bytes, converted exactly)."""
    np.multiply(values, scale, out=out.reshape(values.shape))


def _iq2_scales(blocks: np.ndarray, d: np.ndarray, at: int) -> np.ndarray:
    """IQ2_XS/IQ2_S: ``d * (0.5f + s) * 0.25f`` for the two 4-bit scales of each sub-block: f32[n, 8, 2]."""
    s = (field(blocks, at, 8, "u1")[:, :, None] >> _NIBBLE_SHIFTS) & 15
    db = np.take(_HALF_PLUS, s)
    np.multiply(db, d[:, :, None], out=db)
    np.multiply(db, F32(0.25), out=db)
    return db


def _iq2_xxs_into(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    aux = field(blocks, 2, 16, "<u4").reshape(n, 8, 2)          # per sub-block: grid bytes, signs + scale
    rows = np.take(_IQ2XXS_ROWS, field(blocks, 2, 64, "u1").reshape(n, 8, 8)[:, :, :4])
    masks = np.take(_KSIGN_MASKS, (aux[:, :, 1:] >> _SHIFTS_7) & 127)
    _apply_signs(rows, masks)
    db = np.take(_HALF_PLUS, aux[:, :, 1] >> 28)
    np.multiply(db, f16_field(blocks, 0), out=db)
    np.multiply(db, F32(0.25), out=db)
    _scaled(rows.view(np.int8).reshape(n, 8, 32), db[:, :, None], out)


def _iq2_xs_into(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    w = field(blocks, 2, 32, "<u2")
    rows = np.take(_IQ2XS_ROWS, w & 511)
    masks = np.take(_KSIGN_MASKS, w >> 9)
    _apply_signs(rows, masks)
    db = _iq2_scales(blocks, f16_field(blocks, 0), 66)
    _scaled(rows.view(np.int8).reshape(n, 8, 2, 16), db[:, :, :, None], out)


def _iq2_s_into(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    high = (field(blocks, 66, 8, "u1")[:, :, None] >> _SHIFTS_2) & 3
    idx = field(blocks, 2, 32, "u1").reshape(n, 8, 4) | (high.astype(np.uint16) << 8)
    rows = np.take(_IQ2S_ROWS, idx)
    masks = np.take(_SIGN_MASKS, field(blocks, 34, 32, "u1").reshape(n, 8, 4))
    _apply_signs(rows, masks)
    db = _iq2_scales(blocks, f16_field(blocks, 0), 74)
    _scaled(rows.view(np.int8).reshape(n, 8, 2, 16), db[:, :, :, None], out)


def _iq3_xxs_into(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    # Group l of sub-block b: bytes j < 4 from grid[qs[8b + 2l]], j >= 4 from grid[qs[8b + 2l + 1]].
    rows = np.take(_IQ3XXS_ROWS, field(blocks, 2, 64, "u1")).view(_U64).reshape(n, 8, 4)
    aux = field(blocks, 66, 8, "<u4")
    masks = np.take(_KSIGN_MASKS, (aux[:, :, None] >> _SHIFTS_7) & 127)
    _apply_signs(rows, masks)
    db = np.take(_HALF_PLUS, aux >> 28)
    np.multiply(db, f16_field(blocks, 0), out=db)
    np.multiply(db, F32(0.5), out=db)
    _scaled(rows.view(np.int8).reshape(n, 8, 32), db[:, :, None], out)


def _iq3_s_into(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    high = (field(blocks, 66, 8, "u1")[:, :, None] >> _BIT_SHIFTS) & 1           # bit k of qh[b] -> index k
    idx = field(blocks, 2, 64, "u1").reshape(n, 8, 8) | (high.astype(np.uint16) << 8)
    rows = np.take(_IQ3S_ROWS, idx).view(_U64).reshape(n, 8, 4)
    masks = np.take(_SIGN_MASKS, field(blocks, 74, 32, "u1").reshape(n, 8, 4))
    _apply_signs(rows, masks)
    s = (field(blocks, 106, 4, "u1")[:, :, None] >> _NIBBLE_SHIFTS) & 15          # sub-block 2i + k
    db = np.take(_ODD, s.reshape(n, 8))
    np.multiply(db, f16_field(blocks, 0), out=db)
    _scaled(rows.view(np.int8).reshape(n, 8, 32), db[:, :, None], out)


def _iq1_s_into(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    qh = field(blocks, 34, 8, "<u2")
    idx = field(blocks, 2, 32, "u1").reshape(n, 8, 4) | (((qh[:, :, None] >> _SHIFTS_3) & 7) << 8)
    idx |= (qh[:, :, None] >> 15) << 11
    dl = np.take(_ODD, (qh >> 12) & 7)
    np.multiply(dl, f16_field(blocks, 0), out=dl)
    np.multiply(dl, _F32_EIGHTH, out=dl)
    rows = np.take(_IQ1_ROWS, idx)
    _scaled(rows.view(np.int8).reshape(n, 8, 32), dl[:, :, None], out)


def _iq1_m_into(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    sc = field(blocks, 48, 4, "<u2")
    d_bits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
    d = d_bits.view("<f2").astype(F32)
    # Group l of sub-block b: nibble l % 2 of qh[2b + l // 2]; bits 0-2 extend the index, bit 3 is the delta sign.
    # So the nibble shifted left by 8 is exactly the (delta bit << 11 | index high bits << 8) of _IQ1_ROWS.
    hb = ((field(blocks, 32, 16, "u1")[:, :, None] >> _NIBBLE_SHIFTS) & 15).reshape(n, 8, 4).astype(np.uint16)
    idx = field(blocks, 0, 32, "u1").reshape(n, 8, 4) | (hb << 8)
    # 3-bit scale of groups 2h, 2h + 1 of sub-block b: bits 6(b % 2) + 3h of sc[b // 2].
    s = (sc[:, :, None] >> _SHIFTS_3) & 7                                             # (n, b // 2, 2(b % 2) + h)
    dl = np.take(_ODD, s.reshape(n, 8, 2))
    np.multiply(dl, d[:, None, None], out=dl)
    np.multiply(dl, _F32_EIGHTH, out=dl)
    rows = np.take(_IQ1_ROWS, idx)
    _scaled(rows.view(np.int8).reshape(n, 8, 2, 16), dl[:, :, :, None], out)


decode_iq1_s = chunked(_iq1_s_into, QK_K)
decode_iq1_m = chunked(_iq1_m_into, QK_K)
decode_iq2_xxs = chunked(_iq2_xxs_into, QK_K)
decode_iq2_xs = chunked(_iq2_xs_into, QK_K)
decode_iq2_s = chunked(_iq2_s_into, QK_K)
decode_iq3_xxs = chunked(_iq3_xxs_into, QK_K)
decode_iq3_s = chunked(_iq3_s_into, QK_K)
decode_iq4_nl = chunked(_iq4_nl_into, 32)
decode_iq4_xs = chunked(_iq4_xs_into, QK_K)

register_codec(Codec("IQ1_S", QK_K, 50, _F32, decode_iq1_s))
register_codec(Codec("IQ1_M", QK_K, 56, _F32, decode_iq1_m))
register_codec(Codec("IQ2_XXS", QK_K, 66, _F32, decode_iq2_xxs))
register_codec(Codec("IQ2_XS", QK_K, 74, _F32, decode_iq2_xs))
register_codec(Codec("IQ2_S", QK_K, 82, _F32, decode_iq2_s))
register_codec(Codec("IQ3_XXS", QK_K, 98, _F32, decode_iq3_xxs))
register_codec(Codec("IQ3_S", QK_K, 110, _F32, decode_iq3_s))
register_codec(Codec("IQ4_NL", 32, 18, _F32, decode_iq4_nl))
register_codec(Codec("IQ4_XS", QK_K, 136, _F32, decode_iq4_xs))
