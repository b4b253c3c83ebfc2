"""The byte warm-up of a checkpoint's remote files: what ``ckptfs prefetch SRC --cache-dir DIR`` and a mount's
``--prefetch`` run, so that a later mount or ``ckptfs.open`` with the same ``--cache-dir`` reads every tensor
(and every header byte) without a request for bytes: only the one-byte probe each file's open sends to learn
its size and identity.

The fetching itself — pieces under the origin's limit on the worker pools, passes, landed counting, the stop
signal, the background thread and its share, its status — is ``ckptfs.ahead.warmup``'s, over what it declares
of a file (``WarmFile``). This module is its adapter to the remote sources and the ``--cache-dir`` store,
which it composes:

- **The files.** Every file of an opened checkpoint as the checkpoint reads it (``checkpoint_sources``), the
  remote source under its wrappers (``remote_of``: a manifest's checked reads, mirrors), each adapted as a
  ``WarmFile`` (:class:`_RemoteFile`). **Local files** hold their bytes already: they are counted as local and
  skipped.
- **Bounded by ``--cache-dir-size``.** The store deletes its least recently used entries past its bound, so a
  checkpoint bigger than the bound would evict its own first chunks while its last ones arrive. Before any
  fetch, the entries the files need (the whole files, with each entry's header) are compared with what the
  store keeps after a prune (90 % of the bound): a checkpoint that does not fit is refused with one line
  (:class:`WarmupError`), nothing fetched; so is one whose missing bytes do not fit above the file system's
  ``--cache-dir-min-free`` floor (:func:`check_room`).
- **Never a wrong byte, never a silent gap.** Bytes go through the source's own fetch (deadline, retries,
  identity and length checks) into the store's authenticated entries. With mirrors, a piece the primary
  failed is read through the mirror wrapper (its failover) and kept as the primary's chunks. A store that
  takes no more bytes, and chunks missing after the last pass (a full disk, entries evicted for other
  processes'), are each said in one line naming the folder and what to do.
- **Resumable.** Only chunks the store lacks are fetched (``RemoteSource.unstored_chunks``): a second run
  after an interrupted one fetches the rest, a run after a complete one fetches nothing.

``warm(sources, ...)`` runs in the caller's thread and returns a ``WarmupReport``; a ``stop`` event ends it
early (the pieces in flight finish). :func:`background` and :func:`for_checkpoint` make the mount's
``BackgroundWarmup`` of them; :class:`EarlyWarmup` starts a single file's before its checkpoint's open.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ckptfs.ahead.limits import HeldSlot, OriginLimit
from ckptfs.ahead.warmup import BackgroundWarmup, Progress, StopSignal, WarmupReport, fetch_missing
from ckptfs.sources.remote.store.chunks import CHUNK, STORED_RUN
from ckptfs.cache.folder import FULL, NOT_WRITABLE
from ckptfs.cache.entry import HEADER_SIZE
from ckptfs.cache.flight import Flight
from ckptfs.sources.remote.store.sparse_store import (BELOW_FLOOR, DEFAULT_MIN_FREE, NAMESPACE, folder_bytes,
                                                      free_and_floor)
from ckptfs.core.errors import CheckpointError
from ckptfs.sources.base import ByteSource, Mirrored, WrapsSource
from ckptfs.sources.pool import SourcePool
from ckptfs.sources.remote.transport import RemoteSource
from ckptfs.util.redact import public_name
from ckptfs.util.sizes import format_size
from ckptfs.workers.scheduler import WORKERS, Scheduler

log = logging.getLogger(__name__)

#: The store keeps at most this fraction of --cache-dir-size after a prune (``ckptfs.cache.disk.LOW_WATER``).
FITS_FRACTION = 0.9

Run = tuple[int, int]


class WarmupError(CheckpointError):
    """The warm-up cannot run, or a piece failed: one line naming the file."""


class OpenedCheckpoint(Protocol):
    """What a warm-up reads of an opened checkpoint (``ckptfs.checkpoint.Checkpoint``, a layer above this
    one): its files' names and the pool that opens them as the checkpoint reads them."""

    @property
    def files(self) -> Sequence[str]: ...

    @property
    def passthrough(self) -> Mapping[str, str]: ...

    @property
    def sources(self) -> SourcePool: ...


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


