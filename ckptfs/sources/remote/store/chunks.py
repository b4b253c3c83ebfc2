"""Fetched remote bytes, kept: a bounded in-memory LRU per process, optionally the ``--cache-dir`` store, and
optionally the fleet's Redis (``--redis``/``--redis-cluster``).

Remote bytes are cached in fixed, aligned chunks (``CHUNK`` bytes; the last chunk of a file may be shorter)
keyed by the source's content identity and the chunk number, so a chunk can never be served for another
file or another version of the same file. The memory LRU is shared by every remote source of the process;
the store (``--cache-dir``, shared by every ckptfs process on the machine, behind the ``ChunkStore``
protocol: one sparse file per remote file, ``sparse_store.py``) makes a remount or a second process find
the bytes without a request, and its byte-range leases make the processes of one machine fetch each chunk
once. A store that fails costs speed, never a read: its errors are swallowed here (the store itself logs
and counts them).

The shared level (``SharedChunkTiers.tier``): a Redis tier of the namespace ``BYTES`` (``ckptfs:b1:<digest>``, leases
``ckptfs:bl1:<digest>``; the decoded groups' entry format, checks and key, ``entry.py``, ``auth.py``), so a
fleet mounting one remote checkpoint fetches each chunk from the origin once: a source asks it for a piece's
chunks in one round trip, leases the missing ones in another, fetches only those it won and waits for the
others (``ckptfs.sources.remote.transport``). It is one tier object per process and Redis (the decoded
groups' tier is another: each has its own counters, breaker and writer), made at a source's first read,
never while a checkpoint's headers are read (a mount forks its daemon after that). With both ``--redis``
and ``--redis-cluster`` the chunks go to the cluster (it spreads their egress over its nodes). Every call to
it is guarded: a tier that fails (or a bug in it) is a miss, never a failed read.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ckptfs.cache.keys import CacheKey
from ckptfs.cache.lru import BytesLRU
from ckptfs.cache.redis_tier import Namespace
from ckptfs.core.runtime import Part, runtime
from ckptfs.sources.remote.store import sparse_store
from ckptfs.sources.remote.store.chunk_store import ChunkStore
from ckptfs.sources.remote.store.sparse_store import DEFAULT_MIN_FREE, SparseStore
from ckptfs.util.forks import after_fork_in_child
from ckptfs.util.keyed import MadeOnce

if TYPE_CHECKING:  # imported when fetched chunks are shared through Redis
    import numpy as np

    from ckptfs.cache.redis_tier import RedisTier

T = TypeVar("T")

log = logging.getLogger(__name__)

#: Cache and fetch unit. A random read fetches only the chunks covering it (a block group of stored bytes is
#: at most 256 KiB, so at most two chunks); a sequential reader's read-ahead fetches many in one request.
CHUNK = sparse_store.CHUNK
#: Twice what remote read-ahead keeps ahead of its reader (128 MiB): chunks that landed ahead of a reader are
#: not evicted by the ones it just read.
DEFAULT_MEMORY_BYTES = 256 * 1024 * 1024


#: Chunks fetched together are fetched and written as runs; this many (1 MiB) is what a warm-up asks the
#: store to have room for at least (``ckptfs.sources.remote.warmup``).
STORED_RUN = 4


def chunk_key(content_id: str, index: int) -> CacheKey:
    """The key of fetched chunk ``index`` (bytes ``index * CHUNK`` on) of the file ``content_id``."""
    return CacheKey(content_id, 0, "bytes", "raw", index, index + 1)


class MemoryChunks(BytesLRU[bytes]):
    """Fetched chunks in memory: the package's one LRU (ckptfs.cache.lru), of ``bytes``."""

    def __init__(self, capacity: int = DEFAULT_MEMORY_BYTES) -> None:
        super().__init__(capacity)

    def in_child(self) -> MemoryChunks:
        """In a forked child: the chunks the parent fetched (a mount's header, read before its daemon forks),
        under a fresh lock (a parent's read-ahead thread may have held it at fork)."""
        self.reset_lock()
        return self


#: A runtime's fetched chunks in memory (``RemoteOptions.chunk_cache``): one LRU for every remote source.
MEMORY_CHUNKS = Part("fetched chunks in memory", MemoryChunks, MemoryChunks.in_child)

_stores: dict[tuple[str, int, str | None, float], SparseStore | Literal[False]] = {}  # False: cannot open
_stores_lock = threading.Lock()


