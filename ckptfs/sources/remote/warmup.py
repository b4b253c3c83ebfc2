"""Warm-up: every stored byte of a checkpoint's remote files fetched into the ``--cache-dir`` store, at link speed.

``ckptfs prefetch SRC --cache-dir DIR`` and a mount's ``--prefetch`` run this, so that a later mount or
``ckptfs.open`` with the same ``--cache-dir`` reads every tensor (and every header byte) without a request
for bytes: only the one-byte probe each file's open sends to learn its size and identity.

How it is built:

- **The one scheduler, the origin's limit.** Pieces of chunks are claimed on the source
  (``RemoteSource.claim``: a reader of a claimed chunk waits for the piece instead of fetching it again)
  and run as ``fetch`` jobs on the process's read-ahead scheduler (``ckptfs.workers.scheduler.SCHEDULER``), exactly
  as read-ahead's are: each piece holds one slot of the origin's adaptive in-flight limit
  (``RemoteSource.origin_limit``, ``ckptfs.ahead.limits``: grown while throughput grows, up to 64,
  halved on 429/503) and is ``ckptfs.ahead.fetch.piece_bytes(limit)`` long (the fetch budget shared by the requests
  in flight), and all of it counts within read-ahead's ``FETCH_BUDGET``. No thread pool of its own. A
  warm-up always wants more than the limit, so its epochs are the ones the limit learns from: many ranges
  in flight, as many as the origin rewards. When no slot or no budget is free, the next piece is started
  by the worker of the next piece that lands, once that piece's bytes are released (the scheduler's
  ``then``; ``_Dispatch``), or by the calling thread's poll when others hold the slots. A mount's background
  warm-up takes at most half of the origin's slots and half the fetch budget (``share``), leaving the rest
  to its readers' read-ahead.
- **The last round spread.** Behind an origin that caps each request, pieces of one size started as slots
  free up end one round after another, and the last round is as slow as a whole piece. Once what is left is
  less than a round (the limit's slots of whole pieces), the rest is split over the limit's slots once, in
  pieces of one size (at least ``MIN_PIECE``): the warm-up ends on smaller requests landing together, one
  per slot. Split again at each start, as the pieces start one by one, they shrank to ``MIN_PIECE``, twice
  as many as the slots, and more requests cost more time behind the capped origin of docs/remote.md.
- **Resumable.** Only chunks the store lacks are fetched (``RemoteSource.unstored_chunks``): a second run
  after an interrupted one fetches the rest, a run after a complete one fetches nothing.
- **Bounded by ``--cache-dir-size``.** The store deletes its least recently used entries past its bound, so a
  checkpoint bigger than the bound would evict its own first chunks while its last ones arrive. Before any
  fetch, the entries the files need (the whole files, with each entry's header) are compared with what the
  store keeps after a prune (90 % of the bound): a checkpoint that does not fit is refused with one line
  (:class:`WarmupError`), nothing fetched.
- **Never a wrong byte, never a silent gap.** Bytes go through the source's own fetch (deadline, retries,
  identity and length checks) into the store's authenticated entries. A piece that fails after its retries
  ends the warm-up with that failure (pieces in flight finish, none are started); with mirrors, the piece
  is read through the mirror wrapper first (its failover). After the last piece every chunk is checked to
  be in the store: one that is not (a full disk, entries evicted for other processes') is an error too.
- **Readers' fetches count.** A chunk a reader's fetch (its read-ahead) has claimed is left to it, and a
  pass's end waits for such fetches to land (up to ``--timeout``) before it looks for what the store still
  lacks: a mount's background warm-up beside a streaming reader would otherwise call the chunks on their
  way missing.
- **Local files** hold their bytes already: they are counted as local and skipped.

``warm(sources, ...)`` runs in the caller's thread and returns a :class:`WarmupReport`; a ``stop`` event
ends it early (the pieces in flight finish). :class:`BackgroundWarmup` runs it on a thread for a mount,
logging its progress and outcome, and stops on unmount.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ckptfs.cache.chunks import CHUNK, STORED_RUN
from ckptfs.cache.disk import FULL, NOT_WRITABLE
from ckptfs.cache.entry import HEADER_SIZE
from ckptfs.cache.sparse_store import BELOW_FLOOR, DEFAULT_MIN_FREE, NAMESPACE, folder_bytes, free_and_floor
from ckptfs.core.errors import CheckpointError
from ckptfs.workers.scheduler import SCHEDULER
from ckptfs.ahead.limits import HeldSlot, OriginLimit
from ckptfs.sources.base import ByteSource, Mirrored, WrapsSource
from ckptfs.sources.pool import SourcePool
from ckptfs.ahead.fetch import FETCH_BUDGET, MIN_PIECE, piece_bytes
from ckptfs.sources.remote.transport import RemoteSource
from ckptfs.util.redact import public_name
from ckptfs.util.sizes import format_size

log = logging.getLogger(__name__)

#: The store keeps at most this fraction of --cache-dir-size after a prune (``ckptfs.cache.disk.LOW_WATER``).
FITS_FRACTION = 0.9
#: How long to wait for room in the budget when none of this warm-up's own pieces is in flight.
ROOM_POLL_S = 0.02
#: Passes over the files: a chunk missing after the first (evicted, or a store write that failed) is
#: fetched once more before it is reported.
PASSES = 2
#: How often a wait for others' fetches of the chunks a pass left to them looks at the stop event.
LANDED_POLL_S = 0.1


class WarmupError(CheckpointError):
    """The warm-up cannot run, or a piece failed: one line naming the file."""


class StopSignal(Protocol):
    """What ends a warm-up early (a ``threading.Event``): asked, never waited on."""

    def is_set(self) -> bool: ...


class OpenedCheckpoint(Protocol):
    """What a warm-up reads of an opened checkpoint (``ckptfs.checkpoint.Checkpoint``, a layer above this
    one): its files' names and the pool that opens them as the checkpoint reads them."""

    @property
    def files(self) -> Sequence[str]: ...

    @property
    def passthrough(self) -> Mapping[str, str]: ...

    @property
    def sources(self) -> SourcePool: ...


