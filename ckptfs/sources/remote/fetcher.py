"""The chunk fetcher: a remote file's bytes as aligned cache chunks, each fetched once however many want it.

A read is mapped to aligned chunks (``ckptfs.sources.remote.store.chunks.CHUNK``); chunks in memory or in the
``--cache-dir`` store cost nothing, the missing ones are fetched as contiguous runs, one request per run (at
most ``MAX_REQUEST_BYTES``). Concurrent readers of a chunk wait for one fetch (its flight,
``ckptfs.cache.flight``), so the kernel's parallel requests, read-ahead and a warm-up never fetch the same
bytes twice in a process; on one machine the store's byte-range leases do the same between processes.

With ``--redis``/``--redis-cluster`` the single flight spans the fleet (``fetch_chunks``): every fetch (a
reader's covering chunks, its parallel pieces, a read-ahead piece) first takes what the shared tier holds,
leases the rest, fetches from the origin only the chunks it won (and stores them there), and waits for the
ones other processes are fetching — or fetches them anyway when a lease ends without a value, the tier is
down, or the wait runs out. The tier costs speed when it fails, never a byte: its values are checked
entries of the right length, and its breaker answers "missing" at once while it is down.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import cast

from ckptfs.sources.remote.store.chunks import CHUNK, CHUNK_LEASE_MS, CHUNK_WAIT_S, ChunkCache, chunk_key
from ckptfs.cache.keys import CacheKey
from ckptfs.cache.flight import FLIGHTS, Flight, SingleFlight
from ckptfs.core.errors import CheckpointError
from ckptfs.sources.remote.context import ReadContext, Slot
from ckptfs.ahead.limits import OriginLimit
from ckptfs.sources.remote.handoff import hand_out
from ckptfs.sources.remote.options import RemoteOptions
from ckptfs.sources.remote.origin import OriginClient
from ckptfs.sources.remote.version import Unpinned, VersionPin
from ckptfs.util.redact import public_name
from ckptfs.util.runs import runs
from ckptfs.workers.scheduler import WORKERS

log = logging.getLogger(__name__)

#: One request fetches at most this much; a longer run of missing chunks is several requests.
MAX_REQUEST_BYTES = 16 * 1024 * 1024

Run = tuple[int, int]


class ChunkFetcher:
    """One remote file's chunks: the cache they go to, the fetches under way, the fleet's leases (see the
    module docstring). It asks the origin through ``client`` (retries, the outage rule, the origin's limit:
    ``origin.OriginClient``) and, for a file whose validator cannot tell versions apart, confirms what lands
    with ``pin`` (``version.VersionPin``, set at open): both below it, nothing above. ``piece_bytes``: the
    scheme's largest request (fetch-ahead's pieces are at most this)."""

    #: The chunk, in bytes: what read-ahead counts in (``ckptfs.ahead.fetch.Fetches``).
    chunk = CHUNK

    def __init__(self, name: str, options: RemoteOptions, client: OriginClient, piece_bytes: int):
        self.name = name
        self.options = options
        self.client = client
        self.workers = options.runtime.get(WORKERS)  # the pools a reader's long runs are handed to
        self.piece_bytes = piece_bytes
        self.pin: Unpinned | VersionPin = Unpinned()
        self.cache = options.chunk_cache()
        self.flights = SingleFlight()  # chunk index -> its fetch under way, shared by content once known
        self.content_id = ""
        self.size = 0
        self.closed = False  # the source was closed: nothing more is fetched ahead (``ckptfs.ahead.fetch``)

    def origin_limit(self) -> OriginLimit:
        """The in-flight limit of the origin these chunks come from (``ckptfs.ahead.limits``)."""
        return self.client.origin_limit()

    def forget_fetches(self) -> None:
        """In a forked child: the parent's fetches are gone; their readers fetch for themselves."""
        self.flights.fail_all(RuntimeError("fetch interrupted by fork"))

    def identify(self, content_id: str, size: int, shared: bool) -> None:
        """The file's content identity and size, fixed at open. ``shared``: its bytes may be shared beyond
        this open (cache, other sources' fetches of the same content); else nothing is kept past memory."""
        self.content_id, self.size = content_id, size
        if not shared:
            self.cache = ChunkCache(None, self.cache.memory)
            return
        # every reader of these bytes in this process (another source of the URL, a warm-up of the file
        # started before the checkpoint's open) joins the same fetches
        self.flights = self.options.runtime.get(FLIGHTS).named(content_id)

    def key(self, i: int) -> CacheKey:
        """The cache key of chunk ``i`` of this file."""
        return chunk_key(self.content_id, i)

    @property
    def chunks(self) -> int:
        return -(-self.size // CHUNK)

    def keep(self, c0: int, data: bytes) -> None:
        """Cache ``data``, this file's bytes from chunk ``c0`` on, as chunks: the whole ones, and the last one."""
        start = c0 * CHUNK
        full = len(data) if start + len(data) == self.size else len(data) - len(data) % CHUNK
        keys = [self.key(c0 + i // CHUNK) for i in range(0, full, CHUNK)]
        self.cache.put_run(keys, [bytes(data[i: i + CHUNK]) for i in range(0, full, CHUNK)], self.chunks)

    # -- a reader's chunks ---------------------------------------------------------------------------------
    def get_chunks(self, c0: int, c1: int, read: ReadContext, step: int = 0) -> list[bytes]:
        """Chunks [c0, c1): cached ones at once, the ones under way waited for, the rest fetched here (long
        runs partly on the scheduler's workers, in pieces of ``step`` chunks: ``handoff``; 0: all here)."""
        found: dict[int, bytes] = {}
        mine: list[int] = []
        waits: dict[int, Flight] = {}
        for i in range(c0, c1):
            data = self.cache.get(self.key(i))
            if data is not None:
                found[i] = data
                continue
            flight = self.flights.join_or_claim(i)
            if flight is None:
                mine.append(i)
            else:
                waits[i] = flight
        handed: list[int] = []
        try:
            own = runs(mine)
            if step:
                own, handed = hand_out(self.name, own, step, lambda a, b: self.fetch_chunks(a, b, read),
                                       self.workers)
            for start, stop in own:
                found.update(self.fetch_chunks(start, stop, read))
        except BaseException as exc:  # the runs not tried yet: their waiters must not wait for us
            handed_set = set(handed)
            for i in mine:
                if i not in found and i not in handed_set:
                    self.finish(i, None, exc)
            raise
        for i in handed:  # pieces fetched on the scheduler's workers meanwhile: wait for them as for others'
            data = self.cache.get(self.key(i))
            if data is not None:
                found[i] = data
                continue
            flight = self.flights.join_or_claim(i)
            if flight is None:  # done but gone already (evicted, or failed): ours to fetch
                found.update(self.fetch_chunks(i, i + 1, read))
            else:
                waits[i] = flight
        for i, flight in waits.items():
            found[i] = self._waited(i, flight, read)
        return [found[i] for i in range(c0, c1)]

    def _waited(self, i: int, flight: Flight, read: ReadContext) -> bytes:
        """Chunk ``i`` from another reader's (or read-ahead's) fetch: waited for as long as for a stalled
        attempt; past that, fetched here — or, with a mirror to turn to, the time left to the mirror."""
        outage = self.client.outage()
        bound = outage.bound(read.deadline, self.options.timeout)
        patience = min(bound, time.monotonic() + self.options.stall_timeout) - time.monotonic()
        if not flight.done.is_set():
            self.pin.awaited()  # a fetch ahead that waits to share its version check: this reader waits for it
        done = flight.done.wait(max(0.0, patience))
        value: bytes | None = flight.value if done else None
        if value is None and done and flight.error is None:
            value = self.cache.get(self.key(i))  # a warm-up's chunk, stored from where it landed (``fetch_chunks``)
        if value is not None:
            return value
        if done and read.fallback:
            error = flight.error
            reason = error.reason if isinstance(error, CheckpointError) else str(error)
            raise CheckpointError(self.name, i * CHUNK, reason)
        if time.monotonic() >= bound:  # its whole deadline waited: the outage's one message, not one per chunk
            raise self.client.ran_out(read, f"waited --timeout {self.options.timeout:g} s for the fetch of byte "
                                            f"{i * CHUNK} under way")
        if read.fallback:
            raise self.client.outage_error() if outage.since is not None else self.client.timeout_error(i * CHUNK)
        with self.pin.fetching(read.bounded(read.deadline)) as fetch:
            parts = self.client.fetch(i * CHUNK, min(self.size, (i + 1) * CHUNK), fetch)
            self.pin.landed(fetch, i * CHUNK)
        data = b"".join(parts)
        self.cache.put(self.key(i), data)
        return data

    # -- fetching --------------------------------------------------------------------------------------
    def fetch_chunks(self, c0: int, c1: int, read: ReadContext, memory: bool = True) -> dict[int, bytes]:
        """Fetch chunks [c0, c1) (flights registered by the caller), cache them (in memory too unless
        ``memory`` is False), wake waiters. With a shared tier (``--redis``/``--redis-cluster``,
        ``ckptfs.sources.remote.store.chunks``): the chunks it holds are taken from it (one round trip), the
        rest leased (one more); only the chunks whose lease this process won are fetched from the origin and
        stored there, then the ones another process is fetching are waited for (``_shared_batches``). The
        origin is asked here, each contiguous run as requests of at most ``MAX_REQUEST_BYTES``
        (``_requests``), each with its own context (its ``answered_at``: the read's may fan out to workers),
        confirmed by the version pin where the file has one."""
        out: dict[int, bytes] = {}
        stored: set[int] = set()  # a warm-up's, landed and stored: not in hand
        leased: list[int] = []
        try:
            mine, held = list(range(c0, c1)), list[int]()
            if self.cache.shared is not None:
                mine, held = self._from_shared(mine, read, out)
                leased = list(mine)
            batches = chain([mine], self._shared_batches(held, read, out, leased)) if held else [mine]
            for first, last in _requests(batches):
                start, end = first * CHUNK, min(self.size, last * CHUNK)
                # a warm-up's body lands in a buffer the store lends (``ChunkCache.landing``) and is stored from
                # there; its chunks' flights end with no bytes in hand (the buffer is lent again next), and
                # their waiters read them from the store (``_waited``)
                landing = None if memory else self.cache.landing(end - start)
                with landing if landing is not None else contextlib.nullcontext() as into:
                    with self.pin.fetching(read.bounded(read.deadline).landing_in(into)) as one:
                        body = self.client.fetch(start, end, one)
                        self.pin.landed(one, start)
                    keys = [self.key(i) for i in range(first, last)]
                    if into is not None and len(body) == 1 and body[0] is into:
                        self.cache.store_landed(keys, [into[k * CHUNK: (k + 1) * CHUNK] for k in range(last - first)],
                                                self.chunks)
                        for i in range(first, last):
                            stored.add(i)
                            self.finish(i, None, None)
                        continue
                parts = [p if isinstance(p, bytes) else bytes(p) for p in body]  # (views only of a buffer lent)
                if len(parts) != last - first or any(len(p) != CHUNK for p in parts[:-1]):
                    data = b"".join(parts)  # a scheme that answers in other pieces: cut it into chunks
                    parts = [data[k * CHUNK: (k + 1) * CHUNK] for k in range(last - first)]
                self.cache.put_run(keys, parts, self.chunks, memory=memory)
                for i, piece in zip(range(first, last), parts):
                    out[i] = piece
                    self.finish(i, piece, None)
        except BaseException as exc:
            for i in range(c0, c1):
                if i not in out and i not in stored:
                    self.finish(i, None, exc)
            self.cache.release([self.key(i) for i in leased if i not in out and i not in stored])
            raise
        return out

    def _from_shared(self, indexes: list[int], read: ReadContext, out: dict[int, bytes]) -> tuple[list[int], list[int]]:
        """The shared tier's part of fetching ``indexes``: the chunks it holds go to ``out`` (flights
        finished); of the rest, (the ones this process now leases: fetch them, the ones another process
        holds the lease of: wait for them)."""
        keys = [self.key(i) for i in indexes]
        missing = [i for i, data in zip(indexes, self.cache.lookup(keys)) if not self._shared_chunk(i, data, out)]
        return self._lease(missing, read)

    def _lease(self, indexes: list[int], read: ReadContext) -> tuple[list[int], list[int]]:
        """(the chunks of ``indexes`` this process now holds the lease of, the ones another process holds);
        a lease lasts as long as this fetch may (``CHUNK_LEASE_MS`` at least): by then the chunks are stored
        or the lease released."""
        if not indexes:
            return [], []
        ms = max(CHUNK_LEASE_MS, int((read.deadline - time.monotonic()) * 1000))
        won = self.cache.lease([self.key(i) for i in indexes], ms)
        return [i for i, w in zip(indexes, won) if w], [i for i, w in zip(indexes, won) if not w]

    def _shared_batches(self, indexes: list[int], read: ReadContext, out: dict[int, bytes],
                        leased: list[int]) -> Iterator[list[int]]:
        """Chunks other processes are fetching under their leases: waited for (``CHUNK_WAIT_S`` in all, and at
        most half of what is left of the read's deadline: the rest is for fetching them here). Yields the
        chunks ``fetch_chunks`` is to fetch here: a lease that ended without a value (its holder died) is
        taken over (added to ``leased``), the first waiter to lease the chunk again fetching it while the
        others go on waiting for that one; then what is still missing at the end."""
        until = time.monotonic() + min(CHUNK_WAIT_S, max(0.0, (read.deadline - time.monotonic()) / 2))
        for attempt in range(2):
            keys = [self.key(i) for i in indexes]
            for i, data in zip(indexes, self.cache.wait(keys, max(0.0, until - time.monotonic()))):
                self._shared_chunk(i, data, out)
            indexes = [i for i in indexes if i not in out]
            if not indexes or attempt or time.monotonic() >= until:
                break
            won, indexes = self._lease(indexes, read)
            leased += won
            yield won
        yield indexes

    def _shared_chunk(self, i: int, data: bytes | None, out: dict[int, bytes]) -> bool:
        """Take chunk ``i`` from the shared tier into ``out`` (its flight finished); False when the tier had
        none, or one of another length than this file's chunk ``i`` (fetched instead: never served)."""
        if data is None or len(data) != min(CHUNK, self.size - i * CHUNK):
            return False
        out[i] = data
        self.options.counters.shared(len(data))
        self.finish(i, data, None)
        return True

    def finish(self, i: int, data: bytes | None, error: BaseException | None) -> None:
        self.flights.finish(i, data, error)

    def forget(self, c0: int, c1: int) -> None:
        """Drop chunks [c0, c1) from memory: a stream's reader has read past them (``ckptfs.ahead.fetch``). The
        kernel's page cache keeps what it read, and the ``--cache-dir`` store its copy; the memory goes to the
        stream's next pieces instead of fresh pages."""
        for i in range(c0, c1):
            self.cache.memory.discard(self.key(i))

    # -- fetching ahead of readers (read-ahead, a warm-up) -------------------------------------------------
    def claim(self, c0: int, c1: int) -> list[Run]:
        """Register fetches for the chunks in [c0, c1) that nobody has or fetches; the runs claimed. Readers
        of those chunks wait for them from now on; every claimed run must be given to :meth:`fetch_claimed`
        or :meth:`abandon`."""
        flights, ended = self.flights, self.flights.finished
        held = self.cache.held(self.content_id, range(c0, c1))  # not under the flights' lock: pieces land
        claimed = sorted(cast(int, i) for i in flights.claim(i for i in range(c0, c1) if i not in held))
        if claimed and flights.finished != ended:
            # a fetch ended meanwhile, and a fetch stores its chunks before it ends their flights: one of them
            # may be claimed again here. Asked once more, and ended at once with the stored bytes.
            for i in sorted(self.cache.held(self.content_id, claimed)):
                data = self.cache.get(self.key(i))
                if data is not None:
                    flights.finish(i, data)
                    claimed.remove(i)
        return runs(claimed)

    def fetch_claimed(self, claimed: list[Run], memory: bool = True, slot: Slot | None = None) -> Exception | None:
        """Fetch claimed runs into the chunk cache (best effort, within ``--timeout``): a run that fails is
        left to its readers, who fetch it themselves with their own retries. The first failure is returned.
        ``memory=False``: the chunks go to the ``--cache-dir`` store only (``ChunkCache.put``). ``slot``: the
        origin slot the caller holds for this fetch, given back as soon as a body is in (``ReadContext``)."""
        read = ReadContext.fetching_ahead(self.options.timeout, slot)
        first: Exception | None = None
        for start, stop in claimed:
            try:
                self.fetch_chunks(start, stop, read, memory)
            except Exception as exc:  # noqa: BLE001 - see the docstring
                log.debug("read-ahead of %s chunks %d..%d failed: %s", public_name(self.name), start, stop, exc)
                first = first or exc
        return first

    def abandon(self, claimed: list[Run], error: BaseException) -> None:
        """Give up claimed runs unfetched: their waiters fetch for themselves."""
        for start, stop in claimed:
            for i in range(start, stop):
                self.flights.finish(i, error=error)


def _requests(batches: Iterable[list[int]]) -> Iterator[tuple[int, int]]:
    """The requests that fetch the chunks of ``batches``: each contiguous run of a batch as spans of at most
    ``MAX_REQUEST_BYTES`` (first chunk, end chunk)."""
    step = max(1, MAX_REQUEST_BYTES // CHUNK)
    for batch in batches:
        for r0, r1 in runs(batch):
            for first in range(r0, r1, step):
                yield first, min(r1, first + step)
