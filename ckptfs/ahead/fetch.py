"""Remote read-ahead: a sequential reader's next bytes are already on their way when it asks for them, over as
many parallel ranges as the origin rewards.

Over a network each request costs a round trip, and an object store or CDN caps what one request carries
(tens of MB/s), so a reader that streams a file (``cat`` of a ``.raw``, ``np.load``, a model loader's 64 MiB
O_DIRECT reads) is as fast as the number of ranges in flight ahead of it. Each remote source watches its
own reads with the one sequential detector (``ckptfs.ahead.detect.SequentialRun``): once two reads in a row
continue where the previous ones reached, it fetches ahead of the reader in a window that doubles per
sequential read (1 MiB up to ``FETCH_BUDGET``) as pieces on the process's read-ahead scheduler (its ``fetch`` pool). How many pieces are in flight at once is the origin's
:class:`~ckptfs.ahead.limits.OriginLimit` (grown while throughput grows, halved on 429/503), shared by
every source on that origin; the piece size shrinks as the limit grows, so the bytes ahead stay within
``FETCH_BUDGET`` (``budget / limit``, between ``MIN_PIECE`` and the scheme's ``piece_bytes``). Every piece
that lands tops the window up again (``pump``), so the pipeline stays full while the reader waits on a
chunk instead of refilling only on the reader's next read.

A read elsewhere starts a new run and resets the window, so a random reader fetches only the chunks covering
its reads. Concurrent readers of one stream (the kernel's async direct-I/O requests, several FUSE threads)
arrive slightly out of order: a read within ``SLACK_READS`` read sizes of the run's end still continues it.
Memory stays bounded: the window never reaches past ``FETCH_BUDGET`` bytes ahead of the reader, fetched
chunks go into the shared chunk LRU (``ckptfs.sources.remote.store.chunks``, twice the budget), and the scheduler counts
everything in flight. From a fast origin the window is shorter: what the origin's measured speed asks for
(``OriginLimit.reach``), a few pieces where a piece takes milliseconds. And the chunks a stream's reader
has read past (by more than a late neighbouring request could be behind) leave the LRU at once: the reader
has them in the kernel's page cache, the ``--cache-dir`` store keeps its copy, and the pieces ahead reuse
their memory instead of faulting fresh pages in. The chunks are claimed, fetched and abandoned through the source's public ``claim`` /
``fetch_claimed`` / ``abandon``: a reader arriving at a chunk on its way waits for that fetch.

The block engine's own read-ahead calls ``advise`` on the stored bytes of the groups it will decode next;
that lands here too (``follow_advice``), under the same limit and budget. Advice away from the reader's window
(the files a reader in file order reaches next, advised once each) that finds no slot or no room waits, in
order and within ``FETCH_BUDGET``, and is started as slots free up: dropped, each of those files would be
fetched only when read, one round trip each. It is started only once the reader is within ``FETCH_BUDGET``
of it: the rest of the reader's tensor may be advised that far ahead already, and the two together filled
the chunk LRU (twice the budget) with bytes not yet read, whose oldest — the ones the reader reached next —
it then evicted (a ``cp`` of every ``.raw`` fetched bytes more than once and slowed to a fraction of the
origin's speed: docs/remote.md). A stream that a mount's handle tracks
is decided there, once (``ckptfs.ahead.detect``): its reads and advice come with ``decided`` set in
their scope (``ckptfs.core.reads.ReadScope``) and run no detection here, they only move the reader's position, and the window is what the handle advises (its decode
window's stored bytes, the rest of the tensor as one unit once it found the stream).

Threads are started only by reads ahead, never while a checkpoint's headers are read (its sources are opened
with ``RemoteOptions(read_ahead=False)`` then: a mount forks its daemon after the open), and a forked child (a
mount daemon, a DataLoader worker) starts with fresh pools (the scheduler's), and the fetches its parent had
under way fail over to their readers: threads do not survive ``fork``.
"""

from __future__ import annotations

import collections
import threading
from typing import Protocol

from ckptfs.ahead.detect import SequentialRun
from ckptfs.ahead.limits import HeldSlot, OriginLimit
from ckptfs.core.runtime import LIVE, Runtime
from ckptfs.workers.scheduler import WORKERS

