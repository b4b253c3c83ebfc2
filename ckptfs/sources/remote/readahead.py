"""Remote read-ahead: a sequential reader's next bytes are already on their way when it asks for them.

Over a network each request costs a round trip, so a reader that streams a file (``cat`` of a ``.npy``,
``np.load``, a model loader) would otherwise wait for one round trip per read. Each remote source watches
its own reads: once two reads in a row continue where the previous one ended, it fetches ahead of the reader
in a window that doubles per sequential read (1 MiB up to ``MAX_WINDOW``), as several requests of ``PIECE``
bytes in flight at once on the process's read-ahead scheduler (``ckptfs.readahead``: its ``fetch`` pool,
its one byte budget). A read elsewhere resets the window, so a random reader fetches only the chunks
covering its reads. Memory stays bounded: fetched chunks go into the shared chunk LRU (bounded), and the
bytes in flight never exceed the scheduler's budget. The stream is recognized by the one sequential detector
(``ckptfs.readahead.SequentialRun``); the chunks are claimed, fetched and abandoned through the source's
public ``claim`` / ``fetch_claimed`` / ``abandon``.

The block engine's own read-ahead calls ``advise`` on the stored bytes of the groups it will decode next;
that lands here too (``prefetch``), so a decoding stream and a raw stream are both fed ahead.

Threads are started only by reads ahead, never while a checkpoint's headers are read (its sources are opened
with ``RemoteOptions(read_ahead=False)`` then: a mount forks its daemon after the open), and a forked child (a mount
daemon, a DataLoader worker) starts with fresh pools (the scheduler's), and the fetches its parent had under
way fail over to their readers: threads do not survive ``fork``.
"""

from __future__ import annotations

import os
import threading
import weakref

from ckptfs.cache.chunks import CHUNK
from ckptfs.readahead import SCHEDULER, SequentialRun

MIN_WINDOW = 1 << 20
MAX_WINDOW = 32 << 20
PIECE = 8 << 20
#: A read starting this close to where the previous one ended still counts as sequential (the kernel sends
#: neighbouring readahead requests out of order).
SLACK = 2 * CHUNK

_sources: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """The parent's fetches are gone in the child: their readers fetch those chunks themselves instead of
    waiting (the scheduler forgets its own workers itself)."""
    for source in list(_sources):
        source.forget_fetches()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class ReadAhead:
    """Sequential detection and background fetches for one remote source."""

    def __init__(self, source):
        self._source = source
        self._lock = threading.Lock()
        self._run = SequentialRun(SLACK)
        self._window = 0
        self._frontier = 0  # chunks below this are fetched or claimed by read-ahead already
        _sources.add(source)

    def observe(self, offset: int, size: int) -> None:
        """Note a read; when it continues a sequential run, fetch ahead of it."""
        if not self._source.options.read_ahead:
            return
        end = offset + size
        with self._lock:
            streak = self._run.observe(offset, size)
            if streak == 0:
                self._window = 0
                return
            if streak < 2:
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
        if not self._source.options.read_ahead:
            return
        step = max(1, PIECE // CHUNK)
        for first in range(c0, c1, step):
            last = min(c1, first + step)
            if not SCHEDULER.has_room((last - first) * CHUNK):
                return  # over budget: a later read asks again
            runs = self._source.claim(first, last)
            if not runs:
                continue
            nbytes = sum(stop - start for start, stop in runs) * CHUNK
            if SCHEDULER.submit("fetch", lambda runs=runs: self._source.fetch_claimed(runs), nbytes) is None:
                self._source.abandon(runs, RuntimeError("read-ahead over budget"))
                return
