"""What every remote byte source shares: options, deadlines, retries, chunked caching and single-flight fetches.

A scheme module (``http``, ``s3``) subclasses :class:`RemoteSource` and supplies two things: opening (size
and validator fixed at open, see ``_set_identity``) and one ranged fetch attempt (``_attempt``). This
module turns those into the ByteSource contract:

- ``pread`` maps a byte range to aligned cache chunks (``bytecache.CHUNK``); chunks found in memory or in
  the ``--cache-dir`` store cost nothing, the missing ones are fetched as contiguous runs, one request per
  run. Concurrent readers of a chunk wait for one fetch (single-flight), so the kernel's parallel readahead
  requests and the read-ahead worker never fetch the same bytes twice.
- With ``--redis``/``--redis-cluster`` the single flight spans the fleet (``_fetch_chunks``): every fetch
  (a reader's covering chunks, its parallel pieces, a read-ahead piece) first takes what the shared tier
  holds, leases the rest, fetches from the origin only the chunks it won (and stores them there), and waits
  for the ones other processes are fetching — or fetches them anyway when a lease ends without a value,
  the tier is down, or the wait runs out. The tier costs speed when it fails, never a byte: its values are
  checked entries of the right length, and its breaker answers "missing" at once while it is down.
- Every read has a deadline (``--timeout``, the whole read; a mirror wrapper narrows it with
  :func:`deadline_scope` so one deadline covers the primary and the mirrors). Failed attempts that may
  succeed later (connection errors, stalls, 5xx, 429, short bodies) are retried with exponential backoff and
  full jitter (capped at ``BACKOFF_CAP``), honouring a server's ``Retry-After``, for as long as the deadline
  allows: a 3 s outage inside a 30 s ``--timeout`` costs 3 s, not the read. With a mirror to turn to, a
  failure is retried once and a stall not at all, so the next copy gets the rest of the deadline
  (``max_retries`` bounds the count too where a caller sets it). Everything else (404, 403, another
  identity) ends the read at once.
- An origin that answers nothing for a whole ``--timeout`` is in an outage (``outage``): until anything
  comes from it again, every fetch from it ends by the outage's start + ``--timeout`` and new ones fail at
  once, but for a probe about once a second; so an application's read, however many kernel requests it is,
  ends within ``--timeout`` (and a second) of its first request that met the outage.
- Timeouts are reported as what they are: a wait cut short by the read's deadline says ``--timeout`` and its
  number; a server silent for ``--stall-timeout`` seconds, with time left in the deadline, is a stall (and
  is retried).
- Options (timeouts, cache directory, read-ahead) are a :class:`RemoteOptions` handed to each source when it
  is opened: ``ckptfs.open`` builds one per checkpoint and passes it in the ``ckptfs.sources.Opener`` that
  the header readers, folder discovery and the pool open sources through.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import random
import threading
import time
from dataclasses import dataclass, field

from ckptfs.core.errors import CheckpointError, SourceUnavailable
from ckptfs.sources.base import ByteSource
from ckptfs.cache.chunks import CHUNK, CHUNK_LEASE_MS, CHUNK_WAIT_S, ChunkCache, chunk_key, disk_store, shared_tier
from ckptfs.cache.sparse_store import DEFAULT_MIN_FREE
from ckptfs.cache.flight import Flight, SingleFlight, flights_for
from ckptfs.util.redact import public_name
from ckptfs.util.runs import runs
from ckptfs.sources.netstats import COUNTERS
from ckptfs.readahead import SCHEDULER
from ckptfs.readahead.limit import OriginLimit, origin_limit
from ckptfs.readahead.scheduler import DEFAULT_CONCURRENCY
from ckptfs.sources.remote.outage import PROBE_SECONDS, Admission, Outage, outage_for
from ckptfs.sources.remote.readahead import FETCH_BUDGET, ReadAhead, piece_bytes

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
DEFAULT_STALL_TIMEOUT = 10.0
DEFAULT_CACHE_DIR_SIZE = 10 << 30
#: First header read of a remote file. Header readers grow it geometrically (x2), so a header of H bytes
#: costs at most log2(H / 2 MiB) + 1 requests and fetches at most max(2 MiB, 2 H): a 6.2 MiB vocabulary
#: header is 3 requests, an 8.4 MiB one 4.
REMOTE_INITIAL_READ = 2 * 1024 * 1024
#: One request fetches at most this much; a longer run of missing chunks is several requests.
MAX_REQUEST_BYTES = 16 * 1024 * 1024
#: Keep-alive connections per host: one per fetch worker (read-ahead's highest in-flight limit plus readers'
#: own pieces).
POOL_CONNECTIONS = DEFAULT_CONCURRENCY["fetch"]
BACKOFF_BASE = 0.1
BACKOFF_CAP = 2.0
#: How many last bytes of a file stand for its version where the validator cannot (see ``_confirm_version``).
SAMPLE_BYTES = 4096
#: A fetch ahead of readers (read-ahead, a warm-up) is confirmed by a version check sent at least this long
#: after the one before: the pieces that land meanwhile share it. Sent at once instead, as a reader's own fetch
#: is, checks follow each other back to back and a fast origin gets one per piece (measured on loopback
#: nginx: 1,017 checks for 1,120 pieces of a 4.4 GiB warm-up, whose throughput they cut by up to a fifth).
CHECK_SPACING_S = 0.05
#: A retry is not started with less than this left of the deadline (it could not get an answer).
MIN_ATTEMPT_SECONDS = 0.05


@dataclass
class RemoteOptions:
    """How remote sources behave; one object per ``ckptfs.open``/mount (``probes`` memoizes opens in it)."""

    timeout: float = DEFAULT_TIMEOUT
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    cache_dir: str | None = None
    cache_dir_size: int = DEFAULT_CACHE_DIR_SIZE
    cache_dir_min_free: float = DEFAULT_MIN_FREE  # percent of its file system the store keeps free
    cache_key_file: str | None = None   # the cache folder's key (None: its own, ckptfs.cache.auth)
    max_retries: int | None = None  # None: as many as the deadline allows
    read_ahead: bool = True         # False while a checkpoint's headers are read (no thread before a fork)
    redis: str | None = None        # the fleet's Redis (its URL) or Redis Cluster (seed nodes): fetched chunks
    redis_cluster: tuple[str, ...] = ()  # are shared through it (ckptfs.cache.chunks.shared_tier)
    probes: dict = field(default_factory=dict, repr=False, compare=False)
    outages: dict = field(default_factory=dict, repr=False, compare=False)  # origin -> its Outage (outage.py)

    def chunk_cache(self) -> ChunkCache:
        """The chunk cache of a source opened with these options; the shared level only for one that reads
        ahead (a header read, before a mount forks its daemon, opens no connection)."""
        shared = shared_tier(self.redis, self.redis_cluster, self.cache_key_file) if self.read_ahead else None
        store = disk_store(self.cache_dir, self.cache_dir_size, self.cache_key_file, self.cache_dir_min_free)
        return ChunkCache(store, shared=shared)


#: What a remote source opened without options gets.
DEFAULT_OPTIONS = RemoteOptions()
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("ckptfs_read_deadline", default=None)


@contextlib.contextmanager
def deadline_scope(timeout: float):
    """Every remote read inside ends by ``timeout`` seconds from now (or an enclosing scope's end)."""
    end = time.monotonic() + timeout
    outer = _deadline.get()
    token = _deadline.set(end if outer is None else min(outer, end))
    try:
        yield
    finally:
        _deadline.reset(token)


_fallback: contextvars.ContextVar[bool] = contextvars.ContextVar("ckptfs_read_fallback", default=False)
#: Set while fetching ahead of readers (``fetch_claimed``): such fetches share spaced version checks.
_ahead: contextvars.ContextVar[bool] = contextvars.ContextVar("ckptfs_fetch_ahead", default=False)
#: When the answer to this context's ranged request began (``answered``; None: the scheme does not say).
_answered_at: contextvars.ContextVar[float | None] = contextvars.ContextVar("ckptfs_answered_at", default=None)


def answered() -> None:
    """For a scheme's ``_attempt``: the answer's status and headers are in, so the version its bytes come from
    is fixed (the server opened the file before answering). A version check sent after this moment covers
    the answer's bytes even while its body is still arriving (``_confirm_version``)."""
    _answered_at.set(time.monotonic())


@contextlib.contextmanager
def fallback_scope(has_fallback: bool = True):
    """Reads inside have another copy to turn to (a mirror): a stalled attempt gives up at once and other
    failures are retried once, so the deadline is left for the next copy."""
    token = _fallback.set(has_fallback)
    try:
        yield
    finally:
        _fallback.reset(token)


def read_deadline(timeout: float) -> float:
    end = time.monotonic() + timeout
    outer = _deadline.get()
    return end if outer is None else min(outer, end)


def check_range(source: ByteSource, offset: int, size: int) -> bool:
    """False for an empty read; CheckpointError for bytes outside the source as opened."""
    if size <= 0:
        return False
    if offset < 0 or offset + size > source.size:
        raise CheckpointError(source.name, max(offset, source.size), f"bytes {offset}..{offset + size} lie past "
                                                                     f"the end of the file ({source.size} bytes)")
    return True


class Retryable(Exception):
    """One attempt failed in a way another attempt may not (``retry_after``: the server's wish, seconds;
    ``timeout``: a wait ran out; ``deadline``: the wait that ran out was cut short by the read's deadline,
    ``--timeout``, not by ``--stall-timeout``)."""

    def __init__(self, message: str, retry_after: float | None = None, timeout: bool = False,
                 deadline: bool = False, throttled: bool = False):
        super().__init__(message)
        self.retry_after = retry_after
        self.timeout = timeout or deadline
        self.deadline = deadline
        self.throttled = throttled  # the origin asks for fewer requests (429, 503, SlowDown): see limit.py


def wait_bound(options: RemoteOptions, deadline: float) -> tuple[float, bool]:
    """How long one socket wait may last (the stall timeout, or less when the deadline is nearer), and whether
    the deadline is what bounds it (then a timeout is the read's ``--timeout``, not a stall)."""
    remaining = deadline - time.monotonic()
    return (remaining, True) if remaining < options.stall_timeout else (options.stall_timeout, False)


def stalled(what: str, options: RemoteOptions, detail: str = "") -> Retryable:
    """The Retryable for a server silent for the whole stall timeout (a wait the deadline did not cut short,
    see ``wait_bound``)."""
    return Retryable(f"{what} (no data for {options.stall_timeout:g} s, --stall-timeout){detail}", timeout=True)


class TimedOut(SourceUnavailable):
    """A read's deadline (``--timeout``) ran out before the origin answered."""


class Changed(Exception):
    """The medium answered with another identity than the one fixed at open."""


def backoff_delay(attempt: int) -> float:
    """Exponential backoff with full jitter (attempt 1, 2, ...)."""
    return random.uniform(0.5, 1.0) * min(BACKOFF_CAP, BACKOFF_BASE * (2 ** (attempt - 1)))


class RemoteSource(ByteSource):
    """Base of the remote sources (see the module docstring). Subclasses call ``_set_identity`` while
    opening and implement ``_attempt(start, end, deadline) -> bytes``."""

    scheme = "remote"
    initial_read = REMOTE_INITIAL_READ
    #: The largest request read-ahead makes (``readahead.piece_bytes`` shrinks it as more are in flight).
    piece_bytes = 4 << 20

    def __init__(self, name: str, options: RemoteOptions | None = None):
        self.name = name
        self.options = options if options is not None else DEFAULT_OPTIONS
        self.size = 0
        self.identity: tuple = ()
        self.validator: str | None = None
        self._content_id = ""
        self._cache = self.options.chunk_cache()
        # chunk index -> its fetch under way (ckptfs.cache.flight), shared by content once it is known
        self._flights = SingleFlight()
        self._readahead = ReadAhead(self)
        self._closed = False
        self._sample: tuple[int, int, str] | None = None  # (start, end, digest) re-checked after each fetch
        self._check_lock = threading.Lock()
        self._checked_at = float("-inf")  # when the last check that passed was sent
        self._check_sent = float("-inf")  # when the last check was sent
        self._limit: OriginLimit | None = None
        self._outage: Outage | None = None

    def origin(self) -> str:
        """Who answers this source's requests (a scheme and host): the unit whose in-flight limit is learnt
        (``ckptfs.readahead.limit``). Schemes say; this default is the source's name."""
        return f"{self.scheme}:{self.name}"

    def origin_limit(self) -> OriginLimit:
        limit = self._limit
        if limit is None:
            limit = self._limit = origin_limit(self.origin())
        return limit

    def outage(self) -> Outage:
        """This source's origin's outage state (``outage``: shared by every source of the origin)."""
        outage = self._outage
        if outage is None:
            outage = self._outage = outage_for(self.options.outages, self.origin())
        return outage

    @property
    def closed(self) -> bool:
        return self._closed

    # -- opening ---------------------------------------------------------------------------------------
    def _set_identity(self, size: int, validator: str | None, url: str, sha256: str | None = None,
                      sample: bytes | None = None) -> None:
        """Fix size and identity. ``sample``: the file's last bytes, for a validator that cannot tell versions
        of one size apart (see ``_confirm_version``); it joins the content identity."""
        from ckptfs.sources.identity import remote_content_id, sample_digest, sha256_content_id

        self.size = size
        self.validator = validator
        self.identity = (size, validator, url)
        if sample is not None:
            self._sample = (size - len(sample), size, sample_digest(sample))
        if sha256:
            self._content_id = sha256_content_id(sha256)
        elif validator:
            self._content_id = remote_content_id(validator, size, url, sample)
        else:  # nothing tells versions apart: never share these bytes beyond this open
            self._content_id = remote_content_id(f"unvalidated-{id(self):x}-{time.time_ns()}", size, url)
            self._cache = ChunkCache(None)
            return
        # every reader of these bytes in this process (another source of the URL, a warm-up of the file
        # started before the checkpoint's open) joins the same fetches
        self._flights = flights_for(self._content_id)

    def _confirm_version(self, fetched_at: float, deadline: float, offset: int) -> None:
        """For a weak validator (``_sample`` set): bytes fetched by ``fetched_at`` are served only once a
        request sent after that found the file's last bytes unchanged. A replaced file answers each request
        with the new version from then on, so a check that still sees the old one proves the bytes before it
        old too. ``fetched_at`` is when the answer began where the scheme says (``answered``: its version was
        fixed then, as the server opened the file before answering), else when its body was in: a check sent
        while a long body arrives covers it. Concurrent fetches share one check, and a fetch ahead of
        readers waits for one sent at least ``CHECK_SPACING_S`` after the one before it. CheckpointError when
        the last bytes differ."""
        if self._sample is None:
            return
        start, end, digest = self._sample
        if _ahead.get():
            now = time.monotonic()  # (never more than half the time left: the check itself needs the rest)
            pause = min(self._check_sent + CHECK_SPACING_S - now, (deadline - now) / 2)
            if pause > 0 and self._checked_at <= fetched_at:
                time.sleep(pause)  # (without the lock: a reader's own fetch is checked meanwhile, at once)
        if not self._check_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise self._timeout_error(offset)
        try:
            if self._checked_at > fetched_at:
                return  # a check sent after these bytes arrived passed
            from ckptfs.sources.identity import sample_digest

            sent = self._check_sent = time.monotonic()
            data = self.retrying(lambda bound: self._attempt(start, end, bound), deadline, offset,
                                 "re-checking the file's last bytes: ")
            COUNTERS.request(self.scheme, "ok", len(data))
            if sample_digest(data) != digest:
                COUNTERS.request(self.scheme, "error")
                raise CheckpointError(self.name, offset, f"changed since it was opened: its last {end - start} "
                                                         f"bytes differ (replaced by a file of the same size within "
                                                         f"the validator's one-second resolution)")
            self._checked_at = sent
        finally:
            self._check_lock.release()

    def content_id(self) -> str:
        return self._content_id

    def _keep_prefix(self, data: bytes) -> None:
        """Cache the whole chunks of bytes fetched from offset 0 at open (the header read's start)."""
        full = len(data) if len(data) == self.size else len(data) - len(data) % CHUNK
        if full and self._cache.has(chunk_key(self._content_id, 0)):
            return  # an open memoized from an earlier one: its bytes are in already
        self.keep_chunks(0, data)

    def keep_chunks(self, c0: int, data: bytes) -> None:
        """Cache ``data``, this file's bytes from chunk ``c0`` on (read here, or from a byte-identical mirror:
        a warm-up's piece the mirrors answered), as chunks: the whole ones, and the file's last one."""
        start = c0 * CHUNK
        full = len(data) if start + len(data) == self.size else len(data) - len(data) % CHUNK
        keys = [chunk_key(self._content_id, c0 + i // CHUNK) for i in range(0, full, CHUNK)]
        self._cache.put_run(keys, [bytes(data[i: i + CHUNK]) for i in range(0, full, CHUNK)], -(-self.size // CHUNK))

    # -- reading ---------------------------------------------------------------------------------------
    def pread(self, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset`` (as the object was at open), or CheckpointError."""
        if not check_range(self, offset, size):
            return b""
        parts = self._covering_parts(offset, size)
        if len(parts) == 1 and len(parts[0]) == len(parts[0].obj):
            return parts[0].obj  # a whole chunk: no copy
        return b"".join(parts)  # one copy

    def pread_into(self, offset: int, target: memoryview) -> None:
        """``pread`` straight into ``target`` (libfuse's buffer): the chunks' covering slices are copied there
        once, instead of joined and copied again."""
        if not check_range(self, offset, len(target)):
            return
        at = 0
        for part in self._covering_parts(offset, len(target)):
            target[at: at + len(part)] = part
            at += len(part)

    def _covering_parts(self, offset: int, size: int) -> list[memoryview]:
        """Views of the chunks holding bytes [offset, offset + size) (fetched as needed), in order; the read
        is noted for read-ahead."""
        deadline = read_deadline(self.options.timeout)
        c0, c1 = offset // CHUNK, (offset + size - 1) // CHUNK + 1
        head = min(-(-self.size // CHUNK), self.initial_read // CHUNK)
        if c0 == 0 and c1 < head and not self._cache.has(chunk_key(self._content_id, 0)):
            # the first read of the header (after a one-byte open with --cache-dir): take the whole first
            # read at once, as an open without a cache directory does, instead of one chunk now and more later
            chunks = self._get_chunks(0, head, deadline)[:c1]
        else:
            chunks = self._get_chunks(c0, c1, deadline)
        self._readahead.observe(offset, size)
        return _covering(chunks, offset - c0 * CHUNK, offset + size - (c1 - 1) * CHUNK)

    def advise(self, offset: int, size: int, sequential: bool = False) -> None:
        """Fetch the chunks covering these bytes in the background (best effort)."""
        if size > 0 and not self._closed:
            end = min(self.size, offset + size)
            if end > offset >= 0:
                self._readahead.prefetch(offset // CHUNK, (end - 1) // CHUNK + 1)

    def _get_chunks(self, c0: int, c1: int, deadline: float) -> list[bytes]:
        found: dict[int, bytes] = {}
        mine: list[int] = []
        waits: dict[int, Flight] = {}
        for i in range(c0, c1):
            data = self._cache.get(chunk_key(self._content_id, i))
            if data is not None:
                found[i] = data
                continue
            flight = self._flights.join_or_claim(i)
            if flight is None:
                mine.append(i)
            else:
                waits[i] = flight
        handed: list[int] = []
        try:
            for start, stop in self._hand_out(runs(mine), deadline, handed):
                found.update(self._fetch_chunks(start, stop, deadline))
        except BaseException as exc:  # the runs not tried yet: their waiters must not wait for us
            handed_set = set(handed)
            for i in mine:
                if i not in found and i not in handed_set:
                    self._finish(i, None, exc)
            raise
        for i in handed:  # pieces fetched on the scheduler's workers meanwhile: wait for them as for others'
            data = self._cache.get(chunk_key(self._content_id, i))
            if data is not None:
                found[i] = data
                continue
            flight = self._flights.join_or_claim(i)
            if flight is None:  # done but gone already (evicted, or failed): ours to fetch
                found.update(self._fetch_chunks(i, i + 1, deadline))
            else:
                waits[i] = flight
        for i, flight in waits.items():
            # Another reader's (or read-ahead's) fetch of this chunk: wait for it as long as for a stalled
            # attempt; past that, fetch the chunk ourselves — or, with a mirror to turn to, give it the time.
            bound = self.outage().bound(deadline, self.options.timeout)
            patience = min(bound, time.monotonic() + self.options.stall_timeout) - time.monotonic()
            done = flight.done.wait(max(0.0, patience))
            if done and flight.value is not None:
                found[i] = flight.value
                continue
            if done and _fallback.get():
                error = flight.error
                reason = error.reason if isinstance(error, CheckpointError) else str(error)
                raise CheckpointError(self.name, i * CHUNK, reason)
            if _fallback.get() or time.monotonic() >= bound:
                # (in an outage found meanwhile: its one message, not one per chunk waited for)
                raise self._outage_error() if self.outage().since is not None else self._timeout_error(i * CHUNK)
            data = self._fetch(i * CHUNK, min(self.size, (i + 1) * CHUNK), deadline)
            self._cache.put(chunk_key(self._content_id, i), data)
            found[i] = data
        return [found[i] for i in range(c0, c1)]

    def _hand_out(self, runs: list[tuple[int, int]], deadline: float, handed: list[int]) -> list[tuple[int, int]]:
        """A reader's own runs of missing chunks, longer than one piece (a 64 MiB direct-I/O read, a whole
        tensor's bytes): all pieces but each run's first go to the scheduler's fetch workers at once, so one
        read is as many requests in parallel as a read-ahead would make (their chunks are added to
        ``handed``: the caller waits for them); the pieces the caller fetches itself are returned. A source
        without read-ahead (reading headers, before a mount forks its daemon) starts no thread: one request
        per run, as before."""
        if not self.options.read_ahead:  # a header read before the mount forks: no threads yet
            return runs
        step = piece_bytes(self.origin_limit().limit, self.piece_bytes) // CHUNK
        mine: list[tuple[int, int]] = []
        for start, stop in runs:
            mine.append((start, min(stop, start + step)))
            for first in range(start + step, stop, step):
                last = min(stop, first + step)
                context = contextvars.copy_context()  # the reader's deadline and mirror scopes go along
                job = (lambda a=first, b=last, context=context: context.run(self._fetch_handed, a, b, deadline))
                if SCHEDULER.submit("fetch", job, (last - first) * CHUNK, cap=FETCH_BUDGET) is None:
                    mine.append((first, last))
                else:
                    handed.extend(range(first, last))
        return mine

    def _fetch_handed(self, c0: int, c1: int, deadline: float) -> None:
        try:
            self._fetch_chunks(c0, c1, deadline)
        except Exception as exc:  # noqa: BLE001 - the reader waiting for these chunks fetches them itself
            log.debug("fetch of %s chunks %d..%d failed: %s", public_name(self.name), c0, c1, exc)

    # -- fetching ahead (ckptfs.sources.remote.readahead) -----------------------------------------------
    def claim(self, c0: int, c1: int) -> list[tuple[int, int]]:
        """Register fetches for the chunks in [c0, c1) that nobody has or fetches; the runs claimed. Readers
        of those chunks wait for them from now on; every claimed run must be given to :meth:`fetch_claimed`
        or :meth:`abandon`."""
        flights, ended = self._flights, self._flights.finished
        held = self._cache.held(self._content_id, range(c0, c1))  # not under the flights' lock: pieces land
        claimed = sorted(flights.claim(i for i in range(c0, c1) if i not in held))
        if claimed and flights.finished != ended:
            # a fetch ended meanwhile, and a fetch stores its chunks before it ends their flights: one of them
            # may be claimed again here. Asked once more, and ended at once with the stored bytes.
            for i in sorted(self._cache.held(self._content_id, claimed)):
                data = self._cache.get(chunk_key(self._content_id, i))
                if data is not None:
                    flights.finish(i, data)
                    claimed.remove(i)
        return runs(claimed)

    def fetch_claimed(self, runs: list[tuple[int, int]], memory: bool = True) -> Exception | None:
        """Fetch claimed runs into the chunk cache (best effort, within ``--timeout``): a run that fails is
        left to its readers, who fetch it themselves with their own retries. The first failure is returned
        (read-ahead ignores it; a warm-up reports it, ``ckptfs.sources.remote.warmup``). ``memory=False``:
        the chunks go to the ``--cache-dir`` store only (``ChunkCache.put``), as a warm-up's do."""
        deadline = time.monotonic() + self.options.timeout
        first: Exception | None = None
        token = _ahead.set(True)
        try:
            for start, stop in runs:
                try:
                    self._fetch_chunks(start, stop, deadline, memory)
                except Exception as exc:  # noqa: BLE001 - see the docstring
                    log.debug("read-ahead of %s chunks %d..%d failed: %s", public_name(self.name), start, stop,
                              exc)
                    first = first or exc
        finally:
            _ahead.reset(token)
        return first

    @property
    def stores_chunks(self) -> bool:
        """Whether fetched chunks are kept in a ``--cache-dir`` store (beyond this process's memory)."""
        return self._cache.disk is not None

    def local_copy(self) -> tuple[int, int, int] | None:
        """``(descriptor, size, mtime_ns)`` of this file's complete local copy in the ``--cache-dir`` store once
        this process has checked it (``ChunkCache.local_copy``), else None: the mount's C read path serves a
        file that has one as a local file (``ckptfs.fs.direct``)."""
        return self._cache.local_copy(self._content_id, self.size)

    def store_trouble(self) -> str | None:
        """Why the ``--cache-dir`` store takes no bytes now (its file system full, the folder not writable:
        ``DiskStore.writes_paused``), or None (also without a store)."""
        disk = self._cache.disk
        return disk.writes_paused() if disk is not None else None

    def stored_bytes(self) -> int:
        """Bytes of this file the ``--cache-dir`` store holds now (what this process holds in memory only, a
        header read, not counted)."""
        chunks = -(-self.size // CHUNK)
        stored = self._cache.stored_chunks(self._content_id, range(chunks))
        return sum(min(CHUNK, self.size - i * CHUNK) for i in stored)

    def unstored_chunks(self) -> list[int]:
        """The chunk numbers the ``--cache-dir`` store does not hold (every chunk without a store). A chunk
        this process holds in memory only (its header read, a read before the store had room) is written to
        the store here instead of being fetched again."""
        chunks, disk = -(-self.size // CHUNK), self._cache.disk
        if disk is None:
            return list(range(chunks))
        missing = []
        stored = self._cache.stored_chunks(self._content_id, range(chunks))
        for i in range(chunks):
            if i in stored:
                continue
            key = chunk_key(self._content_id, i)
            data = self._cache.memory.get(key)
            if data is not None:
                self._cache.put(key, data)
                if disk.contains(key):
                    continue
            missing.append(i)
        return missing

    def fetches_under_way(self, indexes: list[int]) -> list[Flight]:
        """The fetches in progress of chunks ``indexes`` (a reader's, read-ahead's: ``claim`` skips them), to
        wait for their ends."""
        return self._flights.under_way(indexes)

    def abandon(self, runs: list[tuple[int, int]], error: BaseException) -> None:
        """Give up claimed runs unfetched: their waiters fetch for themselves."""
        for start, stop in runs:
            for i in range(start, stop):
                self._flights.finish(i, error=error)

    def forget_fetches(self) -> None:
        """In a forked child: the parent's fetches are gone; their readers fetch for themselves."""
        self._flights.fail_all(RuntimeError("fetch interrupted by fork"))

    def _fetch_chunks(self, c0: int, c1: int, deadline: float, memory: bool = True) -> dict[int, bytes]:
        """Fetch chunks [c0, c1) (flights registered by the caller), cache them, wake waiters. With a shared
        tier (``--redis``/``--redis-cluster``, ``ckptfs.cache.chunks``): the chunks it holds are taken from
        it (one round trip), the rest leased (one more); only the chunks whose lease this process won are
        fetched from the origin (contiguous ones as one request) and stored there, then the ones another
        process is fetching are waited for (``_wait_shared``)."""
        out: dict[int, bytes] = {}
        leased: list[int] = []
        try:
            fetch, held = list(range(c0, c1)), []
            if self._cache.shared is not None:
                fetch, held = self._from_shared(fetch, deadline, out)
                leased = list(fetch)
            self._fetch_runs(fetch, deadline, out, memory)
            if held:
                leased += self._wait_shared(held, deadline, out)
        except BaseException as exc:
            for i in range(c0, c1):
                if i not in out:
                    self._finish(i, None, exc)
            self._cache.release([chunk_key(self._content_id, i) for i in leased if i not in out])
            raise
        return out

    def _fetch_runs(self, indexes: list[int], deadline: float, out: dict[int, bytes], memory: bool = True) -> None:
        """Fetch the chunks ``indexes`` from the origin, each contiguous run as requests of at most
        ``MAX_REQUEST_BYTES``; each chunk is cached (in memory too unless ``memory`` is False), added to
        ``out`` and its flight finished."""
        step = max(1, MAX_REQUEST_BYTES // CHUNK)
        for c0, c1 in runs(indexes):
            for first in range(c0, c1, step):
                last = min(c1, first + step)
                start, end = first * CHUNK, min(self.size, last * CHUNK)
                parts = self._fetch_parts(start, end, deadline)
                if len(parts) != last - first or any(len(p) != CHUNK for p in parts[:-1]):
                    data = b"".join(parts)  # a scheme that answers in other pieces: cut it into chunks
                    parts = [data[k * CHUNK: (k + 1) * CHUNK] for k in range(last - first)]
                self._cache.put_run([chunk_key(self._content_id, i) for i in range(first, last)], parts,
                                    -(-self.size // CHUNK), memory=memory)
                for i, piece in zip(range(first, last), parts):
                    out[i] = piece
                    self._finish(i, piece, None)

    def _from_shared(self, indexes: list[int], deadline: float,
                     out: dict[int, bytes]) -> tuple[list[int], list[int]]:
        """The shared tier's part of fetching ``indexes``: the chunks it holds go to ``out`` (flights
        finished); of the rest, (the ones this process now leases: fetch them, the ones another process
        holds the lease of: wait for them)."""
        keys = [chunk_key(self._content_id, i) for i in indexes]
        missing = []
        for i, key, data in zip(indexes, keys, self._cache.lookup(keys)):
            if not self._shared_chunk(i, data, out):
                missing.append(i)
        return self._lease(missing, deadline)

    def _lease(self, indexes: list[int], deadline: float) -> tuple[list[int], list[int]]:
        """(the chunks of ``indexes`` this process now holds the lease of, the ones another process holds);
        a lease lasts as long as this fetch may (``CHUNK_LEASE_MS`` at least): by then the chunks are stored
        or the lease released."""
        if not indexes:
            return [], []
        ms = max(CHUNK_LEASE_MS, int((deadline - time.monotonic()) * 1000))
        won = self._cache.lease([chunk_key(self._content_id, i) for i in indexes], ms)
        return [i for i, w in zip(indexes, won) if w], [i for i, w in zip(indexes, won) if not w]

    def _wait_shared(self, indexes: list[int], deadline: float, out: dict[int, bytes]) -> list[int]:
        """Chunks other processes are fetching under their leases: wait for them (``CHUNK_WAIT_S`` in all,
        and at most half of what is left of the read's deadline: the rest is for fetching them here). A
        lease that ended without a value (its holder died) is taken over: the first waiter to lease the
        chunk again fetches it, the others go on waiting for that one. What is still missing at the end is
        fetched here. Returns the chunks this process took the lease of."""
        until = time.monotonic() + min(CHUNK_WAIT_S, max(0.0, (deadline - time.monotonic()) / 2))
        taken: list[int] = []
        for attempt in range(2):
            keys = [chunk_key(self._content_id, i) for i in indexes]
            for i, data in zip(indexes, self._cache.wait(keys, max(0.0, until - time.monotonic()))):
                self._shared_chunk(i, data, out)
            indexes = [i for i in indexes if i not in out]
            if not indexes or attempt or time.monotonic() >= until:
                break
            won, indexes = self._lease(indexes, deadline)
            taken += won
            self._fetch_runs(won, deadline, out)
        self._fetch_runs(indexes, deadline, out)
        return taken

    def _shared_chunk(self, i: int, data: bytes | None, out: dict[int, bytes]) -> bool:
        """Take chunk ``i`` from the shared tier into ``out`` (its flight finished); False when the tier had
        none, or one of another length than this file's chunk ``i`` (fetched instead: never served)."""
        if data is None or len(data) != min(CHUNK, self.size - i * CHUNK):
            return False
        out[i] = data
        COUNTERS.shared(len(data))
        self._finish(i, data, None)
        return True

    def _finish(self, i: int, data: bytes | None, error: BaseException | None) -> None:
        self._flights.finish(i, data, error)

    def _fetch(self, start: int, end: int, deadline: float) -> bytes:
        """Bytes [start, end) with retries (see the module docstring), or CheckpointError."""
        return joined(self._fetch_parts(start, end, deadline))

    def _fetch_parts(self, start: int, end: int, deadline: float) -> list[bytes]:
        """``_fetch``'s bytes as the scheme read them: consecutive parts (``CHUNK`` bytes each but the last, for
        a scheme that reads chunk by chunk: they become the cache's chunks without another copy)."""
        sent = time.monotonic()
        token = _answered_at.set(None)
        try:
            body = self.retrying(lambda bound: self._attempt_parts(start, end, bound), deadline, start)
            answered_at = _answered_at.get()  # the successful attempt's: it is the last to set it
        finally:
            _answered_at.reset(token)
        parts = body if isinstance(body, list) else [body]
        got = sum(len(p) for p in parts)
        done = time.monotonic()
        self.outage().heard()
        self.origin_limit().finished(got, done - sent)
        if got != end - start:  # a scheme's _attempt must check this; never serve a short read
            raise CheckpointError(self.name, start, f"got {got} bytes for a {end - start}-byte range")
        COUNTERS.request(self.scheme, "ok", got)
        self._confirm_version(done if answered_at is None else answered_at, deadline, start)
        return parts

    def _admit(self, offset: int | None) -> None:
        """Before a fetch asks the origin: nothing to do unless the origin is in an outage (``outage``); then
        this fetch sends the probe that is due (one byte at ``offset``, ``PROBE_SECONDS`` allowed) and goes on
        if it was answered, or fails at once."""
        offset = offset or 0
        outage = self.outage()
        admission = outage.admit(self.options.timeout)
        if admission is Admission.ASK:
            return
        if admission is Admission.PROBE:
            answered = True  # any answer, even a wrong one, says the origin is back (the fetch will judge it)
            try:
                self._attempt(offset, offset + 1, time.monotonic() + PROBE_SECONDS)
            except Retryable:  # no answer, or one that counts as an answer (a 5xx: the client heard it)
                answered = outage.since is None
            except Exception:  # noqa: BLE001 - see above
                pass
            finally:
                outage.probed(answered)
            if answered:
                COUNTERS.request(self.scheme, "ok")
                return
        COUNTERS.request(self.scheme, "timeout")
        raise self._outage_error()

    def _outage_error(self) -> SourceUnavailable:
        """How a fetch fails while its origin is in an outage: one message for all (one log line per file)."""
        return SourceUnavailable(self.name, None, f"{public_name(self.origin())} is not answering (nothing came "
                                                  f"from it for --timeout {self.options.timeout:g} s); its reads "
                                                  f"fail at once until it answers again")

    def retrying(self, attempt, deadline: float, offset: int | None, what: str = ""):
        """``attempt(bound)`` until it succeeds, retrying Retryable failures with backoff (counted here) for as
        long as ``deadline`` allows (see the module docstring); ``bound`` is ``deadline`` or, while the origin
        is in an outage, the outage's end of patience (``outage``), and a deadline that runs out starts one.
        A fetch that finds the origin in an outage fails at once, or sends the probe that is due (``_admit``).
        ``what`` prefixes the final error's reason."""
        outage, timeout = self.outage(), self.options.timeout
        self._admit(offset)
        try:
            return self._retrying(attempt, deadline, offset, what, outage)
        except TimedOut:  # this fetch's whole deadline ran out: the origin is out since it arrived
            if outage.timed_out(deadline - timeout):
                raise  # the fetch that found the outage says what it saw
            raise self._outage_error() from None

    def _retrying(self, attempt, deadline: float, offset: int | None, what: str, outage: Outage):
        tries = 0
        started = time.monotonic()
        before: Retryable | None = None  # the failure before the last, for the final message
        fallback = _fallback.get()
        max_retries = self.options.max_retries
        if fallback:
            max_retries = 1 if max_retries is None else min(1, max_retries)
        while True:
            bound = outage.bound(deadline, self.options.timeout)
            if time.monotonic() >= bound:
                raise self._timeout_error(offset, what, tries)
            try:
                return attempt(bound)
            except Retryable as exc:
                tries += 1
                if exc.throttled:
                    self.origin_limit().throttled()
                left = bound - time.monotonic()
                if exc.retry_after is not None:
                    delay, too_late = exc.retry_after, exc.retry_after >= left  # not before the server's time
                else:
                    delay = min(backoff_delay(tries), max(0.0, left - MIN_ATTEMPT_SECONDS))
                    too_late = left <= MIN_ATTEMPT_SECONDS
                give_up = (exc.deadline or too_late or (max_retries is not None and tries > max_retries)
                           or (fallback and exc.timeout))
                COUNTERS.request(self.scheme, "timeout" if exc.timeout else ("error" if give_up else "retry"),
                                 retried=not give_up)
                if give_up:
                    count = f"{tries} attempt{'s' if tries > 1 else ''}"
                    if exc.deadline:  # the last attempt itself was cut short by the deadline
                        raise self._timeout_error(offset, what, tries, exc, before) from None
                    spent = time.monotonic() - started
                    if too_late and exc.retry_after is not None:  # no use waiting for the server's time
                        why = (f"; the server asks to retry in {exc.retry_after:g} s, past the read's deadline "
                               f"(--timeout {self.options.timeout:g} s)")
                    elif too_late:
                        why = f" ({count} in {spent:.1f} s, until the read's deadline: --timeout {self.options.timeout:g} s)"
                        raise TimedOut(self.name, offset, f"{what}{exc}{why}") from None
                    else:
                        why = f" (gave up after {count} in {spent:.1f} s)"
                    raise SourceUnavailable(self.name, offset, f"{what}{exc}{why}") from None
                log.debug("%s @ %s: %s; retrying in %.2f s", self.name, offset, exc, delay)
                before = exc
                time.sleep(delay)
            except Changed as exc:
                COUNTERS.request(self.scheme, "error")
                raise CheckpointError(self.name, offset, f"changed since it was opened: {exc}") from None

    def _timeout_error(self, offset: int | None, what: str = "", tries: int = 0, last: Retryable | None = None,
                       before: Retryable | None = None) -> TimedOut:
        """The read's deadline (``--timeout``) passed: say so, with the number, and what the last attempt
        was doing (counted here unless ``last`` was counted by the retry loop)."""
        if last is None:
            COUNTERS.request(self.scheme, "timeout")
        detail = f" after {tries} attempt{'s' if tries > 1 else ''}" if tries else ""
        if last is not None:
            detail += f"; the last {last}"
        if before is not None and not before.deadline:
            detail += f"; the one before: {before}"
        return TimedOut(self.name, offset, f"{what}read timed out (--timeout {self.options.timeout:g} s"
                                                    f"{detail})")

    def _attempt(self, start: int, end: int, deadline: float) -> bytes:  # pragma: no cover - interface
        """One request for bytes [start, end): exactly those bytes, or Retryable / Changed /
        CheckpointError."""
        raise NotImplementedError

    def _attempt_parts(self, start: int, end: int, deadline: float) -> bytes | list[bytes]:
        """``_attempt``, answered as the scheme reads the body: one ``bytes``, or consecutive parts of ``CHUNK``
        bytes but the last (a scheme that can read chunk by chunk overrides this: no join, no cutting)."""
        return self._attempt(start, end, deadline)

    def close_if_idle(self) -> bool:
        return True  # holds no descriptor: the pool's bound on open files does not apply

    def ensure_open(self) -> None:
        self._closed = False

    def close(self) -> None:
        self._closed = True


def joined(parts: list[bytes]) -> bytes:
    """A body read in parts, as one ``bytes`` (no copy when it came in one)."""
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _covering(chunks: list[bytes], skip: int, tail: int) -> list[memoryview]:
    """Views of consecutive chunks covering a read: from byte ``skip`` of the first to byte ``tail`` of the
    last."""
    views = [memoryview(c) for c in chunks]
    if len(views) == 1:
        return [views[0][skip:tail]]
    views[0] = views[0][skip:]
    views[-1] = views[-1][:tail]
    return views


