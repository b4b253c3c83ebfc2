"""Scalar transcriptions of ggml's Q8_1 and Q8_K dequantization loops, for types gguf-py cannot decode.

Written one element at a time with plain Python loops and numpy float32 scalars, mirroring the C source
(ggml-quants.c ``dequantize_row_q8_K``: ``y[j] = x.d * x.qs[j]``; Q8_1 has no ggml dequantizer, its block is
``{fp16 d, fp16 s, int8 qs[32]}`` and the value is ``d * qs[j]`` like Q8_0). Nothing here is shared with
``ckptfs.quant`` on purpose: a reference that reuses the code under test cannot catch its bugs.
"""

from __future__ import annotations

import struct

import numpy as np


def dequantize_q8_1(data: bytes) -> list[np.float32]:
    """Q8_1: 36-byte blocks (d@0 fp16, s@2 fp16 unused, qs[32]@4 int8) -> 32 values each."""
    out = []
    for start in range(0, len(data), 36):
        (d_half,) = struct.unpack_from("<e", data, start)
        d = np.float32(d_half)
        for j in range(32):
            (q,) = struct.unpack_from("<b", data, start + 4 + j)
            out.append(np.float32(q) * d)
    return out


def dequantize_q8_k(data: bytes) -> list[np.float32]:
    """Q8_K: 292-byte blocks (d@0 float32, qs[256]@4 int8, bsums[16]@260 unused) -> 256 values each."""
    out = []
    for start in range(0, len(data), 292):
        (d_single,) = struct.unpack_from("<f", data, start)
        d = np.float32(d_single)
        for j in range(256):
            (q,) = struct.unpack_from("<b", data, start + 4 + j)
            out.append(d * np.float32(q))
    return out
