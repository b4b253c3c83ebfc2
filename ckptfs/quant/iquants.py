"""GGML's I-quants: IQ4_NL, IQ4_XS and the lattice-grid types IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S.

Layouts and formulas: FORMATS.md section B, checked against ggml-quants.c ``dequantize_row_iq*``. ggml forms
one float32 scale per sub-block (e.g. IQ2_XXS ``db = d * (0.5f + s) * 0.25f``) and then writes
``db * grid[j] * (sign ? -1 : 1)``. Multiplying by +-1 is exact and IEEE rounding is symmetric, so
``db * (sign ? -grid[j] : grid[j])`` is the same float32 bit for bit (NaNs aside, whose sign bit ggml does not
define either); that lets the codecs gather grid rows with their signs already applied, 8 int8 values per
uint64, and do a single float32 multiply per element.

Signs are applied to gathered rows without a table per (grid row, sign pattern): a byte mask m (0xFF where the
sign bit is set) negates a byte by ``(g ^ m) + (m & 1)``; every grid byte is >= 1, so ``g ^ 0xFF`` <= 0xFE and
the ``+1`` never carries into the next byte, which lets all 8 bytes of a row be negated in one uint64 step.

No type here has a defined big-endian layout (gguf-py's converter refuses them), so ``swap`` is None.
"""

from __future__ import annotations

import numpy as np

from . import Codec, register_codec
from ._common import F32, f16_field, field, nibbles
from .iq_tables import KVALUES_IQ4NL

QK_K = 256
_F32 = np.dtype(F32)

_IQ4NL_VALUES = KVALUES_IQ4NL.astype(F32)
# IQ4_XS 6-bit sub-block scale -> (ls - 32) as float32 (ggml: ``d * (ls - 32)``, int converted first).
_IQ4XS_SCALES = (np.arange(64) - 32).astype(F32)
_IQ4XS_SH_SHIFT = (2 * np.arange(8)).astype(np.uint16)


def decode_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    values = np.take(_IQ4NL_VALUES, nibbles(field(blocks, 2, 16, "u1")))
    np.multiply(values, f16_field(blocks, 0), out=values)
    return values


def decode_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    scales_l = nibbles(field(blocks, 4, 4, "u1")).reshape(n, 2, 4).transpose(0, 2, 1).reshape(n, 8)
    scales_h = (field(blocks, 2, 1, "<u2") >> _IQ4XS_SH_SHIFT) & 3
    ls = scales_l | (scales_h.astype(np.uint8) << 4)
    dl = np.take(_IQ4XS_SCALES, ls)
    np.multiply(dl, f16_field(blocks, 0), out=dl)
    codes = nibbles(field(blocks, 8, 128, "u1").reshape(n * 8, 16))
    values = np.take(_IQ4NL_VALUES, codes).reshape(n, 8, 32)
    np.multiply(values, dl[:, :, None], out=values)
    return values.reshape(n, QK_K)


register_codec(Codec("IQ4_NL", 32, 18, _F32, decode_iq4_nl))
register_codec(Codec("IQ4_XS", QK_K, 136, _F32, decode_iq4_xs))
