"""Cache tiers below the in-memory LRU, shared between processes (see docs/caches.md).

- ``disk.py``: ``DiskStore`` (checksummed entries in ``--cache-dir``, bounded across processes) and
  ``DiskTier`` (decoded block groups in it);
- ``redis_tier.py``: ``RedisTier`` (decoded block groups in a Redis shared by machines);
- ``redis_cluster.py``: ``RedisClusterTier`` (the same, spread over a Redis Cluster's nodes);
- ``shared.py``: ``Tensor.shared()``, one mapped copy of a decoded tensor for many worker processes;
- ``entry.py``: the entry format both tiers store;
- ``auth.py``: the folder's ownership and modes, the entries' key.

``build_tiers`` is what ``ckptfs.open`` and ``ckptfs mount`` call. Nothing here imports redis-py until a
Redis tier is asked for.
"""

from __future__ import annotations

from ckptfs.cache.tiered import BlockCache, CacheTier, TieredCache
from ckptfs.cache.disk import DEFAULT_CACHE_DIR_SIZE
from ckptfs.core.options import OpenOptions

__all__ = ["build_tiers", "DEFAULT_CACHE_DIR_SIZE"]


def build_tiers(options: OpenOptions) -> TieredCache:
    """The tiers ``options`` ask for: memory (``cache_size`` bytes), then the disk folder (``cache_dir``,
    bounded by ``cache_dir_size``) if given, then Redis, then a Redis Cluster (``redis_cluster``: its seed
    nodes, HOST:PORT) if given.

    ``cache_key_file`` authenticates both lower tiers' entries (``auth.py``); without it the folder uses its
    own ``DIR/.key`` and Redis is trusted as-is (logged once here). ValueError (one line, for the CLI) for a
    bad Redis URL, a missing redis-py, or a folder or key file this user must not trust (``CacheRefused``):
    both are checked here, at the open, before anything is read from them.
    """
    cache_dir, cache_key_file = options.cache_dir, options.cache_key_file
    cache_dir_size = options.cache_dir_size if options.cache_dir_size is not None else DEFAULT_CACHE_DIR_SIZE
    redis, redis_cluster = options.redis, options.redis_cluster
    tiers: list[CacheTier] = [BlockCache(options.cache_size)]
    if cache_dir:
        from ckptfs.cache.disk import DiskTier

        tiers.append(DiskTier(cache_dir, cache_dir_size, key_file=cache_key_file))
    if redis:
        from ckptfs.cache.redis_tier import RedisTier

        tiers.append(RedisTier(redis, key_file=cache_key_file))
    if redis_cluster:
        from ckptfs.cache.redis_cluster import RedisClusterTier

        tiers.append(RedisClusterTier(redis_cluster, key_file=cache_key_file))
    return TieredCache(tiers)
