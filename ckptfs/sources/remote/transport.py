"""``RemoteSource``: what every remote byte source shares, the top of a chain that calls only downward.

A scheme module (``http``, ``s3``) subclasses :class:`RemoteSource`, builds the scheme's range client (one
request for a byte range, ``ranges.RangeClient``) and opens the file (size and validator fixed at open, see
``_set_identity``). The parts below the source each hold only the part below them (``ranges`` draws the
chain):

- ``ckptfs.ahead.fetch``: fetching ahead of a sequential reader (:class:`ReadAhead`, over the chunks);
- ``fetcher``: aligned chunks, single-flight fetches, the fleet's leases and the ``--cache-dir`` store, and
  ``handoff``: a reader's long runs as parallel pieces on the scheduler's workers;
- ``version``: the version pin of a file whose validator cannot tell versions apart;
- ``origin``: the retrying origin client (backoff within the deadline, the outage rule, the origin's
  in-flight limit, what each failure means);
- the scheme's range client.

A read's state (deadline, a mirror behind it, whether it fetches ahead, when its answer began) is one
``context.ReadContext``, made here as the read enters and passed down to each attempt, from what the caller
of ``ByteSource.pread`` said about it (its ``scope``: a mount's FUSE read's deadline, a mirror wrapper's
fallback).

Options (timeouts, cache directory, read-ahead) are a ``RemoteOptions`` (``options``) handed to each source
when it is opened.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ckptfs.sources.remote.store.chunks import CHUNK
from ckptfs.cache.flight import Flight
from ckptfs.core.errors import CheckpointError
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.ahead.limits import OriginLimit
from ckptfs.sources.base import ByteSource
from ckptfs.sources.remote.context import ReadContext, Slot
from ckptfs.sources.remote.fetcher import ChunkFetcher, Run
from ckptfs.sources.remote.options import RemoteOptions, default_options
from ckptfs.sources.remote.origin import OriginClient
from ckptfs.sources.remote.outage import Outage
from ckptfs.ahead.fetch import ReadAhead, piece_chunks
from ckptfs.sources.remote.ranges import RangeClient
from ckptfs.sources.remote.version import VersionPin
from ckptfs.util.redact import public_name, strip_url

log = logging.getLogger(__name__)

#: First header read of a remote file. Header readers grow it geometrically (x2), so a header of H bytes
#: costs at most log2(H / 2 MiB) + 1 requests and fetches at most max(2 MiB, 2 H): a 6.2 MiB vocabulary
#: header is 3 requests, an 8.4 MiB one 4.
REMOTE_INITIAL_READ = 2 * 1024 * 1024
#: The first bytes of a file an open with a ``--cache-dir`` asks for (where the header's bytes may be stored
#: already, so it asks for no more): they cost nothing beside the round trip the size and identity take, and
#: they answer a format check (``ckptfs.formats.detect`` reads 64 bytes) with no request of its own, so a
#: ``ckptfs prefetch``'s check passes before its first pieces land instead of waiting for them.
OPEN_HEAD_BYTES = 4096


def check_range(source: ByteSource, offset: int, size: int) -> bool:
    """False for an empty read; CheckpointError for bytes outside the source as opened."""
    if size <= 0:
        return False
    if offset < 0 or offset + size > source.size:
        raise CheckpointError(source.name, max(offset, source.size), f"bytes {offset}..{offset + size} lie past "
                                                                     f"the end of the file ({source.size} bytes)")
    return True


class RemoteSource(ByteSource):
    """Base of the remote sources (see the module docstring). Subclasses hand their range client to
    ``__init__`` and call ``_set_identity`` while opening."""

    scheme = "remote"
    initial_read = REMOTE_INITIAL_READ
    #: The largest request read-ahead makes (``ckptfs.ahead.fetch.piece_bytes`` shrinks it as more are in flight).
    piece_bytes = 4 << 20

    def __init__(self, name: str, options: RemoteOptions | None, range_client: RangeClient):
        self.name = name
        self.options = options if options is not None else default_options()
        self.size = 0
        self.identity: tuple[object, ...] = ()
        self.validator: str | None = None
        # the chain, built bottom up: each part is handed the one below it and holds nothing above
        self.range = range_client
        self.client = OriginClient(range_client)
        self.fetcher = ChunkFetcher(name, self.options, self.client, self.piece_bytes)
        self._head = b""  # the file's first bytes as the open's first request answered (_keep_prefix)
        self._readahead = ReadAhead(self.fetcher)

    @property
    def fetches_ahead(self) -> bool:
        return self.options.read_ahead

    def origin(self) -> str:
        """Who answers this source's requests (a scheme and host): the unit whose in-flight limit is learnt
        (``ckptfs.ahead.limits``) and whose outage state is kept (``outage``). Schemes say; this default
        is the source's name."""
        return f"{self.scheme}:{self.name}"

    def origin_limit(self) -> OriginLimit:
        return self.client.origin_limit()

    def outage(self) -> Outage:
        return self.client.outage()

    @property
    def closed(self) -> bool:
        return self.fetcher.closed

    # -- opening ---------------------------------------------------------------------------------------
    def _set_identity(self, size: int, validator: str | None, url: str, sha256: str | None = None,
                      sample: bytes | None = None, revision: str | None = None, mtime_ns: int = 0) -> None:
        """Fix size and identity. ``sample``: the file's last bytes, for a validator that cannot tell versions
        of one size apart (``version``); it joins the content identity. With a ``--cache-dir`` store, what the
        source's name stands for is kept there with its bytes (``pin_name``); ``revision`` (the repository
        commit the origin named) and ``mtime_ns`` go into that record."""
        from ckptfs.sources.identity import remote_content_id, sample_digest, sha256_content_id

        self.size = size
        self.validator = validator
        self.identity = (size, validator, url)
        tail = None
        if sample is not None:
            tail = (size - len(sample), size, sample_digest(sample))
            self.fetcher.pin = VersionPin(self.range, self.client, tail)
        if sha256:
            self.fetcher.identify(sha256_content_id(sha256), size, shared=True)
        elif validator:
            self.fetcher.identify(remote_content_id(validator, size, url, sample), size, shared=True)
        else:  # nothing tells versions apart: never share these bytes beyond this open
            self.fetcher.identify(remote_content_id(f"unvalidated-{id(self):x}-{time.time_ns()}", size, url), size,
                                 shared=False)
            return
        self.pin_name({"url": strip_url(url), "scheme": self.scheme, "size": size, "validator": validator,
                       "sha256": sha256, "tail": list(tail) if tail is not None else None, "revision": revision,
                       "mtime_ns": int(mtime_ns), "fetched_at": time.time()})

    def pin_name(self, record: dict[str, Any]) -> None:
        """Keep ``record`` (this file's identity, see ``_set_identity``) in the ``--cache-dir`` store under
        the source's name (``record_name``) once bytes of it are stored (``sparse_store.SparseStore.pin``): a
        later open with the origin unreachable, or ``--offline``, finds the bytes by it (``stored``)."""
        disk = self.fetcher.cache.disk
        if disk is None:
            return
        try:
            disk.pin(self.content_id(), record_name(self.name), record)
        except Exception:  # a store that fails costs the offline open, never this one
            log.debug("%s: the cache folder's name record not kept", public_name(self.name), exc_info=True)

    def content_id(self) -> str:
        return self.fetcher.content_id

    def _keep_prefix(self, data: bytes) -> None:
        """Keep the bytes fetched from offset 0 at open (the header read's start): their first
        ``OPEN_HEAD_BYTES`` in memory, read from there (the version the open pinned), and the whole chunks in
        the chunk cache."""
        self._head = bytes(data[:OPEN_HEAD_BYTES])
        full = len(data) if len(data) == self.size else len(data) - len(data) % CHUNK
        if full and self.fetcher.cache.has(self.fetcher.key(0)):
            return  # an open memoized from an earlier one: its bytes are in already
        self.fetcher.keep(0, data)

    def keep_chunks(self, c0: int, data: bytes) -> None:
        """Cache ``data``, this file's bytes from chunk ``c0`` on (read here, or from a byte-identical mirror:
        a warm-up's piece the mirrors answered), as chunks: the whole ones, and the file's last one."""
        self.fetcher.keep(c0, data)

    # -- reading ---------------------------------------------------------------------------------------
    def pread(self, offset: int, size: int, *, scope: ReadScope = NOTHING_SAID) -> bytes:
        """Exactly ``size`` bytes at ``offset`` (as the object was at open), or CheckpointError."""
        if not check_range(self, offset, size):
            return b""
        if offset + size <= len(self._head):
            return self._head[offset: offset + size]
        read, c0, c1, upto, step = self._span(offset, size, scope)
        chunks = self.fetcher.get_chunks(c0, upto, read, step)[: c1 - c0]
        self._readahead.observe(offset, size, scope.decided)
        parts = _covering(chunks, offset - c0 * CHUNK, offset + size - (c1 - 1) * CHUNK)
        whole = parts[0].obj if len(parts) == 1 else None
        if isinstance(whole, bytes) and len(parts[0]) == len(whole):
            return whole  # a whole chunk: no copy
        return b"".join(parts)  # one copy

    def pread_into(self, offset: int, target: memoryview, *, scope: ReadScope = NOTHING_SAID) -> None:
        """``pread`` straight into ``target`` (libfuse's buffer): the chunks' covering slices are copied there
        once, instead of joined and copied again."""
        size = len(target)
        if not check_range(self, offset, size):
            return
        if offset + size <= len(self._head):
            target[:] = self._head[offset: offset + size]
            return
        read, c0, c1, upto, step = self._span(offset, size, scope)
        chunks = self.fetcher.get_chunks(c0, upto, read, step)[: c1 - c0]
        self._readahead.observe(offset, size, scope.decided)
        at = 0
        for part in _covering(chunks, offset - c0 * CHUNK, offset + size - (c1 - 1) * CHUNK):
            target[at: at + len(part)] = part
            at += len(part)

    def _span(self, offset: int, size: int, scope: ReadScope) -> tuple[ReadContext, int, int, int, int]:
        """A read entering now: its context (as ``scope`` says), the chunks [c0, c1) holding bytes [offset, offset + size), how
        far to fetch (``upto``: c1, or further for the header's first read) and the pieces a long run of them
        is cut into for the scheduler (``step`` chunks, ``ckptfs.ahead.fetch.piece_chunks``). The read then asks the
        chunks itself (``pread``, ``pread_into``), so the walk down to the request is one frame per part."""
        step = piece_chunks(self.options, self.fetcher.origin_limit().limit, self.piece_bytes, CHUNK)
        read = ReadContext.entering(self.options.timeout, scope)
        c0, c1 = offset // CHUNK, (offset + size - 1) // CHUNK + 1
        head = min(self.fetcher.chunks, self.initial_read // CHUNK)
        if c0 == 0 and c1 < head and not self.fetcher.cache.has(self.fetcher.key(0)):
            # the first read of the header (after a one-byte open with --cache-dir): take the whole first
            # read at once, as an open without a cache directory does, instead of one chunk now and more later
            return read, 0, c1, head, step
        return read, c0, c1, c1, step

    def advise(self, offset: int, size: int, sequential: bool = False, *, scope: ReadScope = NOTHING_SAID) -> None:
        """Fetch the chunks covering these bytes in the background (best effort)."""
        if size > 0 and not self.closed:
            end = min(self.size, offset + size)
            if end > offset >= 0:
                self._readahead.follow_advice(offset // CHUNK, (end - 1) // CHUNK + 1, scope.decided)

    # -- fetching ahead (ckptfs.ahead.fetch, warmup) ---------------------------------------
    def claim(self, c0: int, c1: int) -> list[Run]:
        """``ChunkFetcher.claim``: readers of the chunks claimed wait for :meth:`fetch_claimed`."""
        return self.fetcher.claim(c0, c1)

    def fetch_claimed(self, runs: list[Run], memory: bool = True, slot: Slot | None = None) -> Exception | None:
        """``ChunkFetcher.fetch_claimed``: read-ahead ignores the failure returned, a warm-up reports it."""
        return self.fetcher.fetch_claimed(runs, memory, slot)

    def abandon(self, runs: list[Run], error: BaseException) -> None:
        """Give up claimed runs unfetched: their waiters fetch for themselves."""
        self.fetcher.abandon(runs, error)

    def fetches_under_way(self, indexes: list[int]) -> list[Flight]:
        """The fetches in progress of chunks ``indexes`` (a reader's, read-ahead's: ``claim`` skips them), to
        wait for their ends."""
        return self.fetcher.flights.under_way(indexes)

    def forget_fetches(self) -> None:
        """In a forked child: the parent's fetches are gone; their readers fetch for themselves."""
        self.fetcher.forget_fetches()

    # -- the --cache-dir store ---------------------------------------------------------------------------
    @property
    def stores_chunks(self) -> bool:
        """Whether fetched chunks are kept in a ``--cache-dir`` store (beyond this process's memory)."""
        return self.fetcher.cache.disk is not None

    def local_copy(self) -> tuple[int, int, int, int] | None:
        """``(descriptor, size, mtime_ns, gate)`` of this file's complete local copy in the ``--cache-dir``
        store (``ChunkCache.local_copy``), else None: the mount's C read path serves a file that has one as a
        local file, behind its check (``ckptfs.fuse.direct``)."""
        return self.fetcher.cache.local_copy(self.content_id(), self.size)

    def store_trouble(self) -> str | None:
        """Why the ``--cache-dir`` store takes no bytes now (its file system full, the folder not writable:
        ``DiskStore.writes_paused``), or None (also without a store)."""
        disk = self.fetcher.cache.disk
        return disk.writes_paused() if disk is not None else None

    def stored_bytes(self) -> int:
        """Bytes of this file the ``--cache-dir`` store holds now (what this process holds in memory only, a
        header read, not counted)."""
        stored = self.fetcher.cache.stored_chunks(self.content_id(), range(self.fetcher.chunks))
        return sum(min(CHUNK, self.size - i * CHUNK) for i in stored)

    def unstored_chunks(self) -> list[int]:
        """The chunk numbers the ``--cache-dir`` store does not hold (every chunk without a store). A chunk
        this process holds in memory only (its header read, a read before the store had room) is written to
        the store here instead of being fetched again."""
        cache, chunks = self.fetcher.cache, self.fetcher.chunks
        if cache.disk is None:
            return list(range(chunks))
        missing = []
        stored = cache.stored_chunks(self.content_id(), range(chunks))
        for i in range(chunks):
            if i in stored:
                continue
            key = self.fetcher.key(i)
            data = cache.memory.get(key)
            if data is not None:
                cache.put(key, data)
                if cache.stored_chunks(self.content_id(), [i]):
                    continue
            missing.append(i)
        return missing

    def close_if_idle(self) -> bool:
        return True  # holds no descriptor: the pool's bound on open files does not apply

    def ensure_open(self) -> None:
        self.fetcher.closed = False

    def close(self) -> None:
        self.fetcher.closed = True


def record_name(src: str) -> str:
    """The name a source's record is kept under in the ``--cache-dir`` store: its URL as an identity names it
    (``identity.content_url``: no credential is written, and a presigned URL's next signature finds it)."""
    from ckptfs.sources.identity import content_url

    return content_url(src)


def joined(parts: list[bytes] | list[memoryview]) -> bytes:
    """A body read in parts, as one ``bytes`` (no copy when it came in one ``bytes``)."""
    first = parts[0] if len(parts) == 1 else None
    return first if isinstance(first, bytes) else b"".join(parts)


def _covering(chunks: list[bytes], skip: int, tail: int) -> list[memoryview]:
    """Views of consecutive chunks covering a read: from byte ``skip`` of the first to byte ``tail`` of the
    last."""
    views = [memoryview(c) for c in chunks]
    if len(views) == 1:
        return [views[0][skip:tail]]
    views[0] = views[0][skip:]
    views[-1] = views[-1][:tail]
    return views
