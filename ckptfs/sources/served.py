"""Served checksums: what a local file's bytes were when they were read, to compare them with later.

A rewrite in place that puts the mtime back (``dd conv=notrunc`` then ``touch -r``; ``rsync --inplace -t``)
keeps the size and mtime a read checks; only the status-change time (ctime) moves, and a ctime change alone
(a ``chmod``, ``chown``, ``link``, ``rename``) must never fail a read. So each ``SUM_CHUNK`` chunk of the
file a read touches gets its sum recorded the first time, while the ctime is still as pinned at open (the
bytes then are the pinned bytes: any write moves the ctime); a chunk the read covers only in part is read
whole for it (``read_chunk``), so a view whose reads do not fall on chunk boundaries (a tensor's ``.raw``)
is covered too. Once the ctime differs, each recorded chunk a read touches is compared before it is served:
a chmod keeps serving, a rewrite of bytes already served is an error (EIO, one log line), never the new
bytes. Without a manifest that is all there is to compare with: bytes never read before the change are
served as they are then (``--manifest`` checks every chunk).

The table lives in one buffer whose address the C read path (fuse/_direct.c) is given, so the chunks it serves
are recorded and compared the same way: an int64 pinned ctime, an int64 chunk count n, n uint64 sums, n
"recorded" bytes (set after the sum is written). A chunk costs one sum the first time it is read, nothing
after while the ctime is unchanged.

The sum (``chunk_sum``): each little-endian 64-bit word (the last one zero-padded), xored with its index
times ``K1``, times ``K2``, added up modulo 2^64. Not a crc32: it must cost little on the first read of
every byte a mount streams (a multiply and two adds per 8 bytes in C, several times zlib's crc32 here;
zlib's crc32 cost a first stream a third of its speed), and it only has to tell the bytes of one file at one
place from other bytes there (any change of one word changes it), not stand in a manifest. It is computed in
C (``sources/chunk_sum.h``: the mount's C read path and ``_sums.c``, which sums Python's reads without the
GIL and reads a chunk a read covers in part into a buffer of its thread); numpy computes the same value where
the extension is not built (``numpy_chunk_sum``, the reference the tests compare the C sums with). In numpy
the sums of a decoded view's first stream were half of its CPU.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
from collections.abc import Callable
from typing import Any

try:
    from ckptfs.sources import _sums  # optional C helper (setup.py); without it numpy sums
except ImportError:
    _sums = None  # type: ignore[assignment]  # not built: numpy_chunk_sum serves

#: Bytes per checksum: a whole chunk must lie inside a read to be recorded or compared (the kernel asks for
#: 128 KiB or more per request of a stream; must equal fuse/_direct.c's SUM_CHUNK).
SUM_CHUNK = 64 * 1024
K1 = 0x9E3779B97F4A7C15
K2 = 0xC2B2AE3D27D4EB4F
#: Bytes summed at a time (a multiple of 8): bounds what one sum allocates, and what a chunk read in part
#: for it costs, to a few pieces of this size, whatever the chunk's.
PIECE = 8 * 1024
_HEAD = struct.Struct("<qq")


@functools.cache
def _numpy() -> tuple[Any, Any, Any]:
    """numpy, ``K2`` as a numpy word and each word's index times ``K1`` (the multiplication wraps modulo
    2^64, as in C), on first use: a local source's module is imported by commands that must not import numpy
    before their own start (``ckptfs prefetch URL``; the BLAS thread hold in ``commands.cli``)."""
    import numpy as np

    keys = np.arange(SUM_CHUNK // 8 + 1, dtype=np.uint64) * np.uint64(K1)
    return np, np.uint64(K2), keys


def _words_sum(piece: memoryview, first_word: int) -> int:
    """The sum's terms of ``piece`` (at most ``PIECE`` bytes, starting at word ``first_word`` of its chunk),
    added up modulo 2^64."""
    np, k2, keys = _numpy()
    words, rest = divmod(len(piece), 8)
    values = np.frombuffer(piece, "<u8", words)
    if rest:
        values = np.append(values, np.frombuffer(bytes(piece[8 * words:]) + bytes(8 - rest), "<u8"))
    with np.errstate(over="ignore"):
        mixed = values ^ keys[first_word:first_word + len(values)]
        mixed *= k2
        return int(mixed.sum(dtype=np.uint64))


def chunk_sum(data: bytes | memoryview) -> int:
    """The sum of one chunk (module docstring)."""
    if _sums is not None:
        return _sums.chunk_sum(data)
    return numpy_chunk_sum(data)


def numpy_chunk_sum(data: bytes | memoryview) -> int:
    """The sum of one chunk computed by numpy, a piece at a time (the fallback, and the C sums' reference)."""
    view = memoryview(data).cast("B")
    return sum(_words_sum(view[at:at + PIECE], at // 8) for at in range(0, len(view), PIECE)) % (1 << 64)


def chunk_sum_fd(fd: int, start: int, length: int) -> int | None:
    """The sum of the chunk of ``length`` bytes at ``start`` of ``fd``'s file (a read that covers a chunk in
    part: the whole chunk is read for it, never held whole in Python's memory: in C into a buffer of the
    thread, in numpy a piece at a time), or None when the file holds fewer bytes there; OSError when a read
    fails."""
    if _sums is not None:
        return _sums.chunk_sum_fd(fd, start, length)
    total = 0
    for at in range(0, length, PIECE):
        want = min(PIECE, length - at)
        piece = os.pread(fd, want, start + at)
        if len(piece) != want:
            return None
        total += _words_sum(memoryview(piece), at // 8)
    return total % (1 << 64)


class ServedSums:
    """The served checksums of one file of ``size`` bytes pinned with ctime ``ctime_ns`` (module docstring)."""

    def __init__(self, size: int, ctime_ns: int):
        self.size = max(0, size)
        self.chunks = -(-self.size // SUM_CHUNK)  # the last one shorter when the size is not a multiple
        self.ctime_ns = ctime_ns
        self._buffer = bytearray(_HEAD.size + 9 * self.chunks)
        _HEAD.pack_into(self._buffer, 0, ctime_ns, self.chunks)
        np = _numpy()[0]
        self._sums = np.frombuffer(self._buffer, np.uint64, self.chunks, _HEAD.size)
        self._have = np.frombuffer(self._buffer, np.uint8, self.chunks, _HEAD.size + 8 * self.chunks)
        self._c = (ctypes.c_char * len(self._buffer)).from_buffer(self._buffer)

    @property
    def address(self) -> int:
        """Where the table lies (for the C read path; valid while this object lives)."""
        return ctypes.addressof(self._c)

    def check(self, offset: int, data: bytes | memoryview, ctime_ns: int,
              sum_chunk: Callable[[int, int], int]) -> tuple[int | None, bool]:
        """Record or compare the chunks ``data`` (read at ``offset``, the file's ctime ``ctime_ns`` after the
        read) touches, the sums of those it covers in part given by ``sum_chunk(start, length)`` (which reads
        the whole chunk): (the offset of the first chunk that differs from what was served before, or None;
        whether ``sum_chunk`` was called — the caller then checks the ctime did not move meanwhile)."""
        changed = ctime_ns != self.ctime_ns
        view = memoryview(data).cast("B")
        end = offset + len(view)
        edges = False
        for k in range(offset // SUM_CHUNK, min(self.chunks, -(-end // SUM_CHUNK))):
            known = bool(self._have[k])
            if known and not changed:
                continue
            start = k * SUM_CHUNK
            length = min(SUM_CHUNK, self.size - start)
            if start >= offset and start + length <= end:
                got = chunk_sum(view[start - offset:start - offset + length])
            else:
                got = sum_chunk(start, length)
                edges = True
            if not known:
                self._sums[k] = got
                self._have[k] = 1
            elif got != int(self._sums[k]):
                return start, edges
        return None, edges
