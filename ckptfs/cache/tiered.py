"""Decoded block groups, cached in tiers: memory first, then optional shared tiers (disk, Redis).

The block engine talks to one :class:`TieredCache`. Its first tier is always the memory LRU
(:class:`BlockCache`, bytes-bounded, thread-safe), which bounds the daemon's decoded data as a whole
(``--cache-size``). Lower tiers (``ckptfs.cache.build``: a disk folder shared by the processes of a machine, a
Redis server shared by machines) implement the :class:`CacheTier` protocol. A lookup goes memory, then each
lower tier in order, then the decoder; what was found lower is promoted to the tiers above it, and what was
decoded is offered to every tier.

Keys are :class:`ckptfs.cache.keys.CacheKey` values (the file's *content identity*, where the tensor is
stored, its storage type, the served dtype and the decoded block range; their text form is derived, never
parsed back), so a tier shared by processes never serves one file's groups for another.

Concurrent readers asking for the same missing group wait for a single decode instead of each doing it
(FUSE runs many reader threads, and the kernel's readahead sends neighbouring requests at once). Across
processes, a lower tier that can lease keys (the Redis tiers: ``lease``, ``wait_for``, ``release``) makes
processes that miss the same group at once wait for one decode of it too (``_wait_elsewhere``). Counters
are exact: a lookup in a tier is either a hit or a miss of that tier, never both.

A lower tier must never fail a read: ``get`` answers None and ``put`` returns quietly when the tier is down,
full, slow or corrupt (the tier logs once and counts); :class:`TieredCache` still guards each call, so a
tier's bug costs speed, never a read.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ckptfs.cache.flight import SingleFlight
from ckptfs.cache.keys import CacheKey, group_key
from ckptfs.cache.lru import BytesLRU, CacheStats

__all__ = ["CacheTier", "LeasingTier", "FlushingTier", "BlockCache", "TieredCache", "CacheStats", "CacheKey",
           "cache_key"]

log = logging.getLogger(__name__)

#: The key of decoded blocks [b0, b1) of a stored tensor (ckptfs.cache.keys.group_key).
cache_key = group_key


class CacheTier(Protocol):
    """The protocol of a cache tier (see the module docstring); the memory LRU is one implementation, the disk
    and Redis tiers follow it by their methods."""

    name: str

    def get(self, key: str) -> np.ndarray | None:  # pragma: no cover - interface
        raise NotImplementedError

    def put(self, key: str, value: np.ndarray) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def contains(self, key: str) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def stats(self) -> dict[str, Any] | CacheStats:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        """Release what the tier holds (connections, descriptors)."""
        ...


@runtime_checkable
class LeasingTier(Protocol):
    """A lower tier that can lease keys (the Redis tiers): processes that miss the same key at once wait for
    one decode of it (``TieredCache._wait_elsewhere``)."""

    name: str

    def lease(self, key: str) -> bool:
        """True when this process now holds ``key``'s lease (it decodes); False when another process does."""
        ...

    def wait_for(self, key: str, timeout: float | None = None) -> np.ndarray | None:
        """The value another process is decoding under its lease, once stored; None when it never came."""
        ...

    def release(self, key: str) -> None:
        """Give up this process's lease of ``key`` (its decode failed)."""
        ...


@runtime_checkable
class FlushingTier(Protocol):
    """A lower tier that stores in the background (disk, Redis): ``flush`` waits for the writes queued so far."""

    name: str

    def flush(self, timeout: float | None = None) -> bool: ...


class BlockCache(BytesLRU[np.ndarray], CacheTier):
    """The memory tier: the package's LRU (ckptfs.cache.lru) of read-only arrays, bounded by their ``nbytes``.
    Used through a :class:`TieredCache` (which adds the single flight), never on its own."""

    name = "memory"

    close = BytesLRU.clear


def _tier_counters(tier: CacheTier) -> dict[str, Any]:
    stats = tier.stats()
    return stats.as_dict() if isinstance(stats, CacheStats) else dict(stats)


