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

**Landing buffers.** A warm-up's body need not be copied at all: the store lends the fetch an
:class:`AlignedBuffer` of the piece's size (``BouncePool.landing``), the range client writes the body
straight into it (``ckptfs.sources.remote.curl``), and the chunks, views of it at multiples of ``CHUNK``,
are written from there with one ``pwritev``. The buffers are kept between pieces (up to ``KEPT_BYTES``) and let
go when the warm-up ends (``let_go``), so their pages are faulted in once per warm-up instead of once per piece: fresh memory for every fetched byte
(a page fault, a zeroed page and a memory-cgroup charge every 4 KiB) was the largest part of a warm-up's
system time after the socket reads.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Callable, Iterator, Sequence

#: The aligned buffer's size: whole chunks are copied into it and written a buffer at a time.
BOUNCE_BYTES = 1 << 20
#: What ``O_DIRECT`` asks of the buffer, the offset and the length (a page: every device's block or less).
ALIGN = mmap.PAGESIZE
#: The smallest buffer made: a read-ahead's largest piece (``ckptfs.sources.remote.transport``'s ``piece_bytes``).
BUFFER_BYTES = 4 << 20
#: Bytes of buffers a pool keeps between writes (more are made while more writes run at once, then let go):
#: a warm-up's pieces in flight at once (32 of 4 MiB at the origin's first limit) land in buffers kept.
KEPT_BYTES = 128 << 20


def views_after(views: Sequence[memoryview], skip: int) -> list[memoryview]:
    """What is left of ``views`` (one after the other) past their first ``skip`` bytes: what a short write
    left to write."""
    rest = []
    for view in views:
        if skip >= view.nbytes:
            skip -= view.nbytes
            continue
        rest.append(view[skip:])
        skip = 0
    return rest


class AlignedBuffer(mmap.mmap):
    """Anonymous memory of a whole number of pages, starting on a page (an ``mmap`` does): a view of it that
    starts at a multiple of ``ALIGN`` and is a multiple of it long is aligned for ``O_DIRECT``. Private to
    the process (``mmap``'s default for anonymous memory is shared, whose pages cost more to fault in)."""

    @classmethod
    def of(cls, size: int) -> AlignedBuffer:
        return cls(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


class BouncePool:
    """The page-aligned buffers of one store's direct writes and landings, reused: each is faulted in once,
    not per write (see the module docstring). A buffer is at least ``BUFFER_BYTES`` (a read-ahead's largest
    piece), so the pieces of every size a warm-up asks for share the same few."""

    def __init__(self) -> None:
        self._free: list[AlignedBuffer] = []
        self._kept = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int = BOUNCE_BYTES) -> AlignedBuffer:
        with self._lock:
            for k, buffer in enumerate(self._free):
                if len(buffer) >= nbytes:
                    del self._free[k]
                    self._kept -= len(buffer)
                    return buffer
        return AlignedBuffer.of(max(BUFFER_BYTES, -(-nbytes // BOUNCE_BYTES) * BOUNCE_BYTES))

    def give(self, buffer: AlignedBuffer) -> None:
        with self._lock:
            if self._kept + len(buffer) <= KEPT_BYTES:
                self._free.append(buffer)
                self._kept += len(buffer)

    def let_go(self) -> None:
        """Let the buffers kept (not those lent now) go: unmapped once nothing holds a view of them (the
        writes that used them ended)."""
        with self._lock:
            self._free, self._kept = [], 0

    @contextlib.contextmanager
    def landing(self, nbytes: int) -> Iterator[memoryview]:
        """A writable view of ``nbytes`` at the start of a buffer of the pool, lent for the ``with`` block:
        whoever fills it must hold no view of it past the block (the buffer is lent again)."""
        buffer = self.take(nbytes)
        try:
            yield memoryview(buffer)[:nbytes]
        finally:
            self.give(buffer)


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
        if all(isinstance(view.obj, AlignedBuffer) for view in views):
            landed = self._write_landed(views, offset, buffered)
            if landed is not None:
                return landed
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

    def _write_landed(self, views: Sequence[memoryview], offset: int,
                      buffered: Callable[[list[memoryview], int], int]) -> int | None:
        """``views`` of landing buffers (``AlignedBuffer``) written from where they are, in one ``pwritev``;
        None when the kernel refuses them as unaligned (``EINVAL``: a view that does not start on a block),
        for the caller's copy through a bounce buffer."""
        assert self._fd is not None
        try:
            wrote = os.pwritev(self._fd, views, offset)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return None
        if wrote < sum(view.nbytes for view in views):  # (a short write: the device ran out of room)
            wrote += buffered(views_after(views, wrote), offset + wrote)
        return wrote

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