@dataclass
class _RemoteFile:
    """A remote file as the warm-up's mechanism sees it (``ckptfs.ahead.warmup.WarmFile``): its source, and
    the wrapper its reads go through (mirrors: a failed piece is read through it once more)."""

    remote: RemoteSource
    wrapper: ByteSource
    chunk = CHUNK

    @property
    def name(self) -> str:
        return public_name(self.remote.name)

    @property
    def size(self) -> int:
        return self.remote.size

    @property
    def piece_bytes(self) -> int:
        return self.remote.piece_bytes

    @property
    def timeout(self) -> float:
        return self.remote.options.timeout

    def origin_limit(self) -> OriginLimit:
        return self.remote.origin_limit()

    def workers(self) -> Scheduler:
        return self.remote.options.runtime.get(WORKERS)  # the pools of the runtime the source was opened in

    def unstored_chunks(self) -> list[int]:
        return self.remote.unstored_chunks()

    def fetches_under_way(self, indexes: list[int]) -> list[Flight]:
        return self.remote.fetches_under_way(indexes)

    def claim(self, c0: int, c1: int) -> list[Run]:
        return self.remote.claim(c0, c1)

    def abandon(self, runs: list[Run], error: BaseException) -> None:
        self.remote.abandon(runs, error)

    def fetch_piece(self, runs: list[Run], slot: HeldSlot) -> Exception | None:
        """For the store (the readers' LRU untouched), the slot given back once the body is in; a failure the
        primary gives is the mirrors' turn."""
        try:
            error = self.remote.fetch_claimed(runs, memory=False, slot=slot)
        finally:
            slot.release()
        wrapper = self.wrapper
        if error is not None and wrapper is not self.remote and isinstance(wrapper, Mirrored) and wrapper.mirrors:
            error = self._through_wrapper(runs)
        return error

    def _through_wrapper(self, runs: list[Run]) -> Exception | None:
        """The mirrors' turn for a piece the primary failed: read through the mirror wrapper (its failover) and
        kept as the primary's chunks (mirrors are byte-identical copies: the checkpoint's caches key their
        bytes on the primary's identity too), so a later mount finds them whichever copy it reads."""
        remote = self.remote
        try:
            for a, b in runs:
                remote.keep_chunks(a, self.wrapper.pread(a * CHUNK, _chunk_bytes(remote, a, b)))
        except CheckpointError as exc:
            return exc
        return None

    def store_trouble(self) -> str | None:
        trouble = self.remote.store_trouble()
        return _store_error(self.remote, trouble) if trouble else None

    def unstored_error(self, left: list[int]) -> str:
        return _unstored_error(self.remote, left)


def _entries_bytes(remote: RemoteSource) -> int:
    """What a whole file takes in the store: each chunk an entry with its header."""
    return remote.size + -(-remote.size // CHUNK) * HEADER_SIZE


def _chunk_bytes(remote: RemoteSource, first: int, last: int) -> int:
    return min(remote.size, last * CHUNK) - first * CHUNK


def warm(sources: Iterable[ByteSource], *, stop: StopSignal | None = None,
         progress: Progress | None = None, share: float = 1.0,
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
    files: list[_RemoteFile] = []
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
        files.append(_RemoteFile(remote, source))
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
    missing: list[list[int]] = []
    for f in files:
        unstored = f.remote.unstored_chunks()
        missing.append(unstored)
        stored = f.remote.size - sum(_chunk_bytes(f.remote, i, i + 1) for i in unstored)
        report.cached += (cached_before or {}).get(f.remote.content_id(), stored)
    check_room([f.remote for f in files],
               sum(_chunk_bytes(f.remote, i, i + 1) for f, lacks in zip(files, missing) for i in lacks))
    for f, lacks in zip(files, missing):  # a store that takes nothing now (an earlier warm-up found it full)
        trouble = f.store_trouble() if lacks else None
        if trouble:
            report.errors.append(trouble)
            report.seconds = time.monotonic() - started
            return report
    try:
        fetch_missing(list(zip(files, missing)), report, stop=stop, progress=progress, share=share)
    finally:  # the buffers its pieces landed in are let go (one store holds the files of a warm-up): a
        if files:  # mount's warm-up ends, its daemon goes on
            files[0].remote.fetcher.cache.let_go_of_landings()
    report.seconds = time.monotonic() - started
    return report


class _Sources:
    """A ``BackgroundWarmup``'s target (``ckptfs.ahead.warmup.Target``): the files ``sources()`` gives, had on
    the warm-up's thread."""

    def __init__(self, sources: Callable[[], list[ByteSource]]) -> None:
        self._sources = sources
        self._had: list[ByteSource] = []

    def warm(self, stop: StopSignal, progress: Progress, share: float) -> WarmupReport:
        self._had = self._sources()
        return warm(self._had, stop=stop, progress=progress, share=share)

    def stored(self) -> int:
        return stored_in_folder(self._had)


def background(sources: Callable[[], list[ByteSource]], name: str, share: float = 0.5) -> BackgroundWarmup:
    """The mount's background warm-up (``--prefetch``) of the files ``sources()`` gives (called on its thread: a
    source that cannot be had is the warm-up's failure), not started."""
    return BackgroundWarmup(lambda: _Sources(sources), name, share)


def for_checkpoint(ck: OpenedCheckpoint, name: str, share: float = 0.5) -> BackgroundWarmup:
    """The background warm-up of every file of an opened checkpoint (:func:`checkpoint_sources`), not started."""
    return background(lambda: checkpoint_sources(ck), name, share)


class EarlyWarmup:
    """The warm-up of one remote file, started before its checkpoint is opened (``ckptfs prefetch`` of a
    single file): the open's probes, header reads and parsing, most of a cold warm-up of a small model,
    overlap the fetching of the rest instead of coming first. The open's header reads join the warm-up's
    fetches of the same chunks (``ckptfs.cache.flight.FLIGHTS``: one flight per content in a runtime), so
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


