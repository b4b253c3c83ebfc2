"""Remote read-ahead: a sequential reader's next bytes are already on their way when it asks for them.

Over a network each request costs a round trip, so a reader that streams a file (``cat`` of a ``.npy``,
``np.load``, a model loader) would otherwise wait for one round trip per read. Each remote source watches
its own reads: once two reads in a row continue where the previous one ended, it fetches ahead of the reader
in a window that doubles per sequential read (1 MiB up to ``MAX_WINDOW``), as several requests of ``PIECE``
bytes in flight at once on a small shared worker pool. A read elsewhere resets the window, so a random
reader fetches only the chunks covering its reads. Memory stays bounded: fetched chunks go into the shared
chunk LRU (bounded), and the bytes in flight over all sources never exceed ``MAX_IN_FLIGHT``.

The block engine's own read-ahead calls ``advise`` on the stored bytes of the groups it will decode next;
that lands here too (``prefetch``), so a decoding stream and a raw stream are both fed ahead.

Threads are started only by reads ahead, never while a checkpoint is opened, and a forked child (a mount
daemon, a DataLoader worker) starts with a fresh pool: threads do not survive ``fork``.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

from ckptfs.cache.chunks import CHUNK

log = logging.getLogger(__name__)

MIN_WINDOW = 1 << 20
MAX_WINDOW = 32 << 20
PIECE = 8 << 20
MAX_IN_FLIGHT = 64 << 20
WORKERS = 4
#: A read starting this close to where the previous one ended still counts as sequential (the kernel sends
#: neighbouring readahead requests out of order).
SLACK = 2 * CHUNK

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_in_flight = 0
_sources: weakref.WeakSet = weakref.WeakSet()
_quiet: contextvars.ContextVar[bool] = contextvars.ContextVar("ckptfs_readahead_quiet", default=False)


@contextlib.contextmanager
def quiet():
    """No read-ahead for reads inside (header reads while a checkpoint is opened: no thread may start
    before a mount forks its daemon, and the header reader grows its reads itself)."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="ckptfs-remote-ahead")
        return _pool


def _reserve(nbytes: int) -> bool:
    global _in_flight
    with _pool_lock:
        if _in_flight + nbytes > MAX_IN_FLIGHT:
            return False
        _in_flight += nbytes
        return True


def _release(nbytes: int) -> None:
    global _in_flight
    with _pool_lock:
        _in_flight = max(0, _in_flight - nbytes)


def _after_fork_in_child() -> None:
    """The parent's worker threads and their fetches are gone in the child: forget them, and fail the
    flights they would have finished so readers fetch those chunks themselves instead of waiting."""
    global _pool, _in_flight, _pool_lock
    _pool, _in_flight, _pool_lock = None, 0, threading.Lock()
    for source in list(_sources):
        source_flights = getattr(source, "_inflight", {})
        source._lock = threading.Lock()
        for index in list(source_flights):
            source._finish(index, None, RuntimeError("fetch interrupted by fork"))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class ReadAhead:
    """Sequential detection and background fetches for one remote source."""

    def __init__(self, source):
        self._source = source
        self._lock = threading.Lock()
        self._next = -1
        self._streak = 0
        self._window = 0
        self._frontier = 0  # chunks below this are fetched or claimed by read-ahead already
        _sources.add(source)

    def observe(self, offset: int, size: int) -> None:
        """Note a read; when it continues a sequential run, fetch ahead of it."""
        if _quiet.get():
            return
        end = offset + size
        with self._lock:
            sequential = self._next >= 0 and abs(offset - self._next) <= SLACK
            self._next = end
            if not sequential:
                self._streak, self._window = 0, 0
                return
            self._streak += 1
            if self._streak < 2:
                return
            self._window = min(MAX_WINDOW, max(MIN_WINDOW, self._window * 2))
            reader = (end - 1) // CHUNK + 1
            frontier = max(self._frontier, reader)
            window = self._window // CHUNK
            if frontier - reader > window // 2:
                return
            last = min(-(-self._source.size // CHUNK), reader + window)
            self._frontier = max(frontier, last)
        if last > frontier:
            self.prefetch(frontier, last)

    def prefetch(self, c0: int, c1: int) -> None:
        """Fetch chunks [c0, c1) in the background, as pieces of at most PIECE bytes (best effort)."""
        if _quiet.get():
            return
        step = max(1, PIECE // CHUNK)
        for first in range(c0, c1, step):
            last = min(c1, first + step)
            nbytes = (last - first) * CHUNK
            if not _reserve(nbytes):
                return
            runs = self._source.claim(first, last)
            if not runs:
                _release(nbytes)
                continue
            try:
                _executor().submit(self._fetch, runs, nbytes)
            except RuntimeError:  # interpreter shutting down
                _release(nbytes)
                for start, stop in runs:
                    for i in range(start, stop):
                        self._source._finish(i, None, RuntimeError("read-ahead not started"))
                return

    def _fetch(self, runs: list[tuple[int, int]], nbytes: int) -> None:
        try:
            deadline = time.monotonic() + self._source.options.timeout
            for start, stop in runs:
                try:
                    self._source._fetch_chunks(start, stop, deadline)
                except Exception as exc:  # noqa: BLE001 - a reader will fetch these itself, with its own retries
                    log.debug("read-ahead of %s chunks %d..%d failed: %s", self._source.name, start, stop, exc)
        finally:
            _release(nbytes)
