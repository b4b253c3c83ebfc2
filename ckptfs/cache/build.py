"""Cache tiers below the in-memory LRU, shared between processes (see docs/caches.md).

- ``disk.py``: ``DiskStore`` (checksummed entries in ``--cache-dir``, bounded across processes) and
  ``DiskTier`` (decoded block groups in it);
- ``redis.py``: ``RedisTier`` (decoded block groups in a Redis shared by machines);
- ``shared.py``: ``Tensor.shared()``, one mapped copy of a decoded tensor for many worker processes;
- ``entry.py``: the entry format both tiers store.

``build_tiers`` is what ``ckptfs.open`` and ``ckptfs mount`` call. Nothing here imports redis-py until a
Redis tier is asked for.
"""

from __future__ import annotations

from ckptfs.cache.tiered import BlockCache, TieredCache
from ckptfs.cache.disk import DEFAULT_CACHE_DIR_SIZE

__all__ = ["build_tiers", "DEFAULT_CACHE_DIR_SIZE"]


def build_tiers(cache_size: int, cache_dir: str | None = None, cache_dir_size: int = DEFAULT_CACHE_DIR_SIZE,
                redis: str | None = None) -> TieredCache:
    """Memory (``cache_size`` bytes), then the disk folder if given, then Redis if given.

    ValueError (one line, for the CLI) for a bad Redis URL or a missing redis-py. The disk folder is not
    touched here: one that cannot be used costs a decode at the first read, never the open.
    """
    tiers = [BlockCache(cache_size)]
    if cache_dir:
        from ckptfs.cache.disk import DiskTier

        tiers.append(DiskTier(cache_dir, cache_dir_size))
    if redis:
        from ckptfs.cache.redis_tier import RedisTier

        tiers.append(RedisTier(redis))
    return TieredCache(tiers)
