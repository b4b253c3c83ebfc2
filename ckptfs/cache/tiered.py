"""Decoded block groups, cached in tiers: memory first, then optional shared tiers (disk, Redis).

The block engine talks to one :class:`TieredCache`. Its first tier is always the memory LRU
(:class:`BlockCache`, bytes-bounded, thread-safe), which bounds the daemon's decoded data as a whole
(``--cache-size``). Lower tiers (``ckptfs.cache.build``: a disk folder shared by the processes of a machine, a
Redis server shared by machines) implement the :class:`CacheTier` protocol. A lookup goes memory, then each
lower tier in order, then the decoder; what was found lower is promoted to the tiers above it, and what was
decoded is offered to every tier.

Keys are strings built in one place (:func:`cache_key`) from the checkpoint file's *content identity*
(``ckptfs.sources.identity``), the storage type, the output dtype and the decoded block range, so a tier
shared by processes never serves one file's groups for another.

Concurrent readers asking for the same missing group wait for a single decode instead of each doing it
(FUSE runs many reader threads, and the kernel's readahead sends neighbouring requests at once). Counters
are exact: a lookup in a tier is either a hit or a miss of that tier, never both.

A lower tier must never fail a read: ``get`` answers None and ``put`` returns quietly when the tier is down,
full, slow or corrupt (the tier logs once and counts); :class:`TieredCache` still guards each call, so a
tier's bug costs speed, never a read.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)


def cache_key(content_id: str, offset: int, storage_type: str, dtype: str, b0: int, b1: int) -> str:
    """The key of decoded blocks [b0, b1) of the tensor stored at ``offset`` of the file ``content_id``.

    The block range names the decoded blocks themselves: tensors sharing a data offset (deduplicated data)
    share their groups, but a shorter tensor's last group, cut at its end, is not the longer one's.
    """
    return f"{content_id}|{offset}|{storage_type}|{dtype}|{b0}-{b1}"


class CacheTier:
    """The protocol of a cache tier (see the module docstring); the memory LRU is one implementation."""

    name: str

    def get(self, key: str) -> np.ndarray | None:  # pragma: no cover - interface
        raise NotImplementedError

    def put(self, key: str, value: np.ndarray) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def contains(self, key: str) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def stats(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        """Release what the tier holds (connections, descriptors)."""


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    bytes: int = 0
    capacity: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class _InFlight:
    """A decode in progress: other readers of the same key wait on it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: np.ndarray | None = None
        self.error: BaseException | None = None


class BlockCache(CacheTier):
    """The memory tier: an LRU of read-only numpy arrays, bounded by the sum of their ``nbytes``."""

    name = "memory"

    def __init__(self, capacity_bytes: int):
        self.capacity = max(0, int(capacity_bytes))
        self._entries: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._single_flight = TieredCache([self])

    def get(self, key: Hashable) -> np.ndarray | None:
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return value

    def put(self, key: Hashable, value: np.ndarray) -> None:
        with self._lock:
            self._insert(key, value)

    def get_or_load(self, key: Hashable, loader: Callable[[], np.ndarray]) -> np.ndarray:
        """The cached value for ``key``, or ``loader()``'s result, cached if it fits (this tier alone)."""
        return self._single_flight.get_or_load(key, loader)

    def _insert(self, key: Hashable, value: np.ndarray) -> None:
        size = value.nbytes
        if size > self.capacity:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        while self._entries and self._bytes + size > self.capacity:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes
            self._evictions += 1
        self._entries[key] = value
        self._bytes += size

    def contains(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    __contains__ = contains

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, len(self._entries), self._bytes,
                              self.capacity)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    close = clear


def _tier_counters(tier: CacheTier) -> dict:
    stats = tier.stats()
    return stats.as_dict() if isinstance(stats, CacheStats) else dict(stats)


class TieredCache:
    """What the block engine talks to: the memory tier, then lower tiers, then the decoder.

    ``tiers[0]`` must be the memory tier. ``decoded_bytes`` counts the loader's output produced in this
    process (the stats' ``decoded_bytes``).
    """

    def __init__(self, tiers: Sequence[CacheTier]):
        if not tiers:
            raise ValueError("a TieredCache needs at least the memory tier")
        self.tiers = list(tiers)
        self.memory = self.tiers[0]
        self._lower = self.tiers[1:]
        self._inflight: dict[Hashable, _InFlight] = {}
        self._lock = threading.Lock()
        self.decoded_bytes = 0

    @property
    def capacity(self) -> int:
        return self.memory.capacity

    @property
    def shared_tiers(self) -> bool:
        """Whether tiers below memory are configured (whole-tensor reads then go through them too)."""
        return bool(self._lower)

    def get_or_load(self, key: Hashable, loader: Callable[[], np.ndarray], memory: bool = True) -> np.ndarray:
        """``memory=False``: look in and fill the lower tiers only (a whole-tensor read through the API finds
        what other processes decoded without churning this process's LRU with groups read once)."""
        if memory:
            value = self.memory.get(key)
            if value is not None:
                return value
        with self._lock:
            pending = self._inflight.get(key)
            owner = pending is None
            if owner:
                pending = self._inflight[key] = _InFlight()
        if not owner:
            pending.done.wait()
            if pending.error is not None:
                raise pending.error
            return pending.value
        try:
            value = self._load(key, loader, 0 if memory else 1)
            pending.value = value
            return value
        except BaseException as exc:
            pending.error = exc
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            pending.done.set()

    def _load(self, key: Hashable, loader: Callable[[], np.ndarray], first: int = 0) -> np.ndarray:
        for depth, tier in enumerate(self._lower, start=1):
            value = self._guard(tier, "get", key)
            if value is not None:
                value.setflags(write=False)
                for upper in self.tiers[first:depth]:
                    self._guard(upper, "put", key, value)
                return value
        value = loader()
        value.setflags(write=False)
        with self._lock:
            self.decoded_bytes += value.nbytes
        for tier in self.tiers[first:]:
            self._guard(tier, "put", key, value)
        return value

    @staticmethod
    def _guard(tier: CacheTier, method: str, *args):
        if tier.name == "memory":
            return getattr(tier, method)(*args)
        try:
            return getattr(tier, method)(*args)
        except Exception as exc:  # noqa: BLE001 - a tier's failure costs speed, never a read
            log.warning("cache tier %s: %s failed: %s: %s", tier.name, method, type(exc).__name__, exc)
            return None

    def __contains__(self, key: Hashable) -> bool:
        """Whether the memory tier holds ``key`` (read-ahead asks this to skip decoded groups cheaply)."""
        return self.memory.contains(key)

    def stats(self) -> CacheStats:
        """The memory tier's counters (what ``cache`` in the mount's stats has always held)."""
        return self.memory.stats()

    def tier_stats(self) -> dict[str, dict]:
        """``{tier name: {"hits", "misses", "bytes", ...}}`` for every configured tier, memory first."""
        return {tier.name: _tier_counters(tier) for tier in self.tiers}

    def clear(self) -> None:
        """Drop the memory tier's entries (shared tiers keep theirs: other processes use them)."""
        self.memory.clear()

    def close(self) -> None:
        for tier in self.tiers:
            self._guard(tier, "close")
