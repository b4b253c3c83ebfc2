"""The one bytes-bounded LRU of the package: decoded groups (the memory tier) and fetched remote chunks
(``ckptfs.sources.remote.store.chunks``) are each one instance of it.

Values are buffers (numpy arrays, bytes); the bound is the sum of their sizes. A value larger than the whole
capacity is not kept (it would evict everything for one entry). Thread-safe; counters are exact.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar, Union

if TYPE_CHECKING:  # (numpy is imported where values are decoded: a remote fetch does not need it)
    import numpy as np

#: What the LRU holds: buffers whose size it can tell.
Buffer = Union["np.ndarray", bytes, bytearray, memoryview]
V = TypeVar("V", bound=Buffer)


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


def size_of(value: Buffer) -> int:
    """Bytes a value holds: ``nbytes`` for arrays and memoryviews, ``len`` for bytes."""
    return len(value) if isinstance(value, (bytes, bytearray)) else int(value.nbytes)


class BytesLRU(Generic[V]):
    """An LRU of buffers bounded by the sum of their sizes (see the module docstring)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = max(0, int(capacity_bytes))
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return value

    def put(self, key: Hashable, value: V) -> None:
        size = size_of(value)
        if size > self.capacity:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= size_of(old)
            while self._entries and self._bytes + size > self.capacity:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= size_of(evicted)
                self._evictions += 1
            self._entries[key] = value
            self._bytes += size

    def discard(self, key: Hashable) -> None:
        """Forget ``key`` now, whether or not it is there (not counted as an eviction: nobody needed the room)."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= size_of(old)

    def peek(self, key: Hashable) -> V | None:
        """The value of ``key`` or None, without counting a lookup or refreshing it (a caller that already
        counted its lookup checks again after claiming the key: another may have stored it meanwhile)."""
        with self._lock:
            return self._entries.get(key)

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

    def reset_lock(self) -> None:
        """A fresh lock (in a forked child: a parent's thread may have held the old one at fork)."""
        self._lock = threading.Lock()
