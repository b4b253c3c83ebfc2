"""The warm-up's mechanism: every chunk of a set of remote files that their store lacks, fetched at link speed.

``ckptfs prefetch SRC --cache-dir DIR`` and a mount's ``--prefetch`` run it (through
``ckptfs.sources.remote.warmup``, which hands it the files), so that a later mount or ``ckptfs.open`` with the
same ``--cache-dir`` reads every tensor (and every header byte) without a request for bytes. What it asks of
a file and its store is declared here (:class:`WarmFile`): this module imports neither the sources nor the
cache, and the checks that need them (the fit in ``--cache-dir-size``, the room on the file system, the lines
a full store is reported in) are the adapter's.

How it is built:

- **The worker pools, the origin's limit.** Pieces of chunks are claimed on the file (``WarmFile.claim``: a
  reader of a claimed chunk waits for the piece instead of fetching it again) and run as ``fetch`` jobs on
  the worker pools of the files' runtime (``ckptfs.workers.scheduler.WORKERS``), exactly as read-ahead's are: each
  piece holds one slot of the origin's adaptive in-flight limit (``ckptfs.ahead.limits``: grown while
  throughput grows, up to 64, halved on 429/503) and is ``ckptfs.ahead.fetch.piece_bytes(limit)`` long (the
  fetch budget shared by the requests in flight), and all of it counts within read-ahead's
  ``FETCH_BUDGET``. No thread pool of its own. A warm-up always wants more than the limit, so its epochs are
  the ones the limit learns from: many ranges in flight, as many as the origin rewards. When no slot or no
  budget is free, the next piece is started by the worker of the next piece that lands, once that piece's
  bytes are released (the scheduler's ``then``; ``_Dispatch``), or by the calling thread's poll when others
  hold the slots. A mount's background warm-up takes at most half of the origin's slots and half the fetch
  budget (``share``), leaving the rest to its readers' read-ahead.
- **The last round spread.** Behind an origin that caps each request, pieces of one size started as slots
  free up end one round after another, and the last round is as slow as a whole piece. Once what is left is
  less than a round (the limit's slots of whole pieces), the rest is split over the limit's slots once, in
  pieces of one size (at least ``MIN_PIECE``): the warm-up ends on smaller requests landing together, one
  per slot. Split again at each start, as the pieces start one by one, they shrank to ``MIN_PIECE``, twice
  as many as the slots, and more requests cost more time behind the capped origin of docs/remote.md.
- **Resumable.** Only chunks the store lacks are fetched (``WarmFile.unstored_chunks``).
- **Never a silent gap.** A piece that fails ends the warm-up with that failure (pieces in flight finish,
  none are started). After the last piece every chunk is checked to be in the store: one that is not is an
  error too (``WarmFile.unstored_error``); so is a store that stops taking bytes (``WarmFile.store_trouble``).
- **Readers' fetches count.** A chunk a reader's fetch (its read-ahead) has claimed is left to it, and a
  pass's end waits for such fetches to land (up to the file's ``timeout``) before it looks for what the
  store still lacks: a mount's background warm-up beside a streaming reader would otherwise call the chunks
  on their way missing.

:func:`fetch_missing` runs in the caller's thread and fills a :class:`WarmupReport`; a ``stop`` event ends it
early (the pieces in flight finish). :class:`BackgroundWarmup` runs a warm-up on a thread for a mount,
logging its progress and outcome, and stops on unmount.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ckptfs.ahead.fetch import FETCH_BUDGET, MIN_PIECE, piece_bytes
from ckptfs.ahead.limits import HeldSlot, OriginLimit
from ckptfs.core.errors import CheckpointError
from ckptfs.util.sizes import format_size
from ckptfs.workers.scheduler import Scheduler

log = logging.getLogger(__name__)

#: How long to wait for room in the budget when none of this warm-up's own pieces is in flight.
ROOM_POLL_S = 0.02
#: Passes over the files: a chunk missing after the first (evicted, or a store write that failed) is
#: fetched once more before it is reported.
PASSES = 2
#: How often a wait for others' fetches of the chunks a pass left to them looks at the stop event.
LANDED_POLL_S = 0.1

Run = tuple[int, int]
#: A count of bytes that landed in the store, told as each piece lands (from worker threads).
Landed = Callable[[int], None]
#: ``progress(done, total)``: bytes in the store so far of the files' total.
Progress = Callable[[int, int], None]


class StopSignal(Protocol):
    """What ends a warm-up early (a ``threading.Event``): asked, never waited on."""

    def is_set(self) -> bool: ...


class Landing(Protocol):
    """A fetch under way elsewhere (``ckptfs.cache.flight.Flight``): set once it has ended."""

    @property
    def done(self) -> threading.Event: ...


class WarmFile(Protocol):
    """What a warm-up asks of one remote file and the store its chunks go to (``ckptfs.sources.remote.warmup``
    adapts a ``RemoteSource``): its name for logs and errors, size, chunk and largest piece (bytes), how long
    to wait for others' fetches of it, its origin's limit; the chunks the store lacks and the fetches of them
    under way; claiming, fetching into the store and abandoning runs of chunks; why the store takes no more
    bytes, and the line for chunks still missing at the end."""

    @property
    def name(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def chunk(self) -> int: ...

    @property
    def piece_bytes(self) -> int: ...

    @property
    def timeout(self) -> float: ...

    def origin_limit(self) -> OriginLimit: ...

    def workers(self) -> Scheduler:
        """The worker pools its pieces run on (its runtime's)."""
        ...

    def unstored_chunks(self) -> list[int]: ...

    def fetches_under_way(self, indexes: list[int]) -> Sequence[Landing]: ...

    def claim(self, c0: int, c1: int) -> list[Run]: ...

    def abandon(self, runs: list[Run], error: BaseException) -> None: ...

    def fetch_piece(self, runs: list[Run], slot: HeldSlot) -> Exception | None:
        """Fetch claimed ``runs`` into the store (not the readers' memory), ``slot`` given back once the body
        is in or the fetch ends; the failure, or None."""
        ...

    def store_trouble(self) -> str | None:
        """One line when the store takes no more bytes (its file system full...), else None."""
        ...

    def unstored_error(self, left: list[int]) -> str:
        """The line for chunks ``left`` not in the store after fetching."""
        ...


@dataclass
class WarmupReport:
    total: int = 0        # stored bytes of the remote files
    cached: int = 0       # of them, in the store before this run
    fetched: int = 0      # fetched by this run
    local: int = 0        # bytes of local files (skipped: their bytes are here)
    files: int = 0        # remote files
    seconds: float = 0.0
    stopped: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.stopped

    @property
    def rate(self) -> float:
        """Bytes per second fetched."""
        return self.fetched / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        parts = [f"fetched {format_size(self.fetched)} in {self.seconds:.1f} s ({self.rate / 1e6:.1f} MB/s)",
                 f"{format_size(self.cached)} already cached",
                 f"{self.files} remote file{'' if self.files == 1 else 's'} ({format_size(self.total)})"]
        if self.local:
            parts.append(f"{format_size(self.local)} local (not fetched)")
        if self.stopped:
            parts.append("stopped before the end")
        return "; ".join(parts)


@dataclass
class _File:
    file: WarmFile
    missing: list[int]


def _chunk_bytes(file: WarmFile, first: int, last: int) -> int:
    return min(file.size, last * file.chunk) - first * file.chunk


def fetch_missing(files: Sequence[tuple[WarmFile, list[int]]], report: WarmupReport, *,
                  stop: StopSignal | None = None, progress: Progress | None = None, share: float = 1.0) -> None:
    """Fetch the chunks ``missing`` of each file (found missing by the caller, which counted the rest as
    cached in ``report``), in passes, then check that the store holds every chunk; what landed and what
    failed go into ``report``. ``progress(done, total)``: called as pieces land (from worker threads).
    ``share``: the fraction of each origin's in-flight slots and of the fetch budget the warm-up may hold."""
    todo = [_File(file, missing) for file, missing in files]
    done = [report.cached]
    lock = threading.Lock()

    def landed(nbytes: int) -> None:
        with lock:
            done[0] += nbytes
            report.fetched += nbytes
            now = done[0]
        if progress is not None:
            progress(now, report.total)

    if progress is not None:
        progress(report.cached, report.total)
    for attempt in range(PASSES):
        if attempt:
            for f in todo:
                f.missing = _missing_once_landed(f.file, stop)
            if not any(f.missing for f in todo):
                break
            log.info("warm-up: %d chunks not in the store after the first pass: fetching them again",
                     sum(len(f.missing) for f in todo))
        _Dispatch(todo, report.errors, landed, stop, share).run()
        if report.errors or (stop is not None and stop.is_set()):
            break
    if stop is not None and stop.is_set():
        report.stopped = True
    elif not report.errors:
        for f in todo:
            left = _missing_once_landed(f.file, stop)
            if left:
                report.errors.append(f.file.unstored_error(left))


def _missing_once_landed(file: WarmFile, stop: StopSignal | None) -> list[int]:
    """The chunks the store lacks, once the fetches of them under way elsewhere have ended (a mount's readers'
    read-ahead: ``claim`` left those chunks to them, and they reach the store when they land), waiting up to
    the file's ``timeout``; a fetch that failed leaves its chunks missing, for the next pass to fetch."""
    missing = file.unstored_chunks()
    flights = file.fetches_under_way(missing) if missing else []
    if not flights:
        return missing
    end = time.monotonic() + file.timeout
    for flight in flights:
        while not flight.done.wait(LANDED_POLL_S):
            if time.monotonic() >= end or (stop is not None and stop.is_set()):
                return file.unstored_chunks()
    return file.unstored_chunks()


def _next_piece(missing: list[int], k: int, step: int) -> int:
    """The end (an index into the sorted ``missing``) of the piece starting at ``missing[k]``: contiguous
    chunks, at most ``step`` of them."""
    j = k + 1
    while j < len(missing) and j - k < step and missing[j] == missing[j - 1] + 1:
        j += 1
    return j


class _Dispatch:
    """One pass over the files' missing chunks, in file order: pieces are started by the calling thread and,
    as each lands, by the worker it ran on (the scheduler's ``then``: once the piece's bytes are released,
    its room is the next piece's). A single dispatching thread woken for every landed piece kept only 5 to 15
    of 32 allowed requests in flight on a 2-core machine (each start waited for that thread to be scheduled
    and to win the GIL). The calling thread starts the first pieces, then waits for the last to land, and asks
    again every ``ROOM_POLL_S`` while none of its own is in flight (the slots or the budget held by others: a
    mount's readers)."""

    def __init__(self, files: list[_File], errors: list[str], landed: Landed, stop: StopSignal | None,
                 share: float):
        self.files, self.errors, self.landed, self.stop, self.share = files, errors, landed, stop, share
        self.cap = max(max((f.file.chunk for f in files), default=1), int(FETCH_BUDGET * share))
        self._file = 0  # the cursor: the next piece starts at files[_file].missing[_k]
        self._k = 0
        self._running = 0  # this pass's pieces started and not yet landed
        self._left = sum(len(f.missing) for f in files)  # chunks of this pass not yet in a started piece
        self._last_round: int | None = None  # the last round's piece, in chunks, once it has begun
        self._lock = threading.Lock()  # the counters above (held briefly)
        self._idle = threading.Condition(self._lock)
        self._drain = threading.Lock()  # held by the one thread starting pieces: the cursor is its
        self._again = False  # another thread asked for a refill while one ran: it goes round once more

    def ended(self) -> bool:
        return bool(self.errors) or (self.stop is not None and self.stop.is_set())

    def run(self) -> None:
        while True:
            self.refill()
            with self._idle:
                if self._running == 0 and (self.ended() or self._file >= len(self.files)):
                    return
                self._idle.wait(ROOM_POLL_S if self._running == 0 else 1.0)

    def refill(self) -> None:
        """Start pieces at the cursor while the origin's limit and the budget have room. One thread does it at
        a time; one that finds another at it leaves a note and returns, and the one at it goes round again
        (32 workers whose pieces landed together queued on a lock here, a fifth of a warm-up's samples)."""
        self._again = True
        while self._again:
            if not self._drain.acquire(blocking=False):
                return  # the thread at it sees the note once it lets go
            try:
                self._again = False
                self._refill()
            finally:
                self._drain.release()

    def _refill(self) -> None:
        """Start pieces at the cursor (the thread holding ``_drain``)."""
        while self._file < len(self.files) and not self.ended():
            f = self.files[self._file]
            if self._k >= len(f.missing):
                self._file, self._k = self._file + 1, 0
                continue
            limit = f.file.origin_limit()
            chunk = f.file.chunk
            step = piece_bytes(limit.limit, f.file.piece_bytes, chunk) // chunk  # as the limit has grown by now
            # the last round spread over the limit's slots (the module docstring), its piece fixed when it
            # begins: sized again at each start (they start one by one, as earlier pieces land), the pieces
            # shrank to MIN_PIECE, twice as many requests as slots (a 242 MiB warm-up ended on 63 requests of
            # 1 MiB, each with its round trip, answer, store write and version check on the transfer's CPU)
            spread = max(MIN_PIECE // chunk, -(-self._left // limit.limit))
            if self._last_round is None and spread < step:
                self._last_round = spread
            if self._last_round is not None:
                step = min(step, self._last_round)
            j = _next_piece(f.missing, self._k, step)
            started = self._start(f, f.missing[self._k], f.missing[j - 1] + 1, limit)
            if started is None:
                return  # no slot or no room now: a landing piece (or the caller's poll) asks again
            self._left -= j - self._k
            self._k = j

    def _start(self, f: _File, first: int, last: int, limit: OriginLimit) -> bool | None:
        """Start the piece [first, last) of ``f`` (called by the thread refilling): True when started or when
        there is nothing to fetch (in memory, or on its way by a reader); None when no slot of the origin's limit or
        no room in the budget is free."""
        nbytes = (last - first) * f.file.chunk
        if self.share < 1.0 and limit.in_flight >= max(1, int(limit.limit * self.share)):
            return None  # a mount's warm-up leaves its readers' read-ahead the other slots
        if self._running >= 2 * limit.limit:
            return None  # a round of pieces past their bodies (waiting for a check or the store): no more yet
        workers = f.file.workers()
        if not workers.has_room(nbytes) or not limit.try_start():
            return None
        runs = f.file.claim(first, last)
        if not runs:
            limit.done()
            return True
        # the slot is given back once the piece's body is in (its bytes may still wait for a version check and
        # the store's write: the origin no longer works for it), and the next pieces started then
        piece = _Piece(f.file, runs, limit.held(then=self.refill), self.landed, self.errors, self.stop)
        with self._lock:
            self._running += 1
        if workers.submit("fetch", piece, nbytes, cap=self.cap, then=self._landed) is None:
            with self._lock:
                self._running -= 1
            limit.done()
            f.file.abandon(runs, RuntimeError("warm-up over budget"))
            return None
        return True

    def _landed(self) -> None:
        """A piece is done (its bytes released): start the next ones from here; wake the caller at the end."""
        with self._idle:
            self._running -= 1
        self.refill()
        with self._idle:
            if self._running == 0:
                self._idle.notify_all()


class _Piece:
    """One fetch job: claimed runs of one file into the store, counted when they land."""

    def __init__(self, file: WarmFile, runs: list[Run], slot: HeldSlot, landed: Landed,
                 errors: list[str], stop: StopSignal | None):
        self.file, self.runs, self.slot, self.landed = file, runs, slot, landed
        self.errors, self.stop = errors, stop

    def __call__(self) -> None:
        file = self.file
        try:
            if self.errors or (self.stop is not None and self.stop.is_set()):
                file.abandon(self.runs, RuntimeError("warm-up stopped"))  # queued when it ended: not fetched
                return
            error = file.fetch_piece(self.runs, self.slot)
        finally:
            self.slot.release()  # (given back once: by the fetch as its body came in, else here)
        if error is not None:
            self.errors.append(str(error))
            return
        self.landed(sum(_chunk_bytes(file, a, b) for a, b in self.runs))
        trouble = file.store_trouble()
        if trouble:  # these bytes were not kept, nor would any more be: end the warm-up now, not after it all
            if trouble not in self.errors:
                self.errors.append(trouble)

    def __repr__(self) -> str:
        return f"<warm-up {self.file.name} {self.runs}>"


class Target(Protocol):
    """What a background warm-up runs (``ckptfs.sources.remote.warmup``: one checkpoint's files): the warm-up
    itself, and what the store holds of the files once it has ended."""

    def warm(self, stop: StopSignal, progress: Progress, share: float) -> WarmupReport: ...

    def stored(self) -> int: ...


class BackgroundWarmup:
    """A warm-up on a thread for a mount (``--prefetch``), handed what it warms (a :class:`Target`, made on its
    thread): started once the mount answers, stopped on
    unmount (the pieces in flight finish, nothing new starts), its progress and outcome in the log. It takes
    at most ``share`` of each origin's slots and of the fetch budget, leaving the rest to the readers'
    read-ahead."""

    LOG_EVERY_S = 10.0

    def __init__(self, target: Callable[[], Target], name: str, share: float = 0.5):
        self.target = target  # called on the thread (files that cannot be had are the warm-up's failure)
        self.name = name
        self.share = share
        self.report: WarmupReport | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_log = 0.0
        self._progress_at = (0, 0)  # (bytes in the cache folder, of the remote files' total), as last told
        self._stored_at_end: int | None = None  # measured in the store once it has ended
        self._after: BackgroundWarmup | None = None  # the warm-up this one waits for (``start``)

    def start(self, after: BackgroundWarmup | None = None) -> BackgroundWarmup:
        """Start it; with ``after``, it waits for that one to end first (the checkpoints of a repository are
        warmed one after the other, each within the same share of the origin)."""
        self._after = after
        self._thread = threading.Thread(target=self._run, name="ckptfs-warmup", daemon=True)
        self._thread.start()
        return self

    @property
    def queued(self) -> bool:
        """Whether it is still waiting for the warm-up it was started after."""
        return self._after is not None and self.report is None and self.error is None

    def _progress(self, done: int, total: int) -> None:
        self._progress_at = (done, total)
        now = time.monotonic()
        if now - self._last_log >= self.LOG_EVERY_S:
            self._last_log = now
            log.info("warm-up of %s: %s of %s in the cache folder", self.name, format_size(done), format_size(total))

    def _run(self) -> None:
        after = self._after
        while after is not None and after.running and not self._stop.is_set():
            after._join(LANDED_POLL_S)
        self._after = None
        if self._stop.is_set():
            self.report = WarmupReport(stopped=True)
            log.info("warm-up of %s: stopped before it started", self.name)
            return
        log.info("warm-up of %s: started", self.name)
        target: Target | None = None
        try:
            target = self.target()
            self.report = target.warm(self._stop, self._progress, self.share)
        except CheckpointError as exc:
            self.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a daemon's background work never ends the mount
            self.error = f"{type(exc).__name__}: {exc}"
        try:
            self._stored_at_end = target.stored() if target is not None else 0
        except Exception:  # the figure for the stats; its lack leaves the last progress
            log.debug("warm-up of %s: the cache folder could not be measured", self.name, exc_info=True)
        report = self.report  # None only when it failed (the error set)
        if self.error is None and report is not None and report.errors:
            self.error = report.errors[0]
        if self.error is not None or report is None:
            log.warning("warm-up of %s failed: %s (reads fetch what they need)", self.name, self.error)
        elif not report.files:
            log.info("warm-up of %s: nothing to fetch (its files are local)", self.name)
        elif report.stopped:
            log.info("warm-up of %s: stopped (%s)", self.name, report.summary())
        else:
            log.info("warm-up of %s: done: %s", self.name, report.summary())

    def stop(self, timeout: float = 10.0) -> None:
        """End the warm-up: nothing new is fetched; waits up to ``timeout`` for the pieces in flight."""
        self._stop.set()
        self._join(timeout)

    def _join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def status(self) -> dict[str, Any]:
        """What the mount's stats show of it (``ckptfs stats MNT``): ``state`` (starting, running, done, stopped,
        failed), the bytes in the cache folder of the remote files' total, and once ended what this run
        fetched, in how long, and the error."""
        report, error = self.report, self.error
        if self._thread is None:
            state = "starting"
        elif self.queued:
            state = "queued"
        elif self.running:
            state = "running"
        elif error is not None:
            state = "failed"
        else:
            state = "stopped" if report is not None and report.stopped else "done"
        stored, total = self._progress_at  # while running: pieces landed (a failing store is found at once)
        if self._stored_at_end is not None and not self.running:
            stored = self._stored_at_end
        out: dict[str, Any] = {"state": state, "stored_bytes": stored, "total_bytes": total}
        if report is not None and not self.running:
            out.update(total_bytes=report.total, fetched_bytes=report.fetched, seconds=round(report.seconds, 1))
        if error is not None:
            out["error"] = error
        return out


def combined_status(warmups: dict[str, BackgroundWarmup]) -> dict[str, Any]:
    """What a repository mount's stats show of its checkpoints' warm-ups (``BackgroundWarmup.status`` each,
    by checkpoint name, under ``checkpoints``): their sums, and one state — running while one runs or waits
    its turn, else failed when one failed, else stopped or done."""
    each = {name: warmup.status() for name, warmup in warmups.items()}
    states = {status["state"] for status in each.values()}
    for state in ("running", "starting", "queued", "failed", "stopped"):
        if state in states:
            break
    else:
        state = "done"
    if state == "queued":
        state = "running"
    out: dict[str, Any] = {"state": state, "stored_bytes": sum(s["stored_bytes"] for s in each.values()),
                 "total_bytes": sum(s["total_bytes"] for s in each.values()), "checkpoints": each}
    errors = [f"{name}: {s['error']}" for name, s in each.items() if s.get("error")]
    if errors:
        out["error"] = errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
    return out
