"""Writing a warm-up's chunks to the store's data file past the page cache (``O_DIRECT``).

A buffered write copies every byte into a page of the page cache, and a warm-up fills fresh pages: each one
allocated, charged and, on a virtual machine whose host reclaimed the guest's free memory, faulted in on the
host first. Measured on a ``ckptfs prefetch`` of 4.4 GiB, that copy was 45 % of the process's CPU time (more
than the chunks' MACs and the socket reads together), and it is spent on pages nobody reads soon: the bytes a
warm-up fetches are for a later mount. Written with ``O_DIRECT`` the device reads them out of the process's
memory instead, and the CPU's part is one copy into a page-aligned buffer that is reused (``O_DIRECT`` wants
the buffer, the offset and the length aligned, and a chunk's ``bytes`` are not). The buffers are the store's,
shared by its files (``BouncePool``): a few, however many files a warm-up writes.

Only whole chunks go this way (the file's last chunk, usually shorter, is written buffered by the caller).
A write ``O_DIRECT`` cannot do (a file system without it, ``EINVAL``) is done buffered, and so is every later
one of that file; a short write's rest is written buffered. Nothing else changes: the same bytes land at the
same offsets, the caller's MACs, room check, full-disk handling and ``sync_file_range`` stay as they are (a
direct write is on the device when it returns; the sync finds nothing left to write).
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections.abc import Callable, Sequence

#: The aligned buffer's size: whole chunks are copied into it and written a buffer at a time.
BOUNCE_BYTES = 1 << 20
#: What ``O_DIRECT`` asks of the buffer, the offset and the length (a page: every device's block or less).
ALIGN = mmap.PAGESIZE
#: Buffers a pool keeps between writes (more are made while more writes run at once, then let go).
KEPT_BUFFERS = 4


class BouncePool:
    """The page-aligned buffers of one store's direct writes, reused: each is faulted in once, not per write."""

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self) -> mmap.mmap:
        with self._lock:
            if self._free:
                return self._free.pop()
        return mmap.mmap(-1, BOUNCE_BYTES)

    def give(self, buffer: mmap.mmap) -> None:
        with self._lock:
            if len(self._free) < KEPT_BUFFERS:
                self._free.append(buffer)


class DirectWriter:
    """``O_DIRECT`` writes of whole chunks into one open data file (see the module docstring). Its user
    serializes the writes (the store writes one file from one thread at a time)."""

    def __init__(self, data_fd: int, pool: BouncePool) -> None:
        self._pool = pool
        self._fd: int | None = None
        try:  # the same inode as ``data_fd`` (not its path, which an eviction may have reused), reopened
            self._fd = os.open(f"/proc/self/fd/{data_fd}", os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
        except (OSError, AttributeError):  # no /proc, no O_DIRECT: buffered writes, as without it
            self._fd = None

    @property
    def usable(self) -> bool:
        return self._fd is not None

    def write(self, views: Sequence[memoryview], offset: int, buffered: Callable[[list[memoryview], int], int]) -> int:
        """Write ``views`` (whole chunks, their sizes multiples of ``ALIGN``) one after the other at
        ``offset`` (a multiple of ``ALIGN``): through ``O_DIRECT`` a buffer at a time, else (or for what a
        direct write left) by ``buffered(views, offset)``. The bytes written; OSError (a full disk...) as a
        buffered write raises it."""
        if self._fd is None:
            return buffered(list(views), offset)
        bounce = self._pool.take()
        try:
            return self._write(views, offset, buffered, bounce)
        finally:
            self._pool.give(bounce)

    def _write(self, views: Sequence[memoryview], offset: int, buffered: Callable[[list[memoryview], int], int],
               bounce: mmap.mmap) -> int:
        done, k = 0, 0
        while k < len(views):
            if self._fd is None:
                return done + buffered(list(views[k:]), offset + done)
            n = 0
            while k < len(views) and n + views[k].nbytes <= BOUNCE_BYTES:
                bounce[n:n + views[k].nbytes] = views[k]
                n += views[k].nbytes
                k += 1
            if not n:  # a view larger than the buffer: written as it is
                done += buffered([views[k]], offset + done)
                k += 1
                continue
            with memoryview(bounce) as whole, whole[:n] as part:
                try:
                    wrote = os.pwrite(self._fd, part, offset + done)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self.close()  # this file system takes no direct writes: this file is written buffered
                    wrote = 0
                if wrote < n:  # (a short write: the device took part of it before running out of room)
                    wrote += buffered([part[wrote:]], offset + done + wrote)
            done += wrote
        return done

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
