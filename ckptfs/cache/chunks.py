"""Fetched remote bytes, kept: a bounded in-memory LRU per process, optionally the ``--cache-dir`` store, and
optionally the fleet's Redis (``--redis``/``--redis-cluster``).

Remote bytes are cached in fixed, aligned chunks (``CHUNK`` bytes; the last chunk of a file may be shorter)
keyed by the source's content identity and the chunk number, so a chunk can never be served for another
file or another version of the same file (in the disk store, the chunks of a run fetched together are one
entry per aligned run of ``STORED_RUN``: see there). The memory LRU is shared by every remote source of the process;
the disk store (``--cache-dir``, shared by every ckptfs process on the machine) makes a remount or a second
process find the bytes without a request. A disk store that fails costs speed, never a read: its errors are
swallowed here (the store itself logs and counts them).

The shared level (``shared_tier``): a Redis tier of the namespace ``BYTES`` (``ckptfs:b1:<digest>``, leases
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

import logging
import os
import threading

import numpy as np

from ckptfs.cache.keys import CacheKey
from ckptfs.cache.lru import BytesLRU
from ckptfs.cache.redis_tier import Namespace

log = logging.getLogger(__name__)

#: Cache and fetch unit. A random read fetches only the chunks covering it (a block group of stored bytes is
#: at most 256 KiB, so at most two chunks); a sequential reader's read-ahead fetches many in one request.
CHUNK = 256 * 1024
#: Twice what remote read-ahead keeps ahead of its reader (128 MiB): chunks that landed ahead of a reader are
#: not evicted by the ones it just read.
DEFAULT_MEMORY_BYTES = 256 * 1024 * 1024


#: Chunks fetched together are kept in the ``--cache-dir`` store as one entry per aligned run of this many
#: (chunks ``4g .. 4g + 3``, 1 MiB; the file's last run may be shorter), not one file per 256 KiB chunk: a
#: warm-up or a stream creates a quarter of the files (each a new inode, an open, a header, a MAC), and a
#: 42 GB checkpoint is 42,000 entries, not 168,000. A chunk fetched alone (a random read) is an entry of its
#: own, as before; a lookup asks for the run's entry, then the chunk's.
STORED_RUN = 4


def chunk_key(content_id: str, index: int) -> CacheKey:
    """The key of fetched chunk ``index`` (bytes ``index * CHUNK`` on) of the file ``content_id``."""
    return CacheKey(content_id, 0, "bytes", "raw", index, index + 1)


def run_key(key: CacheKey) -> CacheKey:
    """The store key of the aligned run of ``STORED_RUN`` chunks that holds chunk ``key``."""
    first = key.start - key.start % STORED_RUN
    return key.with_range(first, first + STORED_RUN)


class MemoryChunks(BytesLRU):
    """Fetched chunks in memory: the package's one LRU (ckptfs.cache.lru), of ``bytes``."""

    def __init__(self, capacity: int = DEFAULT_MEMORY_BYTES):
        super().__init__(capacity)

    def stats(self) -> dict:
        counts = super().stats()
        return {"hits": counts.hits, "misses": counts.misses, "bytes": counts.bytes, "capacity": counts.capacity}


MEMORY = MemoryChunks()

_stores: dict[tuple[str, int, str | None], object] = {}
_stores_lock = threading.Lock()


def disk_store(root: str | None, max_bytes: int, key_file: str | None = None):
    """The shared ``DiskStore(root, max_bytes, namespace="bytes", key_file)`` for ``--cache-dir`` (one per
    process, directory and key), or None when no directory is set or the store cannot be made (a folder this
    user must not trust included: its bytes are then fetched, never read from it). Its entries are
    authenticated like the decoded groups' (``auth.py``)."""
    if not root:
        return None
    with _stores_lock:
        store = _stores.get((root, max_bytes, key_file))
        if store is None:
            try:
                from ckptfs.cache.disk import DiskStore

                store = DiskStore(root, max_bytes, namespace="bytes", key_file=key_file)
            except Exception as exc:  # noqa: BLE001 - a cache that cannot open costs speed, not the read
                log.warning("remote byte cache in %s not used: %s", root, exc)
                store = False
            _stores[(root, max_bytes, key_file)] = store
    return store or None


#: A fetched chunk's lease lasts as long as its holder's fetch may (the read's ``--timeout`` left: by then
#: the holder has stored the chunk or released the lease), at least ``CHUNK_LEASE_MS``; a waiter waits at
#: most ``CHUNK_WAIT_S`` in all (under ``--stall-timeout``'s default 10 s: a reader waiting for the waiter's
#: fetch does not give up on it first), then fetches the chunk itself.
CHUNK_LEASE_MS = 5000
CHUNK_WAIT_S = 8.0

