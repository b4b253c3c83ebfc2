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

import threading

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
    if 8 % bits == 0:  # fields never straddle a byte: split the words' bytes (little-endian order)
        raw = np.ascontiguousarray(words).view(np.uint8)
        if bits == 8:
            return raw[..., :count].copy()
        per = 8 // bits  # field k of each byte, stacked last: contiguous passes beat strided writes
        fields = [raw & mask if k == 0 else (raw >> (bits * k)) & mask for k in range(per - 1)]
        fields.append(raw >> (bits * (per - 1)))
        return np.stack(fields, axis=-1).reshape(*lead, n * 4 * per)[..., :count]
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


def round_to(values: np.ndarray, storage_type: str, f16_normal: bool = False) -> np.ndarray:
    """float32 ``values`` (new arrays the caller owns: rounded in place where possible) rounded to nearest,
    ties to even, at the scale type's precision, kept as float32.

    For F16 the rounding is done on the float32 bits (numpy's float16 conversion costs several times more)
    when ``f16_normal`` says every value is zero or of a normal float16 magnitude (:func:`f16_normal`);
    otherwise by numpy's conversion, which also handles subnormals and overflow.
    """
    if storage_type == "F16":
        if f16_normal:
            return _round_mantissa(values, 13)
        with np.errstate(over="ignore"):
            return values.astype(np.float16).astype(np.float32)
    if storage_type == "BF16":
        nan = np.isnan(values.max()) if values.size else False
        original = values.copy() if nan else None
        out = _round_mantissa(values, 16)
        if original is not None:  # the carry of rounding must not turn a NaN's payload into an infinity
            out = np.where(np.isnan(original), original, out)
        return out
    return values


class _Scratch(threading.local):
    """Each thread's carry buffer (None until its first tile)."""

    buffer: np.ndarray | None = None


_scratch = _Scratch()


def _round_mantissa(values: np.ndarray, drop: int) -> np.ndarray:
    """Round float32 ``values`` in place to ``23 - drop`` mantissa bits (nearest, ties to even).

    The carry goes through a per-thread scratch buffer: a fresh temporary per tile costs more in page faults
    than the arithmetic (decoded tiles stay in the cache, so the heap keeps growing)."""
    u = np.ascontiguousarray(values).reshape(-1).view(np.uint32)
    buffer = _scratch.buffer
    if buffer is None or buffer.size < u.size:
        buffer = _scratch.buffer = np.empty(max(u.size, 1 << 16), np.uint32)
    carry = buffer[:u.size]
    np.right_shift(u, drop, out=carry)  # (Python int operands: numpy scalar ones cost several times more)
    carry &= 1
    carry += (1 << (drop - 1)) - 1
    u += carry
    u &= (0xFFFFFFFF >> drop) << drop
    return u.view(np.float32).reshape(values.shape)


F16_MIN_NORMAL = 2.0 ** -14
F16_MAX = 65504.0


def f16_normal(scales: np.ndarray, max_factor: int) -> bool:
    """Whether every ``k * scale`` (integer ``|k| <= max_factor``) is zero or a normal float16 magnitude: then
    :func:`round_to` may round on the bits. Checked once per layer on all its scales."""
    if scales.size == 0:
        return True
    mags = np.abs(scales)
    if not np.isfinite(mags).all() or mags.max() * max_factor >= F16_MAX:
        return False
    nonzero = mags[mags > 0]
    return nonzero.size == 0 or nonzero.min() >= F16_MIN_NORMAL
