"""Plain element types (F32, I8, BOOL, C64, ...) and the small float formats (BF16, F8*, F6*, F4).

Plain types are ``exact``: their stored bytes already are numpy values, so decoding is a zero-copy view (the
result may share memory with the input block array; callers copy before writing). The small floats have no
numpy dtype and become float32. Each of them is decoded through a lookup table with one entry per bit
pattern, built here from the bit layout rather than transcribed, so the tables are checkable against
ml_dtypes pattern by pattern.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ckptfs.quant import Codec, register_codec
from ckptfs.quant._common import F32, field, swap_elements
from ckptfs.quant.native import accelerated

# Plain little-endian numeric types: name -> numpy dtype. One element per "block".
_PLAIN = {
    "F32": "<f4", "F16": "<f2", "F64": "<f8",
    "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8",
    "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8",
    "BOOL": "?",   # one byte per element, stored as is (a byte other than 0/1 stays what the file says)
    "C64": "<c8",  # f32 real then f32 imaginary: each half is byte-swapped on its own
}


def _view_as(dtype: np.dtype) -> Callable[[np.ndarray], np.ndarray]:
    """decode for a plain type: ``u8[n, itemsize]`` viewed as ``dtype[n, 1]`` (one numpy call when the bytes
    of each block are contiguous, which they always are for what the block engine passes; else a copy)."""
    def decode(blocks: np.ndarray) -> np.ndarray:
        try:
            return blocks.view(dtype)
        except ValueError:          # the last axis is strided: no view can reinterpret its bytes
            return np.ascontiguousarray(blocks).view(dtype)

    return decode


def _register_plain() -> None:
    for name, spec in _PLAIN.items():
        dt = np.dtype(spec)
        swap_unit = 4 if name == "C64" else dt.itemsize
        register_codec(Codec(name, 1, dt.itemsize, dt, _view_as(dt), exact=True, swap=swap_elements(swap_unit)))


def decode_bf16(blocks: np.ndarray) -> np.ndarray:
    """bfloat16 is the top half of a float32: widen by shifting the 16 bits into place (exact, NaNs kept).

    One ufunc does the u16 -> u32 widening (in its cache-sized cast buffer) and the shift, so the output is
    written once, not converted and then shifted in a second pass over memory.
    """
    halves = field(blocks, 0, 1, "<u2")
    wide = np.empty(halves.shape, dtype=np.uint32)
    np.left_shift(halves, np.uint32(16), out=wide, dtype=np.uint32, casting="unsafe")
    return wide.view(F32)


def minifloat_table(exp_bits: int, man_bits: int, bias: int, *, ieee: bool = False,
                    nan_codes: tuple[int, ...] = ()) -> np.ndarray:
    """float32 value of every code of a sign + exponent + mantissa format, from the bit definition.

    ``ieee``: the all-ones exponent means inf (mantissa 0) or NaN (else). ``nan_codes``: extra codes that are
    NaN (OCP e4m3fn's S.1111.111, FNUZ's 0x80 "negative zero"). Computed in float64, where every value of
    these formats is exact, then narrowed to float32 (also exact: all fit, subnormals included).
    """
    codes = np.arange(1 << (1 + exp_bits + man_bits), dtype=np.int64)
    sign = (codes >> (exp_bits + man_bits)) & 1
    exp = (codes >> man_bits) & ((1 << exp_bits) - 1)
    man = (codes & ((1 << man_bits) - 1)).astype(np.float64)
    frac = man / float(1 << man_bits)
    magnitude = np.where(exp == 0, frac * 2.0 ** (1 - bias), (1.0 + frac) * np.exp2((exp - bias).astype(np.float64)))
    if ieee:
        top = exp == (1 << exp_bits) - 1
        magnitude = np.where(top, np.where(man == 0, np.inf, np.nan), magnitude)
    values = np.where(sign == 1, -magnitude, magnitude)
    values[list(nan_codes)] = np.nan
    return values.astype(F32)


def e8m0_table() -> np.ndarray:
    """e8m0fnu: a bare biased exponent, 2^(e-127); 0xFF is NaN. 2^-127 is a float32 subnormal (exact)."""
    values = np.exp2(np.arange(256, dtype=np.float64) - 127.0)
    values[255] = np.nan
    return values.astype(F32)


def _lut_decoder(table: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    def decode(blocks: np.ndarray) -> np.ndarray:
        return np.take(table, blocks.reshape(-1))

    return decode


def _f4_decoder(table: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """F4 (E2M1), two elements per byte.

    Decision (the safetensors spec does not say): element 2i is the LOW nibble of byte i and element 2i+1 the
    high nibble — PyTorch's ``float4_e2m1fn_x2`` convention, and the order GGML's MXFP4/NVFP4 use within a
    byte pair. A pair table maps each byte to its two values in one lookup.
    """
    pairs = np.stack([table[np.arange(256) & 15], table[np.arange(256) >> 4]], axis=1)

    def decode(blocks: np.ndarray) -> np.ndarray:
        return np.take(pairs, blocks[:, 0], axis=0)

    return decode


_F6_SHIFTS = np.array([0, 6, 12, 18], dtype=np.uint32)


def _f6_decoder(table: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """F6 (E2M3 / E3M2), four elements in three bytes.

    Decision (the safetensors spec does not say): the three bytes are one little-endian 24-bit word and element
    k of the group is bits 6k..6k+5 of it — element 0 in the lowest 6 bits of byte 0, the LSB-first packing
    used for every other sub-byte type here.
    """
    def decode(blocks: np.ndarray) -> np.ndarray:
        b = blocks.astype(np.uint32)
        word = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        codes = (word[:, None] >> _F6_SHIFTS) & 63
        return np.take(table, codes)

    return decode


F8_E4M3_TABLE = minifloat_table(4, 3, 7, nan_codes=(0x7F, 0xFF))
F8_E5M2_TABLE = minifloat_table(5, 2, 15, ieee=True)
F8_E4M3FNUZ_TABLE = minifloat_table(4, 3, 8, nan_codes=(0x80,))
F8_E5M2FNUZ_TABLE = minifloat_table(5, 2, 16, nan_codes=(0x80,))
F8_E8M0_TABLE = e8m0_table()
F4_E2M1_TABLE = minifloat_table(2, 1, 1)
F6_E2M3_TABLE = minifloat_table(2, 3, 1)
F6_E3M2_TABLE = minifloat_table(3, 2, 3)


def _register_small_floats() -> None:
    f32 = np.dtype(F32)
    register_codec(Codec("BF16", 1, 2, f32, accelerated("BF16", 1, decode_bf16), swap=swap_elements(2)))
    for name, table in (("F8_E4M3", F8_E4M3_TABLE), ("F8_E5M2", F8_E5M2_TABLE), ("F8_E8M0", F8_E8M0_TABLE),
                        ("F8_E4M3FNUZ", F8_E4M3FNUZ_TABLE), ("F8_E5M2FNUZ", F8_E5M2FNUZ_TABLE)):
        # Single bytes have no byte order; safetensors (their only format) is little-endian anyway.
        register_codec(Codec(name, 1, 1, f32, _lut_decoder(table), swap=swap_elements(1)))
    # F4/F6 are safetensors-only and packed across bit positions: no big-endian layout is defined.
    register_codec(Codec("F4", 2, 1, f32, _f4_decoder(F4_E2M1_TABLE)))
    register_codec(Codec("F6_E2M3", 4, 3, f32, _f6_decoder(F6_E2M3_TABLE)))
    register_codec(Codec("F6_E3M2", 4, 3, f32, _f6_decoder(F6_E3M2_TABLE)))


_register_plain()
_register_small_floats()