def disk_store(root: str | None, max_bytes: int, key_file: str | None = None,
               min_free: float = DEFAULT_MIN_FREE) -> ChunkStore | None:
    """The shared ``SparseStore`` of fetched bytes for ``--cache-dir`` (one per process, directory, bound and
    key; ``sparse_store.py``), or None when no directory is set or the store cannot be made (a folder this
    user must not trust included: its bytes are then fetched, never read from it)."""
    if not root:
        return None
    spec = (root, max_bytes, key_file, min_free)
    with _stores_lock:
        store = _stores.get(spec)
        if store is None:
            try:
                store = SparseStore(root, max_bytes, key_file=key_file, min_free=min_free)
            except Exception as exc:  # noqa: BLE001 - a cache that cannot open costs speed, not the read
                log.warning("remote byte cache in %s not used: %s", root, exc)
                store = False
            _stores[spec] = store
    return store or None


#: A fetched chunk's lease lasts as long as its holder's fetch may (the read's ``--timeout`` left: by then
#: the holder has stored the chunk or released the lease), at least ``CHUNK_LEASE_MS``; a waiter waits at
#: most ``CHUNK_WAIT_S`` in all (under ``--stall-timeout``'s default 10 s: a reader waiting for the waiter's
#: fetch does not give up on it first), then fetches the chunk itself.
CHUNK_LEASE_MS = 5000
CHUNK_WAIT_S = 8.0

#: The shared tier's namespace of fetched chunks (the decoded groups' is ``redis_tier.GROUPS``).
BYTES = Namespace("ckptfs:b1:", "ckptfs:bl1:", CHUNK_LEASE_MS, CHUNK_WAIT_S)

class SharedChunkTiers:
    """A runtime's Redis tiers of fetched chunks, one per server (or cluster) and key: the connections and
    counters every remote source of the runtime that names that Redis shares."""

    def __init__(self) -> None:
        #: False: a tier that cannot be made (said once)
        self._tiers: MadeOnce[tuple[str, object, str | None], RedisTier | Literal[False]] = MadeOnce()

    def tier(self, redis: str | None, redis_cluster: tuple[str, ...] = (),
             key_file: str | None = None) -> RedisTier | None:
        """The tier of fetched chunks for this Redis (or cluster) and key (see the module docstring), or None
        when none is given or it cannot be made (logged once; the chunks are then fetched as without it)."""
        if not redis and not redis_cluster:
            return None
        spec = ("cluster", tuple(redis_cluster), key_file) if redis_cluster else ("redis", redis, key_file)
        return self._tiers.get(spec, lambda: _made_tier(redis, tuple(redis_cluster), key_file)) or None

    def stats(self) -> dict[str, dict[str, Any]]:
        """``{tier name: counters}`` of these tiers (``ckptfs stats``: ``chunk_*``)."""
        return {tier.name: tier.stats() for _, tier in self._tiers.items() if tier}

    def in_child(self) -> SharedChunkTiers:
        """In a forked child: the same tiers under a fresh lock (redis-py's connection pools make new
        connections in a process other than the one that made theirs)."""
        self._tiers.in_child()
        return self


def _made_tier(redis: str | None, redis_cluster: tuple[str, ...], key_file: str | None) -> RedisTier | Literal[False]:
    """A Redis tier of fetched chunks, or False when it cannot be made (said in one log line)."""
    try:
        if redis_cluster:
            from ckptfs.cache.redis_cluster import RedisClusterTier

            return RedisClusterTier(redis_cluster, key_file=key_file, namespace=BYTES)
        from ckptfs.cache.redis_tier import RedisTier

        assert redis is not None  # one of the two is given
        return RedisTier(redis, key_file=key_file, namespace=BYTES)
    except Exception as exc:  # noqa: BLE001 - a tier that cannot be made costs speed, not the read
        log.warning("fetched chunks not shared through %s: %s", "the Redis Cluster" if redis_cluster else "Redis",
                    exc)
        return False


#: A runtime's Redis tiers of fetched chunks (``RemoteOptions.chunk_cache``, ``ckptfs stats``).
SHARED_CHUNK_TIERS = Part("shared tiers of fetched chunks", SharedChunkTiers, SharedChunkTiers.in_child)


def _fresh_locks_in_child() -> None:
    # a read-ahead thread of the parent may have held a lock at fork; in the child nobody would release it
    global _stores_lock
    _stores_lock = threading.Lock()
    for store in _stores.values():
        if store:
            store.forget_files()  # the parent's open files hold the parent's leases


after_fork_in_child(_fresh_locks_in_child)


