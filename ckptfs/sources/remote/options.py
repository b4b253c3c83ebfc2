"""How remote sources behave: :class:`RemoteOptions`, one object per ``ckptfs.open`` or mount.

``ckptfs.open`` builds one per checkpoint (``ckptfs.sources.plan``) and passes it in the
``ckptfs.sources.Opener`` that the header readers, folder discovery and the pool open sources through; it
also memoizes what is learnt per open (``probes``: opens, ``outages``: each origin's outage state), so a
later open of the same origin starts afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptfs.cache.chunks import ChunkCache, disk_store, shared_tier
from ckptfs.cache.sparse_store import DEFAULT_MIN_FREE
from ckptfs.readahead.scheduler import DEFAULT_CONCURRENCY

DEFAULT_TIMEOUT = 30.0
DEFAULT_STALL_TIMEOUT = 10.0
DEFAULT_CACHE_DIR_SIZE = 10 << 30
#: Keep-alive connections per host (urllib3's pools, boto3's ``max_pool_connections``): one per fetch worker
#: (read-ahead's highest in-flight limit plus readers' own pieces).
POOL_CONNECTIONS = DEFAULT_CONCURRENCY["fetch"]


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