#: A count of bytes that landed in the store, told as each piece lands (from worker threads).
Landed = Callable[[int], None]


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
    remote: RemoteSource
    wrapper: ByteSource   # what reads go through (mirrors): a failed piece is read through it once more
    missing: list[int]


def remote_of(source: ByteSource) -> RemoteSource | None:
    """The remote source under wrappers (``WrapsSource``: a manifest's checked reads, mirrors), or None for a
    local file."""
    seen = 0
    while not isinstance(source, RemoteSource) and seen < 8:
        if not isinstance(source, WrapsSource):
            return None
        source = source.wrapped
        seen += 1
    return source if isinstance(source, RemoteSource) else None


def checkpoint_sources(ck: OpenedCheckpoint) -> list[ByteSource]:
    """Every file of an opened checkpoint as the checkpoint reads it (its pool's sources, wrappers included):
    its own files (every shard, headers included) and the model folder's other files (config.json...)."""
    paths = list(dict.fromkeys([*ck.files, *ck.passthrough.values()]))
    return [ck.sources.get(path) for path in paths]


def _entries_bytes(remote: RemoteSource) -> int:
    """What a whole file takes in the store: each chunk an entry with its header."""
    return remote.size + -(-remote.size // CHUNK) * HEADER_SIZE


def _next_piece(missing: list[int], k: int, step: int) -> int:
    """The end (an index into the sorted ``missing``) of the piece starting at ``missing[k]``: contiguous
    chunks, at most ``step`` of them."""
    j = k + 1
    while j < len(missing) and j - k < step and missing[j] == missing[j - 1] + 1:
        j += 1
    return j


def _chunk_bytes(remote: RemoteSource, first: int, last: int) -> int:
    return min(remote.size, last * CHUNK) - first * CHUNK


def warm(sources: Iterable[ByteSource], *, stop: StopSignal | None = None,
         progress: Callable[[int, int], None] | None = None, share: float = 1.0,
         cached_before: dict[str, int] | None = None) -> WarmupReport:
    """Fetch every chunk of ``sources`` the ``--cache-dir`` store lacks (see the module docstring).
    ``progress(done, total)``: bytes in the store so far of the remote files' total, called as pieces land
    (from worker threads). ``share``: the fraction of each origin's in-flight slots and of the fetch budget
    the warm-up may hold (a mount leaves the rest to its readers' read-ahead). ``cached_before``: for files
    an :class:`EarlyWarmup` fetched already, by content identity, the bytes the store held before it (what
    the report counts as cached for them). WarmupError when it cannot start (no store, a checkpoint bigger
    than the store); failures while fetching are in the report's ``errors``."""
    started = time.monotonic()
    report = WarmupReport()
    files: list[_File] = []
    for source in sources:
        remote = remote_of(source)
        if remote is None:
            report.local += int(source.size)
            continue
        if not remote.stores_chunks:
            why = ("no --cache-dir store could be used" if remote.options.cache_dir else "no --cache-dir given")
            if remote.options.cache_dir and "unvalidated-" in remote.content_id():
                why = "the server sends no ETag or Last-Modified, so its bytes are never kept"
            raise WarmupError(remote.name, None, f"cannot be warmed up: {why}")
        files.append(_File(remote, source, []))
        report.files += 1
        report.total += remote.size
    need = sum(_entries_bytes(f.remote) for f in files)
    if files:
        bound = files[0].remote.options.cache_dir_size
        if need > bound * FITS_FRACTION:
            raise WarmupError(files[0].remote.options.cache_dir, None,
                              f"the checkpoint's {format_size(report.total)} need {format_size(need)} in the "
                              f"cache folder, more than --cache-dir-size {format_size(bound)} keeps "
                              f"({FITS_FRACTION:.0%} of it, after a prune): give a larger --cache-dir-size")
    for f in files:
        f.missing = f.remote.unstored_chunks()
        stored = f.remote.size - sum(_chunk_bytes(f.remote, i, i + 1) for i in f.missing)
        report.cached += (cached_before or {}).get(f.remote.content_id(), stored)
    check_room([f.remote for f in files],
               sum(_chunk_bytes(f.remote, i, i + 1) for f in files for i in f.missing))
    for f in files:  # a store that takes nothing now (an earlier warm-up of this process found it full)
        trouble = f.remote.store_trouble() if f.missing else None
        if trouble:
            report.errors.append(_store_error(f.remote, trouble))
            report.seconds = time.monotonic() - started
            return report
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
            for f in files:
                f.missing = _missing_once_landed(f.remote, stop)
            if not any(f.missing for f in files):
                break
            log.info("warm-up: %d chunks not in the store after the first pass: fetching them again",
                     sum(len(f.missing) for f in files))
        _Dispatch(files, report.errors, landed, stop, share).run()
        if report.errors or (stop is not None and stop.is_set()):
            break
    if stop is not None and stop.is_set():
        report.stopped = True
    elif not report.errors:
        for f in files:
            left = _missing_once_landed(f.remote, stop)
            if left:
                report.errors.append(_unstored_error(f.remote, left))
    report.seconds = time.monotonic() - started
    return report


def _missing_once_landed(remote: RemoteSource, stop: StopSignal | None) -> list[int]:
    """The chunks the store lacks, once the fetches of them under way elsewhere have ended (a mount's readers'
    read-ahead: ``claim`` left those chunks to them, and they reach the store when they land), waiting up to
    ``--timeout``; a fetch that failed leaves its chunks missing, for the next pass to fetch."""
    missing = remote.unstored_chunks()
    flights = remote.fetches_under_way(missing) if missing else []
    if not flights:
        return missing
    end = time.monotonic() + remote.options.timeout
    for flight in flights:
        while not flight.done.wait(LANDED_POLL_S):
            if time.monotonic() >= end or (stop is not None and stop.is_set()):
                return remote.unstored_chunks()
    return remote.unstored_chunks()


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
        self.cap = max(CHUNK, int(FETCH_BUDGET * share))
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
            limit = f.remote.origin_limit()
            step = piece_bytes(limit.limit, f.remote.piece_bytes, CHUNK) // CHUNK  # as the limit has grown by now
            # the last round spread over the limit's slots (the module docstring), its piece fixed when it
            # begins: sized again at each start (they start one by one, as earlier pieces land), the pieces
            # shrank to MIN_PIECE, twice as many requests as slots (a 242 MiB warm-up ended on 63 requests of
            # 1 MiB, each with its round trip, answer, store write and version check on the transfer's CPU)
            spread = max(MIN_PIECE // CHUNK, -(-self._left // limit.limit))
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
        nbytes = (last - first) * CHUNK
        if self.share < 1.0 and limit.in_flight >= max(1, int(limit.limit * self.share)):
            return None  # a mount's warm-up leaves its readers' read-ahead the other slots
        if self._running >= 2 * limit.limit:
            return None  # a round of pieces past their bodies (waiting for a check or the store): no more yet
        if not SCHEDULER.has_room(nbytes) or not limit.try_start():
            return None
        runs = f.remote.claim(first, last)
        if not runs:
            limit.done()
            return True
        # the slot is given back once the piece's body is in (its bytes may still wait for a version check and
        # the store's write: the origin no longer works for it), and the next pieces started then
        piece = _Piece(f, runs, limit.held(then=self.refill), self.landed, self.errors, self.stop)
        with self._lock:
            self._running += 1
        if SCHEDULER.submit("fetch", piece, nbytes, cap=self.cap, then=self._landed) is None:
            with self._lock:
                self._running -= 1
            limit.done()
            f.remote.abandon(runs, RuntimeError("warm-up over budget"))
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

    def __init__(self, file: _File, runs: list[tuple[int, int]], slot: HeldSlot, landed: Landed,
                 errors: list[str], stop: StopSignal | None):
        self.file, self.runs, self.slot, self.landed = file, runs, slot, landed
        self.errors, self.stop = errors, stop

    def __call__(self) -> None:
        remote = self.file.remote
        try:
            if self.errors or (self.stop is not None and self.stop.is_set()):
                remote.abandon(self.runs, RuntimeError("warm-up stopped"))  # queued when it ended: not fetched
                return
            # for the store: readers' LRU untouched; the slot given back once the body is in
            error = remote.fetch_claimed(self.runs, memory=False, slot=self.slot)
        finally:
            self.slot.release()
        wrapper = self.file.wrapper
        if error is not None and wrapper is not remote and isinstance(wrapper, Mirrored) and wrapper.mirrors:
            error = self._through_wrapper()
        if error is not None:
            self.errors.append(str(error))
            return
        self.landed(sum(_chunk_bytes(remote, a, b) for a, b in self.runs))
        trouble = remote.store_trouble()
        if trouble:  # these bytes were not kept, nor would any more be: end the warm-up now, not after it all
            message = _store_error(remote, trouble)
            if message not in self.errors:
                self.errors.append(message)

    def _through_wrapper(self) -> Exception | None:
        """The mirrors' turn for a piece the primary failed: read through the mirror wrapper (its failover) and
        kept as the primary's chunks (mirrors are byte-identical copies: the checkpoint's caches key their
        bytes on the primary's identity too), so a later mount finds them whichever copy it reads."""
        remote = self.file.remote
        try:
            for a, b in self.runs:
                remote.keep_chunks(a, self.file.wrapper.pread(a * CHUNK, _chunk_bytes(remote, a, b)))
        except CheckpointError as exc:
            return exc
        return None

    def __repr__(self) -> str:
        return f"<warm-up {public_name(self.file.remote.name)} {self.runs}>"


class EarlyWarmup:
    """The warm-up of one remote file, started before its checkpoint is opened (``ckptfs prefetch`` of a
    single file): the open's probes, header reads and parsing, most of a cold warm-up of a small model,
    overlap the fetching of the rest instead of coming first. The open's header reads join the warm-up's
    fetches of the same chunks (``ckptfs.cache.flight.flights_for``: one flight per content in a process), so
    no byte is fetched twice.

    The caller makes (probes) the source; ``start`` measures what the store holds of it on the caller's thread
    before the thread starts, and the caller opens the checkpoint only after that: the open stores the header
    chunks it reads, and a measure taken once it had would count them as found cached.

    Best effort: the source is first judged by ``check`` (``ckptfs prefetch``: its format detected from its
    first bytes, which the open's first request brought: ``transport.OPEN_HEAD_BYTES``, so the check costs no
    request and a file that is no checkpoint none beyond it); a failure there, or in the warm-up, is logged
    and dropped, since the warm-up of the opened checkpoint that always follows (``warm``, through the
    checkpoint's own sources: mirrors, the fit check of every file) fetches whatever is still missing and
    reports its own errors. Only for a source that is one whole checkpoint (the caller decides: not a shard
    of a split set, not a folder or an index), so the fit check made here for it is the checkpoint's."""

    def __init__(self, source: ByteSource, stop: StopSignal | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 check: Callable[[ByteSource], object] | None = None):
        self.remote = remote_of(source)
        self.check = check  # raises for a source not worth warming (a file that is no checkpoint)
        self.stop = stop
        self.progress = progress
        self.cached: dict[str, int] = {}  # content identity -> bytes in the store before this run
        self.report: WarmupReport | None = None
        self._kept = 0  # bytes it added to the store (measured there: a full store keeps less than fetched)
        self._thread = threading.Thread(target=self._run, name="ckptfs-warmup-early", daemon=True)

    def start(self) -> EarlyWarmup:
        """What the store holds of the file, measured here (see above), then the warm-up on its thread."""
        remote = self.remote
        if remote is not None and remote.stores_chunks:
            self.cached[remote.content_id()] = remote.stored_bytes()
        self._thread.start()
        return self

    def _run(self) -> None:
        remote = self.remote
        if remote is None or not remote.stores_chunks:
            return
        name = public_name(remote.name)
        try:
            try:
                if self.check is not None:
                    self.check(remote)
                self.report = warm([remote], stop=self.stop, progress=self.progress)
            finally:
                self._kept = max(0, remote.stored_bytes() - self.cached[remote.content_id()])
            if self.report.errors:
                raise WarmupError(remote.name, None, self.report.errors[0])
        except Exception as exc:  # noqa: BLE001 - best effort: the checkpoint's warm-up fetches the rest
            log.info("warm-up of %s before its open: %s (fetched after the open instead)", name, exc)

    @property
    def stored(self) -> int:
        """Bytes it added to the store (once it has ended): what a failed open leaves kept."""
        return self._kept

    def join(self) -> dict[str, int]:
        """Wait for it; ``warm``'s ``cached_before`` for the file it fetched (empty when it did not run)."""
        self._thread.join()
        return self.cached


def check_room(remotes: Sequence[RemoteSource], missing: int | None = None) -> None:
    """WarmupError (one line) when the ``missing`` bytes the store lacks of ``remotes`` (None: measured here)
    cannot be stored before the cache folder's file system is down to its ``--cache-dir-min-free`` floor,
    even once every other remote file stored there is evicted: ``ckptfs prefetch`` refuses such a run
    before it fetches, rather than fetching bytes the store must refuse (``SparseStore`` checks the floor
    before every write)."""
    stores = [remote for remote in remotes if remote.stores_chunks]
    if not stores:
        return
    folder = stores[0].options.cache_dir
    given = stores[0].options.open_options.cache_dir_min_free
    min_free = float(given) if given is not None else DEFAULT_MIN_FREE
    kept = sum(remote.stored_bytes() for remote in stores)
    if missing is None:
        missing = sum(remote.size for remote in stores) - kept
    try:
        free, floor = free_and_floor(folder or ".", min_free)
        others = max(0, folder_bytes(Path(folder or ".") / NAMESPACE) - kept)  # what eviction could free
    except OSError:
        return  # (the folder's trouble is said by the writes)
    if missing > free - floor + others:
        raise WarmupError(stores[0].name if len(stores) == 1 else folder, None,
                          f"{format_size(missing)} to fetch do not fit in the cache folder {folder}: its file "
                          f"system has {format_size(free)} free and --cache-dir-min-free {min_free:g}% keeps "
                          f"{format_size(floor)} of it free (other files stored there: "
                          f"{format_size(others)}): free space there, lower --cache-dir-min-free, or give a "
                          f"--cache-dir on a file system with room")


def _store_error(remote: RemoteSource, why: str) -> str:
    """The warm-up's line for a store that takes no bytes (``RemoteSource.store_trouble``)."""
    folder = remote.options.cache_dir
    if why == FULL:
        try:
            st = _statvfs(folder)
            why += f", {format_size(st.f_bavail * st.f_frsize)} free"
        except OSError:
            pass
        advice = "free space there, or give a --cache-dir on a file system with room for the checkpoint"
    elif why == BELOW_FLOOR:
        advice = "free space there, lower --cache-dir-min-free, or give a --cache-dir with room"
    elif why == NOT_WRITABLE:
        advice = "make it writable for this user, or give another --cache-dir"
    else:
        advice = "run it again once the folder can be written"
    return f"{public_name(remote.name)}: the cache folder {folder} takes no more bytes: {why} ({advice})"


def _statvfs(folder: str | None) -> os.statvfs_result:
    """The file system of the ``--cache-dir`` ``folder``; OSError (as for a folder that is not there) without
    one, which a remote whose chunks a store keeps always has."""
    if folder is None:
        raise FileNotFoundError("no --cache-dir")
    return os.statvfs(folder)


def stored_in_folder(sources: Iterable[ByteSource]) -> int:
    """Bytes of the remote files among ``sources`` that the ``--cache-dir`` store holds now (measured there)."""
    remotes = [remote_of(source) for source in sources]
    return sum(r.stored_bytes() for r in remotes if r is not None and r.stores_chunks)


def _unstored_error(remote: RemoteSource, left: list[int]) -> str:
    folder = remote.options.cache_dir
    why = "other processes' entries took the room (see --cache-dir-size) or it cannot be written"
    try:
        st = _statvfs(folder)
        if st.f_bavail * st.f_frsize < STORED_RUN * CHUNK + HEADER_SIZE:  # not room for one more entry
            why = "its file system is full"
    except OSError as exc:
        why = f"it cannot be used ({exc.strerror or exc})"
    return (f"{public_name(remote.name)}: {len(left)} chunks ({format_size(len(left) * CHUNK)}) are not in the "
            f"cache folder {folder} after fetching: {why}")


class BackgroundWarmup:
    """:func:`warm` on a thread for a mount (``--prefetch``): started once the mount answers, stopped on
    unmount (the pieces in flight finish, nothing new starts), its progress and outcome in the log. It takes
    at most ``share`` of each origin's slots and of the fetch budget, leaving the rest to the readers'
    read-ahead."""

    LOG_EVERY_S = 10.0

    def __init__(self, sources: Callable[[], list[ByteSource]], name: str, share: float = 0.5):
        self.sources = sources  # called on the thread (a source that cannot be had is the warm-up's failure)
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
        sources: list[ByteSource] = []
        try:
            sources = self.sources()
            self.report = warm(sources, stop=self._stop, progress=self._progress, share=self.share)
        except CheckpointError as exc:
            self.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a daemon's background work never ends the mount
            self.error = f"{type(exc).__name__}: {exc}"
        try:
            self._stored_at_end = stored_in_folder(sources)
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

    @classmethod
    def for_checkpoint(cls, ck: OpenedCheckpoint, name: str, share: float = 0.5) -> BackgroundWarmup:
        """The warm-up of every file of an opened checkpoint (:func:`checkpoint_sources`), not started."""
        return cls(lambda: checkpoint_sources(ck), name, share)

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
