"""Read-ahead for a mount's sequential readers: decode ahead in the background, tell the kernel what comes next.

A reader that streams a ``.npy`` (``cat``, ``np.load``, ``cp``) asks for one readahead-sized request after
another, and each one, on a cache miss, waits for ``pread`` + decode of its block groups before the copy.
The :class:`Prefetcher` watches each open file handle: once a read starts where the previous one ended, it
decodes the next groups into the shared block cache on a small worker pool (the C kernels release the GIL,
so on two cores the decode overlaps the FUSE thread's copying), and advises the kernel about the stored
bytes those groups will read (``POSIX_FADV_WILLNEED``; ``SEQUENTIAL`` once per stream), so the worker's
``pread`` finds them in the page cache. A read that jumps elsewhere ends the stream: queued work for it is
skipped. Read-ahead never holds more than a fraction of the cache: at most 1/8 of it ahead of one stream
and 1/4 in flight over all streams, so it cannot evict what readers are using.

What lies ahead is the view's to say (``View.ahead``): the stored bytes to advise and the decoding jobs
(block groups) that cover the next bytes of the file, so a new kind of view gets read-ahead by answering it.
The kernel's side (the mount's readahead, the allocator) is ``ckptfs.fs.kernel``'s.

``CKPTFS_PREFETCH=0`` turns the read-ahead off (for measuring its gain), ``CKPTFS_PREFETCH=kernel`` keeps
only the advice (no background decoding: no worker thread, no decoded data ahead in memory). Knows nothing
of FUSE: it sees file handles, views and byte ranges.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ckptfs.sources import SourcePool
from ckptfs.engine.views import View

log = logging.getLogger(__name__)

PREFETCH_ENV = "CKPTFS_PREFETCH"
MAX_AHEAD_BYTES = 8 << 20
STREAM_SHARE = 8  # ahead of one stream: at most capacity / 8
TOTAL_SHARE = 4  # in flight over all streams: at most capacity / 4
WORKERS = 1


def enabled_from_env() -> bool:
    return os.environ.get(PREFETCH_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def decode_ahead_from_env() -> bool:
    return enabled_from_env() and os.environ.get(PREFETCH_ENV, "").strip().lower() != "kernel"


@dataclass
class _Stream:
    """What one open file handle has read, and how far ahead of it work is scheduled."""

    view: View
    end: int = -1
    run: int = 0
    ahead_until: int = 0
    generation: int = 0
    advised: bool = False
    closed: bool = False


class Prefetcher:
    """Per-handle sequential detection and bounded background decoding (see the module docstring)."""

    def __init__(self, sources: SourcePool, cache_capacity: int, enabled: bool = True, workers: int = WORKERS,
                 decode_ahead: bool = True):
        self.enabled = enabled
        self.decode_ahead = decode_ahead and cache_capacity > 0
        self._sources = sources
        # decoded data ahead must fit the cache; advice alone costs no memory of ours
        self._ahead = min(MAX_AHEAD_BYTES, cache_capacity // STREAM_SHARE) if self.decode_ahead else MAX_AHEAD_BYTES
        self._budget = cache_capacity // TOTAL_SHARE
        self._in_flight = 0
        self._streams: dict[int, _Stream] = {}
        self._lock = threading.Lock()
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None  # started on first use: never before a fork

    @classmethod
    def from_env(cls, sources: SourcePool, cache_capacity: int) -> Prefetcher:
        """A prefetcher configured by ``CKPTFS_PREFETCH`` (the mount daemon's)."""
        return cls(sources, cache_capacity, enabled_from_env(), decode_ahead=decode_ahead_from_env())

    def opened(self, fh: int, view: View) -> None:
        if self.enabled and view.reads_ahead:
            with self._lock:
                self._streams[fh] = _Stream(view)

    def released(self, fh: int) -> None:
        with self._lock:
            stream = self._streams.pop(fh, None)
            if stream is not None:
                stream.closed = True

    def on_read(self, fh: int, offset: int, size: int) -> None:
        """Note a read about to be served; schedule what a sequential reader will ask for next."""
        stream = self._streams.get(fh)
        if stream is None:
            return
        with self._lock:
            slack = 4 * max(size, 128 << 10)  # concurrent readahead requests may arrive slightly out of order
            if stream.end >= 0 and -slack <= offset - stream.end <= slack:
                stream.run += 1
                stream.end = max(stream.end, offset + size)
            else:
                if stream.run:
                    stream.generation += 1  # the access turned random: skip what is queued for it
                stream.run, stream.end, stream.ahead_until = 0, offset + size, 0
                return
            start = max(stream.end, stream.ahead_until)
            stop = min(stream.view.size, stream.end + self._ahead)
            if stop <= start or start - stream.end > self._ahead // 2:
                return  # at end of file, or more than half a window is already ahead
            first = not stream.advised
            stream.advised = True
            generation = stream.generation
        try:
            self._schedule(stream, start, stop, generation, first)
        except Exception:  # noqa: BLE001 - read-ahead is an optimization; the read itself reports errors
            log.debug("read-ahead of %d..%d failed", start, stop, exc_info=True)

    # -- scheduling ---------------------------------------------------------------------------------------

    def _schedule(self, stream: _Stream, start: int, stop: int, generation: int, first: bool) -> None:
        plan = stream.view.ahead(start, stop)
        for name, offset, nbytes in plan.advise:
            self._advise(name, offset, nbytes, first)
        if not self.decode_ahead or not plan.decode:
            stream.ahead_until = stop
            return
        for until, nbytes, job in plan.decode:
            with self._lock:
                if self._in_flight + nbytes > self._budget:
                    return  # over budget: try again on a later read
                self._in_flight += nbytes
            stream.ahead_until = until
            self._pool_started().submit(self._run, stream, generation, job, nbytes)

    def _run(self, stream: _Stream, generation: int, job: Callable[[], None], nbytes: int) -> None:
        try:
            if not stream.closed and stream.generation == generation:
                job()
        except Exception:  # noqa: BLE001 - a failing group fails the read that needs it, with its own error
            log.debug("read-ahead job %r failed", job, exc_info=True)
        finally:
            with self._lock:
                self._in_flight -= nbytes

    def _advise(self, path: str, offset: int, nbytes: int, sequential: bool) -> None:
        if nbytes > 0:
            self._sources.get(path).advise(offset, nbytes, sequential=sequential)

    def _pool_started(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="ckptfs-prefetch")
        return self._pool

    def close(self, wait: bool = False) -> None:
        """Stop the workers: drop queued work, or with ``wait`` finish it first."""
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=not wait)
            self._pool = None
