"""Vectorized bit-field extraction and the float arithmetic the packed schemes share.

Every scheme here stores b-bit unsigned fields in little-endian int32 words. GPTQ (all of 2, 3, 4, 8 bits),
compressed-tensors (1..8 bits) and AWQ's GEMV layout place field ``k`` of a run of words at global bit
``b * k`` of the words read as one little-endian bit string, so a 3-bit field can straddle two words
(:func:`unpack_fields`). AWQ's GEMM layout only permutes which output column each nibble holds; that
permutation is the scheme's business, not this module's.

The reference implementations compute ``(q - z) * scale`` in the scale's dtype (fp16 for GPTQ and AWQ, the
checkpoint's dtype for compressed-tensors). ``q - z`` is a small integer and the product of it with a 16-bit
float is exact in float32, so one float32 multiply followed by one rounding to the scale's dtype
(:func:`round_to`) gives exactly the reference's values.
"""

from __future__ import annotations

import numpy as np

#: Storage types a scale may have, and how its bytes become float32 (exactly).
SCALE_TYPES = ("F16", "BF16", "F32")


def unpack_fields(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first ``count`` ``bits``-wide fields of each row of little-endian uint32 ``words[..., n]``, as
    uint8 ``[..., count]`` (field ``k`` starts at bit ``bits * k`` of the row read as one bit string)."""
    words = np.ascontiguousarray(words).view(np.uint32) if words.dtype != np.uint32 else words
    if words.dtype.byteorder == ">":  # pragma: no cover - arrays built here are native little-endian
        words = words.astype("<u4")
    lead, n = words.shape[:-1], words.shape[-1]
    mask = (1 << bits) - 1
    if 32 % bits == 0:  # fields never straddle a word: shift each word by every field position at once
        per = 32 // bits
        shifts = np.arange(0, 32, bits, dtype=np.uint32)
        fields = (words[..., :, None] >> shifts) & np.uint32(mask)
        return fields.reshape(*lead, n * per)[..., :count].astype(np.uint8)
    starts = np.arange(count, dtype=np.int64) * bits
    index, offset = starts // 32, (starts % 32).astype(np.uint64)
    padded = np.concatenate([words, np.zeros((*lead, 1), np.uint32)], axis=-1).astype(np.uint64)
    joined = padded[..., index] | (padded[..., index + 1] << np.uint64(32))
    return ((joined >> offset) & np.uint64(mask)).astype(np.uint8)


def packed_words(count: int, bits: int) -> int:
    """How many int32 words ``count`` densely packed ``bits``-bit fields take."""
    return -(-count * bits // 32)


def scale_to_f32(values: np.ndarray, storage_type: str) -> np.ndarray:
    """Stored scales (F16/F32 as numpy floats, BF16 as their uint16 bit patterns) as exact float32."""
    if storage_type == "BF16":
        return (values.astype(np.uint32) << np.uint32(16)).view(np.float32)
    if storage_type in ("F16", "F32"):
        return values.astype(np.float32)
    raise ValueError(f"scales stored as {storage_type} (expected one of {', '.join(SCALE_TYPES)})")


def round_to(values: np.ndarray, storage_type: str) -> np.ndarray:
    """float32 ``values`` rounded (nearest, ties to even) to the scale type's precision, kept as float32."""
    if storage_type == "F16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).astype(np.float32)
    if storage_type == "BF16":
        bits = values.view(np.uint32)
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        out = rounded.view(np.float32)
        nan = np.isnan(values)
        if nan.any():  # the carry of rounding must not turn a NaN's payload into an infinity
            out = np.where(nan, values, out)
        return out
    return values
