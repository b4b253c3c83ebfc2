"""The bottom of the remote chain: a range client, one per scheme, that asks its origin once for a byte range.

The remote stack is a chain in which each part holds only the part below it and calls only downward::

    RemoteSource (what the views read: pread, advise)
      -> ReadAhead (fetch-ahead: ckptfs.ahead.fetch)
      -> ChunkFetcher (the chunk cache: single flight, leases, the --cache-dir store: fetcher)
      -> VersionPin (a weak validator's last bytes re-checked: version), where the file needs one
      -> OriginClient (retries, the outage rule, the per-origin limit: origin)
      -> RangeClient (one request: http.HttpRange, s3.S3Range, stored.StoredRange)

A range client knows how to ask (URL, credentials, the identity fixed at open) and how an answer can be
wrong; it knows nothing of retries, caches or readers. What a read brings (its deadline, whether a mirror
waits behind it, when its answer began) travels down as one explicit object, ``context.ReadContext``.
"""

from __future__ import annotations

from typing import Protocol

from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.options import RemoteOptions


class RangeClient(Protocol):
    """One scheme's requests for one file: ``fetch(start, end, read)`` is one attempt at bytes [start, end)
    within ``read.deadline`` (``read.until()`` asked at each wait): exactly those bytes, as one ``bytes`` or
    as consecutive parts of ``CHUNK`` bytes but the last (no join, no cutting), or ``[read.into]`` when it
    wrote the body into the buffer the read lent it (``ReadContext.landing_in``; a client that cannot
    ignores it), or ``origin.Retryable`` / ``origin.Changed`` / ``odd.OddAnswer`` / ``origin.Relocated`` /
    ``CheckpointError`` for the retry rule (``origin.Attempts``) to decide on; ``read.fresh`` asks for a
    connection of its own (the last answer was odd); ``read.answered()`` once the answer's headers are in,
    where known. ``name`` and ``scheme`` label its errors and counters, ``size`` is the file's as opened (0
    before), ``origin()`` who answers (whose outage state and in-flight limit are kept)."""

    name: str
    scheme: str
    size: int
    options: RemoteOptions

    def origin(self) -> str: ...

    def fetch(self, start: int, end: int, read: ReadContext) -> bytes | list[bytes] | list[memoryview]: ...
