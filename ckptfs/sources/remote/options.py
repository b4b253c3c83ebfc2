"""How remote sources behave: :class:`RemoteOptions`, one object per ``ckptfs.open`` or mount.

It holds the checkpoint's ``OpenOptions`` whole (timeouts, the cache folder and its bounds, the fleet's
Redis: the settings as the user gave them, ``None`` where they took the default) and what belongs to the
remote layer alone: the runtime whose state the sources share (``ckptfs.core.runtime``), whether sources may
read ahead (not while headers are read, before a mount forks its daemon), and what is learnt per open
(``probes``: opens memoized, ``outages``: each origin's outage state, ``mirrors_down``: the mirrors that could
not be reached when a file was first opened), so a later open of the same origin starts afresh. A default
stands in for an unset option here, each taken from its one home: the timeouts' below, the store's bounds
from ``ckptfs.cache``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckptfs.sources.remote.store.chunks import MEMORY_CHUNKS, SHARED_CHUNK_TIERS, ChunkCache, disk_store
from ckptfs.cache.disk import DEFAULT_CACHE_DIR_SIZE
from ckptfs.sources.remote.store.sparse_store import DEFAULT_MIN_FREE
from ckptfs.core.options import OpenOptions
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.core.runtime import Part, Runtime, runtime
from ckptfs.sources.netstats import SOURCE_COUNTERS, SourceCounters
from ckptfs.workers.scheduler import DEFAULT_CONCURRENCY
from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.outage import Outage

#: Every remote read is answered within this (``--timeout``), failover included, unless the options say.
DEFAULT_TIMEOUT = 30.0
#: A remote attempt that gets no bytes for this long is abandoned (``--stall-timeout``) unless the options say.
DEFAULT_STALL_TIMEOUT = 10.0
#: Keep-alive connections per host (urllib3's pools, boto3's ``max_pool_connections``): one per fetch worker
#: (read-ahead's highest in-flight limit plus readers' own pieces).
POOL_CONNECTIONS = DEFAULT_CONCURRENCY["fetch"]


@dataclass
class RemoteOptions:
    """How remote sources behave (see the module docstring): ``open_options`` as given, and the remote
    layer's own state."""

    open_options: OpenOptions = field(default_factory=OpenOptions)
    read_ahead: bool = True         # False while a checkpoint's headers are read (no thread before a fork)
    max_retries: int | None = None  # None: as many as the deadline allows
    #: an open sends one attempt, no retries: a stored copy is served when it fails (``stored.open_file``)
    open_once: bool = False
    #: what the opener says about a source's open reads (``ckptfs.core.reads``): a mirror opened with the
    #: checkpoint has a fallback (the primary), one opened when a read fails over to it that read's deadline
    open_scope: ReadScope = NOTHING_SAID
    probes: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)  # a scheme's opens
    outages: dict[str, Outage] = field(default_factory=dict, repr=False, compare=False)  # origin -> its Outage (outage.py)
    mirrors_down: set[str] = field(default_factory=set, repr=False, compare=False)  # unreachable at open (mirror.py)
    #: the process state the sources share (their counters, the connection pool, the chunks in memory): the
    #: runtime the checkpoint was opened with, else the process's
    runtime: Runtime = field(default_factory=runtime, repr=False, compare=False)

    def opening(self) -> ReadContext:
        """The context of a source's read at open (its probe, its tail sample): ``--timeout`` from now, or the
        opener's scope's end if sooner, one attempt with ``open_once``."""
        return ReadContext.entering(self.timeout, self.open_scope, self.open_once)

    @property
    def timeout(self) -> float:
        given = self.open_options.timeout
        return float(given) if given is not None else DEFAULT_TIMEOUT

    @property
    def stall_timeout(self) -> float:
        given = self.open_options.stall_timeout
        return float(given) if given is not None else DEFAULT_STALL_TIMEOUT

    @property
    def cache_dir(self) -> str | None:
        return self.open_options.cache_dir

    @property
    def cache_dir_size(self) -> int:
        given = self.open_options.cache_dir_size
        return int(given) if given is not None else DEFAULT_CACHE_DIR_SIZE

    @property
    def counters(self) -> SourceCounters:
        """The counters the sources opened with these options count their requests in."""
        return self.runtime.get(SOURCE_COUNTERS)

    def chunk_cache(self) -> ChunkCache:
        """The chunk cache of a source opened with these options; the shared level only for one that reads
        ahead (a header read, before a mount forks its daemon, opens no connection)."""
        given = self.open_options
        min_free = float(given.cache_dir_min_free) if given.cache_dir_min_free is not None else DEFAULT_MIN_FREE
        shared = self.runtime.get(SHARED_CHUNK_TIERS).tier(given.redis, given.redis_cluster, given.cache_key_file) \
            if self.read_ahead else None
        store = disk_store(given.cache_dir, self.cache_dir_size, given.cache_key_file, min_free)
        return ChunkCache(store, self.runtime.get(MEMORY_CHUNKS), shared=shared)


#: A runtime's options for the remote sources opened without any (their opens' memo, outage states and
#: mirrors found down are shared as those of one open); in the default runtime.
UNSAID_OPTIONS = Part("options of remote sources opened without any", RemoteOptions)


def default_options() -> RemoteOptions:
    """What a remote source opened without options gets: the process's (``UNSAID_OPTIONS``)."""
    return runtime().get(UNSAID_OPTIONS)