class TieredCache:
    """What the block engine talks to: the memory tier, then lower tiers, then the decoder.

    ``tiers[0]`` must be the memory tier. ``decoded_bytes`` counts the loader's output produced in this
    process (the stats' ``decoded_bytes``).
    """

    def __init__(self, tiers: Sequence[CacheTier]) -> None:
        if not tiers:
            raise ValueError("a TieredCache needs at least the memory tier")
        self.tiers = list(tiers)
        memory = self.tiers[0]
        if not isinstance(memory, BlockCache):
            raise TypeError(f"a TieredCache's first tier is the memory tier (a BlockCache), not {memory!r}")
        self.memory: BlockCache = memory
        self._lower = self.tiers[1:]
        # capabilities resolved once, here: the tiers that lease keys and those that write in the background
        self._leasing = [(depth, tier) for depth, tier in enumerate(self._lower, start=1)
                         if isinstance(tier, LeasingTier)]
        self._flushing = [tier for tier in self._lower if isinstance(tier, FlushingTier)]
        self._flights = SingleFlight()
        self._lock = threading.Lock()
        self.decoded_bytes = 0

    @property
    def capacity(self) -> int:
        return self.memory.capacity

    @property
    def shared_tiers(self) -> bool:
        """Whether tiers below memory are configured (whole-tensor reads then go through them too)."""
        return bool(self._lower)

    def get_or_load(self, key: str, loader: Callable[[], np.ndarray], memory: bool = True) -> np.ndarray:
        """``memory=False``: look in and fill the lower tiers only (a whole-tensor read through the API finds
        what other processes decoded without churning this process's LRU with groups read once)."""
        if memory:
            value = self.memory.get(key)
            if value is not None:
                return value
        return self._flights.run(key, lambda: self._load(key, loader, 0 if memory else 1))

    def fill_into(self, items: Sequence[tuple[str, np.ndarray]], decode: Callable[[list[int]], None],
                  loader: Callable[[int], np.ndarray], keep: bool = True) -> None:
        """Fill each ``out`` of ``items`` (``(key, out)``, ``out`` a flat array of the value's dtype and size)
        with its key's value: copied from the memory tier, or decoded straight into it by one call
        ``decode(indices)`` for every item nobody has (a FUSE read: into libfuse's reply buffer, its groups
        decoded together), and then, with ``keep``, a copy of each cached (one copy, as a cached decode
        costs; without ``keep`` nothing is kept: a sequential stream's bytes stay in the kernel's page
        cache). Keys another caller is decoding are waited for (the single flight). With lower tiers, each
        item goes through ``get_or_load(key, loader(i))`` and is copied (the tiers must see it)."""
        todo = []
        for i, (key, out) in enumerate(items):
            value = self.memory.get(key)
            if value is None and self._lower:
                value = self.get_or_load(key, functools.partial(loader, i))
            if value is None:
                todo.append(i)
            else:
                out[...] = value
        if not todo:
            return
        claimed = set(self._flights.claim(items[i][0] for i in todo))
        mine = []
        for i in todo:
            key, out = items[i]
            if key not in claimed:
                continue
            value = self.memory.peek(key)  # stored by another caller between our lookup and the claim
            if value is None:
                mine.append(i)
            else:
                out[...] = value
                self._flights.finish(key, value)
        if mine:
            try:
                decode(mine)
                values = [items[i][1].copy() if keep else None for i in mine]
            except BaseException as exc:
                for i in mine:
                    self._flights.finish(items[i][0], error=exc)
                raise
            with self._lock:
                self.decoded_bytes += sum(items[i][1].nbytes for i in mine)
            for i, value in zip(mine, values):
                if value is not None:
                    value.setflags(write=False)
                    self.memory.put(items[i][0], value)
                self._flights.finish(items[i][0], value)
        for i in todo:
            if items[i][0] not in claimed:
                self._fill_one(items[i][0], items[i][1], functools.partial(decode, [i]), keep)

    def count_decoded(self, nbytes: int) -> None:
        """Count ``nbytes`` decoded by a caller straight into its own buffer, past the cache (a packed view's
        stream: ``decoded_bytes`` stays the decoder's output)."""
        with self._lock:
            self.decoded_bytes += nbytes

    def _fill_one(self, key: str, out: np.ndarray, decode: Callable[[], None], keep: bool) -> None:
        """One key of :meth:`fill_into` that another caller was decoding: its value once there, or decoded
        here (it failed there, was not kept, or finished before this caller asked)."""
        flight = self._flights.join_or_claim(key)
        if flight is not None:
            flight.done.wait()
            if flight.value is not None:
                out[...] = flight.value
                return
            # decoded into another reply and not kept, or failed: decode here (its error is ours then too)
            decode()
            return
        value = self.memory.peek(key)  # the flight ended between our lookup and the claim
        if value is not None:
            out[...] = value
            self._flights.finish(key, value)
            return
        try:
            decode()
            value = out.copy() if keep else None
        except BaseException as exc:
            self._flights.finish(key, error=exc)
            raise
        with self._lock:
            self.decoded_bytes += out.nbytes
        if value is not None:
            value.setflags(write=False)
            self.memory.put(key, value)
        self._flights.finish(key, value)

    def _load(self, key: str, loader: Callable[[], np.ndarray], first: int = 0) -> np.ndarray:
        for depth, tier in enumerate(self._lower, start=1):
            value: np.ndarray | None = self._guard(tier, "get", key)
            if value is not None:
                value.setflags(write=False)
                for upper in self.tiers[first:depth]:
                    self._guard(upper, "put", key, value)
                return value
        leased = self._wait_elsewhere(key, first)
        if isinstance(leased, np.ndarray):
            return leased
        try:
            value = loader()
        except BaseException:
            if leased is not None:
                self._guard(leased, "release", key)
            raise
        value.setflags(write=False)
        with self._lock:
            self.decoded_bytes += value.nbytes
        for tier in self.tiers[first:]:
            self._guard(tier, "put", key, value)
        return value

    def _wait_elsewhere(self, key: str, first: int) -> LeasingTier | np.ndarray | None:
        """Single flight across processes, after every tier missed ``key``: the first lower tier that can
        lease keys (``lease``/``wait_for``/``release``: the Redis tiers) is asked whether another process is
        decoding it. Its value once stored there (promoted to the tiers above, as a hit is); else the tier
        whose lease this process now holds (released if the decode fails), or None: decode here."""
        for depth, tier in self._leasing:
            if self._guard(tier, "lease", key) is not False:
                return tier
            value: np.ndarray | None = self._guard(tier, "wait_for", key)
            if value is None:
                return None
            value.setflags(write=False)
            for upper in self.tiers[first:depth]:
                self._guard(upper, "put", key, value)
            return value
        return None

    @staticmethod
    def _guard(tier: CacheTier | LeasingTier | FlushingTier, method: str, *args: Any) -> Any:
        if tier.name == "memory":
            return getattr(tier, method)(*args)
        try:
            return getattr(tier, method)(*args)
        except Exception as exc:  # noqa: BLE001 - a tier's failure costs speed, never a read
            log.warning("cache tier %s: %s failed: %s: %s", tier.name, method, type(exc).__name__, exc)
            return None

    def pending(self, key: str) -> bool:
        """Whether a decode of ``key`` is under way in this process (its caller will store it)."""
        return self._flights.pending(key)

    def __contains__(self, key: str) -> bool:
        """Whether the memory tier holds ``key`` (read-ahead asks this to skip decoded groups cheaply)."""
        return self.memory.contains(key)

    def stats(self) -> CacheStats:
        """The memory tier's counters (what ``cache`` in the mount's stats has always held)."""
        return self.memory.stats()

    def tier_stats(self) -> dict[str, dict[str, Any]]:
        """``{tier name: {"hits", "misses", "bytes", ...}}`` for every configured tier, memory first."""
        return {tier.name: _tier_counters(tier) for tier in self.tiers}

    def flush(self) -> None:
        """Wait for the lower tiers' background writes: everything decoded so far is stored (``ckptfs
        prefetch`` reports, and exits, after this)."""
        for tier in self._flushing:
            self._guard(tier, "flush")

    def clear(self) -> None:
        """Drop the memory tier's entries (shared tiers keep theirs: other processes use them)."""
        self.memory.clear()

    def close(self) -> None:
        for tier in self.tiers:
            self._guard(tier, "close")
