"""crc32 of a concatenation from the crc32s of its parts (zlib's ``crc32_combine``, which Python lacks).

A tensor's manifest entry holds the crc32 of each 1 MiB chunk and the crc32 of the whole tensor. Running
zlib over every byte twice would cost a second pass; combining the chunk values costs a few dozen integer
operations per chunk instead.

The crc32 of ``A + B`` is ``shift(crc32(A), len(B)) ^ crc32(B)``, where ``shift`` is a linear map over
GF(2) (multiplication by x^(8·len(B)) modulo the CRC polynomial). The map for one zero byte is read off
zlib itself (``crc32(b"\\0", c) ^ crc32(b"\\0", 0)`` for each bit ``c``); the maps for 2^k bytes are its
squares, built once; any length applies the maps of its set bits.

``crc32`` is the process's (``ckptfs.util.crc``: ISA-L's when the optional ``isal`` package is installed, else
zlib's; both give the same values and release the GIL).
"""

from __future__ import annotations

import functools
import zlib

from ckptfs.util.crc import crc32

__all__ = ["crc32", "crc32_combine"]

_Operator = tuple[int, ...]  # 32 columns: the image of each input bit


def _apply(op: _Operator, value: int) -> int:
    result = 0
    bit = 0
    while value:
        if value & 1:
            result ^= op[bit]
        value >>= 1
        bit += 1
    return result


def _square(op: _Operator) -> _Operator:
    return tuple(_apply(op, column) for column in op)


@functools.cache
def _power_of_two(k: int) -> _Operator:
    """The shift by 2^k zero bytes."""
    if k == 0:
        base = zlib.crc32(b"\0", 0)
        return tuple(zlib.crc32(b"\0", 1 << j) ^ base for j in range(32))
    return _square(_power_of_two(k - 1))


def crc32_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """``zlib.crc32(a + b)`` given ``zlib.crc32(a)``, ``zlib.crc32(b)`` and ``len(b)``."""
    k = 0
    while length_b:
        if length_b & 1:
            crc_a = _apply(_power_of_two(k), crc_a)
        length_b >>= 1
        k += 1
    return crc_a ^ crc_b
