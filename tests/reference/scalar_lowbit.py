"""Scalar transcriptions of ggml's Q1_0 and Q2_0 dequantization loops, for types gguf-py cannot decode.

Written one element at a time with plain Python loops and numpy float32 scalars, mirroring ggml-quants.c:

- ``dequantize_row_q1_0`` (block: fp16 d, u8 qs[16]; 128 elements): ``neg_d = -d``; element j takes bit
  ``j % 8`` of ``qs[j / 8]`` and is ``bit ? d : neg_d``.
- ``dequantize_row_q2_0`` (block: fp16 d, u8 qs[16]; 64 elements): ``q = (qs[j / 4] >> 2 * (j % 4)) & 3``
  and ``y = ((int)q - 1) * d``.

Nothing here is shared with ``ckptfs.quant`` on purpose: a reference that reuses the code under test cannot
catch its bugs.
"""

from __future__ import annotations

import numpy as np

BLOCK_BYTES = 18


def _fp16_at(data: bytes, offset: int) -> np.float32:
    """GGML_FP16_TO_FP32 of the little-endian half at ``offset`` (exact widening; NaN payloads kept)."""
    return np.float32(np.frombuffer(data, dtype="<f2", count=1, offset=offset)[0])


def dequantize_q1_0(data: bytes) -> list[np.float32]:
    """Q1_0: 18-byte blocks (d@0 fp16, qs[16]@2) -> 128 values each."""
    out = []
    for start in range(0, len(data), BLOCK_BYTES):
        d = _fp16_at(data, start)
        neg_d = -d
        for j in range(128):
            byte = data[start + 2 + j // 8]
            bit = (byte >> (j % 8)) & 1
            out.append(d if bit else neg_d)
    return out


def dequantize_q2_0(data: bytes) -> list[np.float32]:
    """Q2_0: 18-byte blocks (d@0 fp16, qs[16]@2) -> 64 values each."""
    out = []
    for start in range(0, len(data), BLOCK_BYTES):
        d = _fp16_at(data, start)
        for j in range(64):
            byte = data[start + 2 + j // 4]
            q = (byte >> (2 * (j % 4))) & 3
            out.append(np.float32(q - 1) * d)
    return out
