"""Read-ahead: the one sequential-read detector and the one scheduler that runs work ahead of readers.

Three kinds of reader stream through a checkpoint: a mount's open file handles (decode the next block
groups before the reader asks: ``ckptfs.engine.decode_ahead``), remote byte sources read directly (fetch the
next chunks: ``ckptfs.sources.remote.fetch_ahead``) and the Redis tier's sequential lookups (fetch the next
groups in one round trip: ``ckptfs.cache.redis_tier``). Each recognizes its stream with the same
:class:`~ckptfs.readahead.detect.SequentialRun`, and the work ahead of the first two runs on the process's
one :class:`~ckptfs.readahead.scheduler.Scheduler`: one byte budget over everything in flight, and a worker
pool per kind of work whose size is a parameter (the throughput work tunes it). One stream's read-ahead is
decided once, by the layer nearest its reader that watches it (:func:`~ckptfs.readahead.detect.decided_above`).
"""

from ckptfs.readahead.detect import SequentialRun, decided_above, is_decided_above
from ckptfs.readahead.scheduler import SCHEDULER, Scheduler

__all__ = ["SequentialRun", "Scheduler", "SCHEDULER", "decided_above", "is_decided_above"]