MIN_WINDOW = 1 << 20
#: Bytes a source's read-ahead keeps ahead of its reader at most (in flight and landed, not yet read).
FETCH_BUDGET = 128 << 20
#: The smallest piece (one request) read-ahead asks for, however high the origin's limit climbs.
MIN_PIECE = 1 << 20
#: A read starting this close to where the previous one ended still counts as sequential, in chunks and in
#: read sizes (the kernel sends neighbouring requests out of order, and FUSE serves them on several threads).
SLACK_CHUNKS = 2
SLACK_READS = 16

Run = tuple[int, int]


class AheadOptions(Protocol):
    """What read-ahead reads of a source's options (``ckptfs.sources.remote.options.RemoteOptions``): whether
    it may fetch ahead at all (not while a checkpoint's headers are read: no thread may start then), and the
    runtime whose worker pools it fetches on."""

    @property
    def read_ahead(self) -> bool: ...

    @property
    def runtime(self) -> Runtime: ...


class Fetches(Protocol):
    """What read-ahead needs of the part below it, the file's chunks (``ckptfs.sources.remote.fetcher.
    ChunkFetcher``): its options, size, chunk and largest piece (bytes), whether its source is closed, its
    origin's in-flight limit, and claiming, fetching and abandoning runs of chunks. Declared here, so that
    read-ahead is handed the chunks it works on and imports neither the sources nor the cache."""

    size: int
    piece_bytes: int

    @property
    def options(self) -> AheadOptions: ...

    @property
    def chunk(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def origin_limit(self) -> OriginLimit: ...

    def claim(self, c0: int, c1: int) -> list[Run]: ...

    def fetch_claimed(self, runs: list[Run], memory: bool = True, slot: HeldSlot | None = None) -> Exception | None: ...

    def abandon(self, runs: list[Run], error: BaseException) -> None: ...

    def forget(self, c0: int, c1: int) -> None: ...

    def forget_fetches(self) -> None: ...




def piece_chunks(options: AheadOptions, limit: int, largest: int, chunk: int) -> int:
    """Chunks per piece a reader's long run is cut into for the scheduler (``handoff``) at an in-flight limit
    of ``limit``; 0 for a source without read-ahead (reading headers, before a mount forks its daemon: no
    thread may start)."""
    return piece_bytes(limit, largest, chunk) // chunk if options.read_ahead else 0


def piece_bytes(limit: int, largest: int, chunk: int) -> int:
    """One read-ahead request's size at an in-flight limit of ``limit``: the budget shared by the requests in
    flight, between ``MIN_PIECE`` and the scheme's ``largest``, in whole chunks of ``chunk`` bytes."""
    share = max(MIN_PIECE, min(largest, FETCH_BUDGET // max(1, limit)))
    return max(chunk, share - share % chunk)


class ReadAhead:
    """Sequential detection and background fetches for one remote source."""

    def __init__(self, source: Fetches) -> None:
        self._source = source  # the chunks below (``Fetches``): read-ahead holds nothing above it
        self._workers = source.options.runtime.get(WORKERS)
        self._chunk = source.chunk
        self._slack = SLACK_CHUNKS * source.chunk
        self._lock = threading.Lock()
        self._run = SequentialRun(self._slack)
        self._window = 0    # bytes wanted ahead of the reader
        self._reader = 0    # the chunk just past the run's furthest read
        self._frontier = 0  # chunks of the run below this are fetched or claimed already
        self._behind = 0    # chunks of the run below this are dropped from memory (``_passed``)
        # where the window stops: the file's end for a run detected here; for a stream decided above, the end
        # of what its handle advised (it decides what comes after: the next tensor's file, or nothing)
        self._until: int | None = None
        # advised runs of chunks away from the run (the files a reader in file order reaches next) that had no
        # slot or room when advised: started as slots free up, so advice given once is never lost
        self._wanted: collections.deque[Run] = collections.deque()
        source.options.runtime.get(LIVE).add(self)  # reset in a forked child (``in_child``)

    def in_child(self) -> None:
        """In a forked child: the parent's fetches are gone, so their readers fetch those chunks themselves
        instead of waiting (the worker pools forget their own workers themselves)."""
        self._source.forget_fetches()
        self._lock = threading.Lock()
        self._wanted.clear()  # the parent's advice: its readers are not the child's

    def observe(self, offset: int, size: int, decided: bool = False) -> None:
        """Note a read; when it continues a sequential run, fetch ahead of it. A read of a stream ``decided``
        above (a mount's handle: ``ckptfs.ahead.detect``) is not judged again here: it only moves the
        reader on, and what is fetched ahead of it is what that handle advises (``follow_advice``)."""
        if not self._source.options.read_ahead:
            return
        if decided:
            self._follow(offset, size)
            return
        with self._lock:
            streak = self._run.observe(offset, size, max(self._slack, SLACK_READS * size))
            reader = -(-self._run.end // self._chunk)
            if streak == 0:  # a new run: forget the old one's window and frontier
                self._window = 0
                self._reader = self._frontier = reader
                self._behind = offset // self._chunk  # (the run's own chunks only: those of its first read on)
                return
            self._reader = max(self._reader, reader)
            if streak < 2:
                return
            self._until = None
            # the window grows to the whole budget, so the origin's limit, not the window, is what binds
            # (and a limit that binds is one that learns: limit.py judges only epochs that wanted more)
            self._window = min(FETCH_BUDGET, max(MIN_WINDOW, self._window * 2))
            dropped = self._passed(self._late(size))
        self._drop(dropped)
        self.pump()

    def _follow(self, offset: int, size: int) -> None:
        """The reader of a stream decided above moved on: the window follows it (a read outside the window
        drops it, for the handle advises again where it finds a stream) and is topped up."""
        with self._lock:
            reader = -(-(offset + size) // self._chunk)
            # the kernel's neighbouring requests of one stream arrive out of order, and one that lands a few
            # reads behind must not drop the window (the handle advises once per stream: a dropped window
            # stays dropped, the stream fetches only what each read asks for)
            behind = self._late(size)
            if self._reader - behind <= offset // self._chunk <= self._reader + self._window // self._chunk:
                self._reader = max(self._reader, reader)
            else:
                self._window = 0
                self._reader = self._frontier = self._until = reader
                self._behind = offset // self._chunk
            dropped = self._passed(behind)
        self._drop(dropped)
        self.pump()

    def _late(self, size: int) -> int:
        """How many chunks behind its reader a late request of a stream of ``size``-byte reads may land:
        ``SLACK_READS`` reads, a request counted as at least 1 MiB (the kernel's largest: the small last request
        of a kernel read-ahead lands behind too)."""
        return SLACK_READS * max(size, MIN_WINDOW) // self._chunk

    def _passed(self, behind: int) -> Run:
        """The run's chunks its reader is more than ``behind`` chunks past and that are still in memory (called
        under the lock): a neighbouring request of the stream that arrives late is never that far behind."""
        start, stop = self._behind, max(self._behind, self._reader - behind)
        self._behind = stop
        return start, stop

    def _drop(self, run: Run) -> None:
        """Drop a stream's chunks its reader has read past from memory (``Fetches.forget``): they were fetched
        for that reader, which has them in the kernel's page cache now, so the memory goes to the pieces
        ahead of it instead of fresh pages (a page fault each 4 KiB: a quarter of the daemon's CPU in a fast
        stream that kept every chunk, docs/performance.md)."""
        if run[1] > run[0]:
            self._source.forget(*run)

    def pump(self) -> None:
        """Start pieces at the run's frontier while the window, the origin's limit and the budget allow; then,
        with what room is left, the advised runs still waiting (``follow_advice``)."""
        if self._source.closed:
            return
        if self._pump_window():
            self._pump_wanted()

    def _pump_window(self) -> bool:
        """The window's pieces; whether room is left for the advised runs waiting."""
        limit = self._source.origin_limit()
        chunks = -(-self._source.size // self._chunk)
        while True:
            with self._lock:
                frontier = max(self._frontier, self._reader)
                last = chunks if self._until is None else min(chunks, self._until)
                piece = piece_bytes(limit.limit, self._source.piece_bytes, self._chunk) // self._chunk
                ahead = min(self._window, limit.reach(piece * self._chunk, FETCH_BUDGET)) // self._chunk
                end = min(last, self._reader + ahead)
                take = min(piece, end - frontier)
                # a whole piece; or what is left of the window's room when that is most of it; or the file's
                # end; or the end of what a stream's handle advised once its reader is near it (further off,
                # the handle's next advice usually extends it: a reader in file order is advised the small
                # files ahead of it one by one, and these bytes then go out as whole pieces, not one each)
                short_ok = (end == chunks or take >= ahead // 2
                            or (end == last and frontier - self._reader < piece))
                if take <= 0 or (take < piece and not short_ok):
                    return True
                if not self._workers.has_room(take * self._chunk) or not limit.try_start():
                    return False
                self._frontier = frontier + take
            if not self._start(frontier, frontier + take, limit):
                with self._lock:  # not started: ask again from there on a later read
                    self._frontier = min(self._frontier, frontier)
                return False

    def _pump_wanted(self) -> None:
        """Start pieces of the advised runs waiting, oldest first, while the limit and the budget have room and
        the run is within ``FETCH_BUDGET`` of the reader. A run the reader has passed is dropped (its bytes were
        read, or are no longer ahead)."""
        limit = self._source.origin_limit()
        while True:
            with self._lock:
                while self._wanted and self._wanted[0][1] <= self._reader:
                    self._wanted.popleft()
                if not self._wanted:
                    return
                c0, c1 = self._wanted[0]
                step = piece_bytes(limit.limit, self._source.piece_bytes, self._chunk) // self._chunk
                if c0 >= self._reader + limit.reach(step * self._chunk, FETCH_BUDGET) // self._chunk:
                    return  # out of reach: started once the reader comes within it (module docstring)
                last = min(c1, c0 + step)
                if not self._workers.has_room((last - c0) * self._chunk) or not limit.try_start():
                    return
                if last < c1:
                    self._wanted[0] = (last, c1)
                else:
                    self._wanted.popleft()
            if not self._start(c0, last, limit):
                with self._lock:  # refused: the run waits again, in front
                    self._wanted.appendleft((c0, last))
                return

    def follow_advice(self, c0: int, c1: int, decided: bool = False) -> None:
        """Fetch chunks [c0, c1) in the background, as pieces under the origin's limit (best effort). Bytes
        that continue the reader's run (a tensor's rest, advised as one unit when its stream is found) widen
        the run's window to cover them, so ``pump`` keeps fetching them as pieces land; ``decided``: advised by
        the layer that decides the stream (its window ends where this advice does)."""
        if not self._source.options.read_ahead or self._source.closed:
            return
        with self._lock:
            reader = self._reader
            # advice for bytes at or ahead of the run's reader, within the budget's reach (the mount's decode
            # window and the rest of a tensor start a little ahead of where the source has read)
            continues = ((self._run.end >= 0 or decided)
                         and reader - SLACK_CHUNKS <= c0 <= reader + FETCH_BUDGET // self._chunk)
            if continues:
                self._window = max(self._window, min(FETCH_BUDGET, (c1 - reader) * self._chunk))
                if decided:
                    self._until = c1 if self._until is None else max(self._until, c1)
            else:
                self._want(c0, c1)
        self.pump()

    def _want(self, c0: int, c1: int) -> None:
        """Queue an advised run away from the reader's window (called under the lock), within ``FETCH_BUDGET``
        of runs waiting: advice past that is dropped (the handle advises at most that much ahead)."""
        waiting = sum(b - a for a, b in self._wanted)
        room = FETCH_BUDGET // self._chunk - waiting
        if room <= 0:
            return
        c1 = min(c1, c0 + room)
        if self._wanted and self._wanted[-1][1] >= c0 and self._wanted[-1][0] <= c0:
            a, b = self._wanted[-1]
            self._wanted[-1] = (a, max(b, c1))
        else:
            self._wanted.append((c0, c1))

    def _start(self, c0: int, c1: int, limit: OriginLimit) -> bool:
        """Claim [c0, c1) and fetch it on the scheduler, holding one of ``limit``'s slots until it lands;
        False when the scheduler refused it (the slot given back, the claims abandoned)."""
        runs = self._source.claim(c0, c1)
        if not runs:
            limit.done()
            return True  # all there or on its way already

        # the slot is given back when the body is in, and the next piece started then: a version check that
        # the landed bytes still wait for does not keep the origin idle
        slot = limit.held(then=self.pump)

        def job() -> None:
            try:
                self._source.fetch_claimed(runs, slot=slot)
            finally:
                slot.release()

        nbytes = sum(stop - start for start, stop in runs) * self._chunk
        # the window topped up once the piece's bytes are released: its room is the next piece's
        if self._workers.submit("fetch", job, nbytes, cap=FETCH_BUDGET, then=self.pump) is None:
            limit.done()
            self._source.abandon(runs, RuntimeError("read-ahead over budget"))
            return False
        return True