class ChunkCache:
    """Memory first, then the chunk store (``disk``, a ``ChunkStore`` when given); what is found in the store
    is promoted to memory. ``redis`` (a ``SharedChunkTiers.tier``, when given) is the level below both. The source
    asks the coordination level in batches (``lookup``, ``lease``, ``wait``, ``release``): the store's
    byte-range leases keep the processes of one machine to one fetch per chunk, the Redis tier's leases
    (when present) the machines of a fleet; what it answers is kept in memory and in the store, and what is
    ``put`` goes to Redis too."""

    def __init__(self, disk: ChunkStore | None = None, memory: MemoryChunks | None = None,
                 shared: RedisTier | None = None) -> None:
        self.memory = memory if memory is not None else runtime().get(MEMORY_CHUNKS)
        self.disk = disk
        self.redis = shared
        self._redis_waits: set[CacheKey] = set()  # leased in the store, waited for in Redis
        self._lock = threading.Lock()

    @property
    def shared(self) -> RedisTier | ChunkStore | None:
        """The coordination level: the Redis tier when there is one, else the store (None: neither, and a
        source fetches what it lacks without asking)."""
        return self.redis if self.redis is not None else self.disk

    def get(self, key: CacheKey) -> bytes | None:
        data = self.memory.get(key)
        if data is not None or self.disk is None:
            return data
        data = self._store(self.disk.get, None, key.content_id, key.start)
        if data is not None:
            self.memory.put(key, data)
        return data

    def has(self, key: CacheKey) -> bool:
        """In memory or in the store (read-ahead must not fetch what the store holds)."""
        return key in self.memory or self.stored(key)

    def stored(self, key: CacheKey) -> bool:
        """In the store (what this process holds in memory aside)."""
        return key.start in self.stored_chunks(key.content_id, (key.start,))

    def held(self, content_id: str, indexes: Sequence[int]) -> set[int]:
        """Of the chunks ``indexes`` of the file ``content_id``, those in memory or in the store: ``has`` for
        many chunks at once (read-ahead and a warm-up claim pieces of up to a few hundred)."""
        found = {i for i in indexes if chunk_key(content_id, i) in self.memory}
        return found | self.stored_chunks(content_id, [i for i in indexes if i not in found])

    def stored_chunks(self, content_id: str, indexes: Sequence[int]) -> set[int]:
        """Of the chunks ``indexes`` of the file ``content_id``, those the store holds (one read of its index)."""
        if self.disk is None:
            return set()
        return self._store(self.disk.stored_chunks, set(), content_id, indexes)

    def put_run(self, keys: list[CacheKey], parts: list[bytes], chunks: int, memory: bool = True) -> None:
        """``put`` of consecutive chunks fetched together (``parts[k]`` for ``keys[k]``) of a file of
        ``chunks`` chunks: one write to the store (past the page cache without ``memory``: a warm-up's bytes,
        which no reader waits for)."""
        if not keys:
            return
        if self.disk is not None:
            self._store(self.disk.put_chunks, False, keys[0].content_id, keys[0].start, parts, chunks, not memory)
        for key, data in zip(keys, parts):
            if memory or self.disk is None:
                self.memory.put(key, data)
            self._share(key, data)

    def landing(self, nbytes: int) -> contextlib.AbstractContextManager[memoryview] | None:
        """Where a warm-up's body of ``nbytes`` may land to be stored from (``ChunkStore.landing``: no copy,
        no fresh pages), or None where its chunks go beyond the store too (a shared Redis tier is handed
        them) or there is no store."""
        if self.disk is None or self.redis is not None:
            return None
        return self._store(self.disk.landing, None, nbytes)

    def let_go_of_landings(self) -> None:
        """The store's landing buffers not lent now are given back to the system (a warm-up has ended)."""
        if self.disk is not None:
            self._store(self.disk.let_go_of_landings, None)

    def store_landed(self, keys: list[CacheKey], views: list[memoryview], chunks: int) -> None:
        """``put_run`` of a warm-up's chunks that landed in a ``landing`` buffer (``views`` of it, one per key):
        to the store only, written from where they are."""
        if keys and self.disk is not None:
            self._store(self.disk.put_chunks, False, keys[0].content_id, keys[0].start, views, chunks, True)

    def put(self, key: CacheKey, data: bytes, persist: bool = True, memory: bool = True) -> None:
        """Keep ``data`` (fetched from the origin) in memory, in the store with ``persist``, and in the shared
        tier. ``memory=False`` (a warm-up's bytes, fetched for the store): not in the memory LRU when the
        store takes them, so a whole checkpoint streaming into the store does not evict what readers use."""
        self._keep(key, data, persist, memory)
        self._share(key, data)

    def _share(self, key: CacheKey, data: bytes) -> None:
        if self.redis is not None:
            import numpy as np

            self._redis(self.redis.put, key, np.frombuffer(data, np.uint8))

    def _keep(self, key: CacheKey, data: bytes, persist: bool = True, memory: bool = True) -> None:
        if memory or not persist or self.disk is None:
            self.memory.put(key, data)
        if persist and self.disk is not None:
            self._store(self.disk.put_chunks, False, key.content_id, key.start, [data], None)

    def local_copy(self, content_id: str, size: int) -> tuple[int, int, int, int] | None:
        """The store's complete copy of the file and its check gate (``ChunkStore.sealed_copy``), or None."""
        if self.disk is None:
            return None
        return self._store(self.disk.sealed_copy, None, content_id, size)

    # -- the coordination level -----------------------------------------------------------------------
    def lookup(self, keys: list[CacheKey]) -> list[bytes | None]:
        """The chunks the store (stored since the caller looked) or the Redis tier hold for ``keys`` (None
        for each they lack), one round trip per Redis endpoint."""
        out: list[bytes | None] = [None] * len(keys)
        if self.disk is not None and keys:
            stored = self.stored_chunks(keys[0].content_id, [key.start for key in keys])
            for k, key in enumerate(keys):
                if key.start in stored:
                    out[k] = self.get(key)
        missing = [k for k, value in enumerate(out) if value is None]
        if self.redis is not None and missing:
            asked = [keys[k] for k in missing]
            for k, value in zip(missing, self._taken(asked, self._redis(self.redis.get_many, asked))):
                out[k] = value
        return out

    def lease(self, keys: list[CacheKey], ms: int | None = None) -> list[bool]:
        """For each of ``keys`` (chunks of one file): True when this process should fetch it (it holds its
        lease in the store and in Redis, for ``ms``, or they cannot say), False when another process is
        fetching it (``wait`` for it)."""
        won = [True] * len(keys)
        if self.disk is not None and keys:
            won = self._store(self.disk.lease, won, keys[0].content_id, [key.start for key in keys])
        local = [key for key, w in zip(keys, won) if w]
        if self.redis is not None and local:
            remote = self._redis(self.redis.lease_many, local, ms)
            remote = list(remote) if remote is not None else [True] * len(local)
            lost = {key for key, w in zip(local, remote) if not w}
            with self._lock:
                self._redis_waits |= lost
            won = [w and key not in lost for key, w in zip(keys, won)]
        return won

    def wait(self, keys: list[CacheKey], timeout: float) -> list[bytes | None]:
        """Chunks other processes fetch under their leases, once stored; None for each whose lease ended
        without a value, or past ``timeout``: fetch those here."""
        with self._lock:
            remote = [key for key in keys if key in self._redis_waits]
            self._redis_waits.difference_update(remote)
        local = [key for key in keys if key not in set(remote)]
        found: dict[CacheKey, bytes | None] = {}
        if remote and self.redis is not None:  # waited for in Redis only where there is a Redis tier
            found.update(zip(remote, self._taken(remote, self._redis(self.redis.wait_many, remote, timeout))))
            if self.disk is not None:  # (the store's leases of the chunks Redis answered went with their put)
                self._store(self.disk.release, None, remote[0].content_id,
                            [key.start for key in remote if found[key] is None])
        if local and self.disk is not None:
            nothing: list[bytes | None] = [None] * len(local)
            values = self._store(self.disk.wait, nothing, local[0].content_id, [key.start for key in local], timeout)
            for key, value in zip(local, values):
                found[key] = value
                if value is not None:
                    self.memory.put(key, value)
        return [found.get(key) for key in keys]

    def release(self, keys: list[CacheKey]) -> None:
        """Give up the leases of ``keys`` unfetched (the fetch failed): their waiters fetch them at once."""
        if not keys:
            return
        if self.disk is not None:
            self._store(self.disk.release, None, keys[0].content_id, [key.start for key in keys])
        if self.redis is not None:
            self._redis(self.redis.release_many, keys)

    def _taken(self, keys: list[CacheKey], values: Sequence[np.ndarray | None] | None) -> list[bytes | None]:
        out: list[bytes | None] = [None] * len(keys)
        for i, (key, value) in enumerate(zip(keys, values or ())):
            if value is not None:
                taken = out[i] = value.tobytes()
                self._keep(key, taken)
        return out

    def _store(self, method: Callable[..., T], failed: T, *args: Any) -> T:
        """``method(*args)``, a method of the store (``ChunkStore``); ``failed`` when it raises: a store that
        fails (or a bug in it) costs speed, never a read."""
        try:
            return method(*args)
        except Exception as exc:  # noqa: BLE001 - see the module docstring
            log.debug("chunk store %s failed: %s: %s", method.__name__, type(exc).__name__, exc)
            return failed

    def _redis(self, method: Callable[..., T], *args: Any) -> T | None:
        try:
            return method(*args)
        except Exception as exc:  # noqa: BLE001 - see the module docstring
            log.warning("shared chunk tier %s: %s failed: %s: %s", self.redis.name if self.redis else "?",
                        method.__name__,
                        type(exc).__name__, exc)
            return None