#: The shared tier's namespace of fetched chunks (the decoded groups' is ``redis_tier.GROUPS``).
BYTES = Namespace("ckptfs:b1:", "ckptfs:bl1:", CHUNK_LEASE_MS, CHUNK_WAIT_S)

_shared_tiers: dict[tuple, object] = {}


def shared_tier(redis: str | None, redis_cluster: tuple[str, ...] = (), key_file: str | None = None):
    """The process's Redis tier of fetched chunks for this Redis (or cluster) and key (see the module
    docstring), or None when none is given or it cannot be made (logged once; the chunks are then fetched
    as without it)."""
    if not redis and not redis_cluster:
        return None
    spec = ("cluster", tuple(redis_cluster), key_file) if redis_cluster else ("redis", redis, key_file)
    with _stores_lock:
        tier = _shared_tiers.get(spec)
        if tier is None:
            try:
                if redis_cluster:
                    from ckptfs.cache.redis_cluster import RedisClusterTier

                    tier = RedisClusterTier(tuple(redis_cluster), key_file=key_file, namespace=BYTES)
                else:
                    from ckptfs.cache.redis_tier import RedisTier

                    tier = RedisTier(redis, key_file=key_file, namespace=BYTES)
            except Exception as exc:  # noqa: BLE001 - a tier that cannot be made costs speed, not the read
                log.warning("fetched chunks not shared through %s: %s", "the Redis Cluster" if redis_cluster
                            else "Redis", exc)
                tier = False
            _shared_tiers[spec] = tier
    return tier or None


def shared_stats() -> dict[str, dict]:
    """``{tier name: counters}`` of this process's shared chunk tiers (``ckptfs stats``: ``chunk_*``)."""
    with _stores_lock:
        tiers = [tier for tier in _shared_tiers.values() if tier]
    return {tier.name: tier.stats() for tier in tiers}


def _fresh_locks_in_child() -> None:
    # a read-ahead thread of the parent may have held a lock at fork; in the child nobody would release it
    global _stores_lock
    MEMORY.reset_lock()
    _stores_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_in_child)


