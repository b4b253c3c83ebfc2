"""A bytes-bounded, thread-safe LRU of decoded block groups.

One cache serves every tensor of a checkpoint (or a mount), so ``--cache-size`` bounds the daemon's decoded
data as a whole. Concurrent readers asking for the same missing group wait for a single decode instead of
each doing it (FUSE runs many reader threads, and the kernel's readahead sends neighbouring requests at
once). Counters are exact: a lookup is either a hit or a miss, never both.

The interface is ``get_or_load(key, loader)`` so that a shared or remote cache (Redis) can replace it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np


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


class BlockCache:
    """LRU of read-only numpy arrays, bounded by the sum of their ``nbytes``."""

    def __init__(self, capacity_bytes: int):
        self.capacity = max(0, int(capacity_bytes))
        self._entries: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._inflight: dict[Hashable, _InFlight] = {}
        self._lock = threading.Lock()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    def get_or_load(self, key: Hashable, loader: Callable[[], np.ndarray]) -> np.ndarray:
        """The cached value for ``key``, or ``loader()``'s result, cached if it fits."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return value
            self._misses += 1
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
            value = loader()
            value.setflags(write=False)
            pending.value = value
            with self._lock:
                self._insert(key, value)
            return value
        except BaseException as exc:
            pending.error = exc
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            pending.done.set()

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

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, len(self._entries), self._bytes,
                              self.capacity)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
