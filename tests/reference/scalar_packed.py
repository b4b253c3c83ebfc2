"""Scalar transcriptions of the GPTQ and AWQ unpack loops, for formats no installed package dequantizes
(GPTQ's v2 zero points, AutoAWQ's GEMV packing) and as a second, independent reading of the others.

One element at a time with Python integers and numpy float16 scalars, mirroring the published loops:
AutoGPTQ's ``QuantLinear.pack`` (value ``j`` of a column goes to word ``row``, shifted by ``bits * (j - i)``;
for 3 bits values 10 and 21 of each 32 are split over two words) read backwards, and AutoAWQ's
``from_linear`` packers (``qweight[:, col] |= intweight[:, col * 8 + order_map[i]] << (i * 4)``). Nothing here
is shared with ``ckptfs.packed`` on purpose: a reference that reuses the code under test cannot catch its bugs.
"""

from __future__ import annotations

import numpy as np

AWQ_GEMM_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def _field(words: list[int], bits: int, k: int) -> int:
    """Value ``k`` of a run of 32-bit words where value ``j`` starts at bit ``bits * j``."""
    start = bits * k
    value = 0
    for b in range(bits):
        word, bit = divmod(start + b, 32)
        value |= ((words[word] >> bit) & 1) << b
    return value


def _u32(x) -> int:
    return int(x) & 0xFFFFFFFF


def gptq_dequantize(qweight, qzeros, scales, g_idx, bits: int, v2: bool) -> np.ndarray:
    """``W[o, i] = scales[g, o] * (q[i, o] - z[g, o])`` in float16, ``g = g_idx[i]``; v1 zero points are
    the stored field plus one."""
    rows, out = qweight.shape
    in_features = len(g_idx)
    result = np.zeros((out, in_features), np.float32)
    for o in range(out):
        column = [_u32(qweight[r, o]) for r in range(rows)]
        for i in range(in_features):
            g = int(g_idx[i])
            q = _field(column, bits, i)
            z = _field([_u32(w) for w in qzeros[g]], bits, o) + (0 if v2 else 1)
            result[o, i] = np.float16(scales[g, o]) * np.float16(q - z)
    return result


def awq_gemv_dequantize(qweight, qzeros, scales, group_size: int) -> np.ndarray:
    """GEMV: nibble ``k`` of ``qweight[o, c]`` is input ``8c + k``; zero point ``g`` is nibble ``g % 8`` of
    ``qzeros[o, g // 8]``; scale ``scales[o, g]``."""
    out, words = qweight.shape
    in_features = words * 8
    result = np.zeros((out, in_features), np.float32)
    for o in range(out):
        for i in range(in_features):
            g = i // group_size
            q = (_u32(qweight[o, i // 8]) >> (4 * (i % 8))) & 0xF
            z = (_u32(qzeros[o, g // 8]) >> (4 * (g % 8))) & 0xF
            result[o, i] = np.float16(np.float16(q - z) * np.float16(scales[o, g]))
    return result


def awq_gemm_dequantize(qweight, qzeros, scales, group_size: int) -> np.ndarray:
    """GEMM: nibble ``k`` of ``qweight[i, c]`` holds output ``8c + AWQ_GEMM_ORDER[k]``."""
    in_features, words = qweight.shape
    out = words * 8
    result = np.zeros((out, in_features), np.float32)
    for i in range(in_features):
        g = i // group_size
        for c in range(words):
            for k in range(8):
                o = 8 * c + AWQ_GEMM_ORDER[k]
                q = (_u32(qweight[i, c]) >> (4 * k)) & 0xF
                z = (_u32(qzeros[g, c]) >> (4 * k)) & 0xF
                result[o, i] = np.float16(np.float16(q - z) * np.float16(scales[g, o]))
    return result