class ChunkCache:
    """Memory first, then the disk store (when given); what is found on disk is promoted to memory. ``shared``
    (a ``shared_tier``, when given) is the level below both, asked in batches by the source itself
    (``lookup``, ``lease``, ``wait``, ``release``): what it answers is kept in memory and on disk, and what
    is ``put`` goes to it too."""

    def __init__(self, disk=None, memory: MemoryChunks = MEMORY, shared=None):
        self.memory = memory
        self.disk = disk
        self.shared = shared

    def get(self, key: CacheKey) -> bytes | None:
        data = self.memory.get(key)
        if data is not None or self.disk is None:
            return data
        try:
            data = self._from_run(key) if self.disk.contains(run_key(key)) else self.disk.get(key)
        except Exception as exc:  # noqa: BLE001 - see the module docstring
            log.debug("disk cache get failed: %s", exc)
            return None
        if data is not None:
            data = bytes(data)
            self.memory.put(key, data)
        return data

    def _from_run(self, key: CacheKey) -> bytes | None:
        """Chunk ``key`` from its run's store entry; the run's other chunks go to memory too (a reader of one
        usually reads its neighbours)."""
        run = run_key(key)
        values = self.disk.get_array(run)
        if values is None:
            return self.disk.get(key)
        payload = memoryview(values).cast("B")
        found = None
        for k, at in enumerate(range(0, len(payload), CHUNK)):
            chunk = payload[at: at + CHUNK].tobytes()
            if run.start + k == key.start:
                found = chunk
            else:
                self.memory.put(key.with_range(run.start + k, run.start + k + 1), chunk)
        return found

    def has(self, key: CacheKey) -> bool:
        """In memory or on disk (read-ahead must not fetch what the disk store holds)."""
        return key in self.memory or self.stored(key)

    def stored(self, key: CacheKey) -> bool:
        """In the disk store: an entry of its own or its run's (what this process holds in memory aside)."""
        return key.start in self.stored_chunks(key.content_id, (key.start,))

    def held(self, content_id: str, indexes) -> set[int]:
        """Of the chunks ``indexes`` (sorted) of the file ``content_id``, those in memory or in the disk store:
        ``has`` for many chunks at once (read-ahead and a warm-up claim pieces of up to a few hundred)."""
        found = {i for i in indexes if chunk_key(content_id, i) in self.memory}
        return found | self.stored_chunks(content_id, [i for i in indexes if i not in found])

    def stored_chunks(self, content_id: str, indexes) -> set[int]:
        """Of the chunks ``indexes`` (sorted) of the file ``content_id``, those the disk store holds: ``stored``
        for many chunks at once, asking once per aligned run (a warm-up checks a whole checkpoint's chunks
        several times: 168,000 for a 42 GB one), and for a chunk's own entry only where its run has none."""
        found: set[int] = set()
        if self.disk is None:
            return found
        run_start, run_stored = -1, False
        try:
            for i in indexes:
                if i - i % STORED_RUN != run_start:
                    run_start = i - i % STORED_RUN
                    run_stored = self.disk.contains(run_key(chunk_key(content_id, run_start)))
                if run_stored or self.disk.contains(chunk_key(content_id, i)):
                    found.add(i)
        except Exception:  # noqa: BLE001 - see the module docstring: what could not be asked is not stored
            pass
        return found

    def put_run(self, keys: list[CacheKey], parts: list[bytes], chunks: int, memory: bool = True) -> None:
        """``put`` of consecutive chunks fetched together (``parts[k]`` for ``keys[k]``) of a file of ``chunks``
        chunks: each aligned run of ``STORED_RUN`` among them (or the file's last run, when they reach its end)
        becomes one store entry, the others an entry each."""
        grouped: set[int] = set()
        if self.disk is not None and keys:
            first, end = keys[0].start, keys[0].start + len(parts)
            for g in range(-(-first // STORED_RUN) * STORED_RUN, end, STORED_RUN):
                stop = min(g + STORED_RUN, chunks)
                if stop > end:
                    break
                if stop - g < 2:
                    continue  # a last run of one chunk: an entry of its own
                run = parts[g - first: stop - first]
                try:
                    written = self.disk.put_parts(run_key(keys[g - first]), run)
                except Exception as exc:  # noqa: BLE001 - see the module docstring
                    log.debug("disk cache put failed: %s", exc)
                    written = False
                if written:  # else its chunks are offered one by one below
                    grouped.update(range(g - first, stop - first))
        for k, (key, data) in enumerate(zip(keys, parts)):
            if k in grouped:  # on disk already, in its run's entry
                if memory:
                    self.memory.put(key, data)
                self._share(key, data)
            else:
                self.put(key, data, memory=memory)

    def put(self, key: str, data: bytes, persist: bool = True, memory: bool = True) -> None:
        """Keep ``data`` (fetched from the origin) in memory, on disk with ``persist``, and in the shared tier.
        ``memory=False`` (a warm-up's bytes, fetched for the store): not in the memory LRU when the disk store
        takes them, so a whole checkpoint streaming into the store does not evict what readers use."""
        self._keep(key, data, persist, memory)
        self._share(key, data)

    def _share(self, key: str, data: bytes) -> None:
        if self.shared is not None:
            self._shared("put", key, np.frombuffer(data, np.uint8))

    def _keep(self, key: str, data: bytes, persist: bool = True, memory: bool = True) -> None:
        if memory or not persist or self.disk is None:
            self.memory.put(key, data)
        if persist and self.disk is not None:
            try:
                self.disk.put(key, data)
            except Exception as exc:  # noqa: BLE001 - see the module docstring
                log.debug("disk cache put failed: %s", exc)

    # -- the shared level -----------------------------------------------------------------------------
    def lookup(self, keys: list[str]) -> list[bytes | None]:
        """The shared tier's chunks for ``keys`` (None for each it lacks), one round trip per endpoint."""
        return self._taken(keys, self._shared("get_many", keys))

    def lease(self, keys: list[str], ms: int | None = None) -> list[bool]:
        """For each of ``keys``: True when this process should fetch it (it holds its lease now, for ``ms``,
        or the tier cannot say), False when another process is fetching it (``wait`` for it)."""
        won = self._shared("lease_many", keys, ms)
        return list(won) if won is not None else [True] * len(keys)

    def wait(self, keys: list[str], timeout: float) -> list[bytes | None]:
        """Chunks other processes fetch under their leases, once stored; None for each whose lease ended
        without a value, or past ``timeout``: fetch those here."""
        return self._taken(keys, self._shared("wait_many", keys, timeout))

    def release(self, keys: list[str]) -> None:
        """Give up the leases of ``keys`` unfetched (the fetch failed): their waiters fetch them at once."""
        if keys:
            self._shared("release_many", keys)

    def _taken(self, keys: list[str], values) -> list[bytes | None]:
        out: list[bytes | None] = [None] * len(keys)
        for i, (key, value) in enumerate(zip(keys, values or ())):
            if value is not None:
                out[i] = value.tobytes()
                self._keep(key, out[i])
        return out

    def _shared(self, method: str, *args):
        if self.shared is None:
            return None
        try:
            return getattr(self.shared, method)(*args)
        except Exception as exc:  # noqa: BLE001 - see the module docstring
            log.warning("shared chunk tier %s: %s failed: %s: %s", self.shared.name, method, type(exc).__name__, exc)
            return None
