"""A remote checkpoint served from the ``--cache-dir`` store when its origin is unreachable, or never asked
(``--offline``).

The store keeps, beside each remote file's bytes, what its name stood for when they were fetched (a *name
record*, ``ckptfs.sources.remote.store.names``: content identity, size, validator, the LFS oid or a weak validator's tail
digest, the revision's commit, when it was fetched) and, for a repository folder, its listing. Opening goes:

- **Online, with a record** (the file's bytes were stored before): the origin is asked once — the open's
  probe is one attempt, no retries (``RemoteOptions.open_once``). It answers: the normal open, its identity
  fixed from that answer, so a version that changed at the origin is a new content identity and never
  mixed with the stored one (the store's files are keyed by it). It does not answer (no connection, a
  stall, a 5xx): the file is served from the store by its record (:class:`StoredSource`), with one log line
  naming the version and when it was fetched. A 404 or 403 is an answer: the open fails as it would.
- **Online, no record**: the normal open (retried within ``--timeout``).
- **Offline** (``--offline``, fstab ``offline``, ``open(..., offline=True)``): the origin is never asked;
  a file, or a folder listing, without a record cannot be opened (one line).

A :class:`StoredSource` serves the chunks the store holds (read-ahead and the C read path of a sealed file
as for any remote file); a read that needs an absent chunk fails at once (EIO through a mount, whose log has
its one line for the failed read): it never asks the origin, so it never hangs.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from ckptfs.sources.remote.store.chunk_store import ChunkStore
from ckptfs.core.errors import CheckpointError, SourceUnavailable
from ckptfs.sources.base import ByteSource, Folder
from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.options import RemoteOptions
from ckptfs.sources.remote.transport import RemoteSource, record_name
from ckptfs.util.redact import public_name

log = logging.getLogger(__name__)


def store_of(options: RemoteOptions) -> ChunkStore | None:
    """The ``--cache-dir`` store these options read through (None without one, or when it cannot be used)."""
    if not options.cache_dir:
        return None
    return options.chunk_cache().disk


def version_of(record: dict[str, Any]) -> str:
    """How a log line names the version a record pins: the LFS oid, else the validator (with the tail digest
    of a weak one), and the repository commit where the origin named one."""
    if record.get("sha256"):
        what = f"LFS oid sha256:{record['sha256']}"
    else:
        what = f"validator {record.get('validator')}"
        if record.get("tail"):
            what += f" (last bytes {record['tail'][2][:16]}...)"
    if record.get("revision"):
        what += f" at commit {record['revision']}"
    return what


def fetched_when(record: dict[str, Any], key: str = "fetched_at") -> str:
    """The record's time ``key`` (epoch seconds) as a log line says it."""
    at = record.get(key)
    if not isinstance(at, (int, float)):
        return "at an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


class StoredRange:
    """The range client of a file served from the store alone (``ranges.RangeClient``): it never asks the
    origin; a fetch of bytes the store lacks fails at once."""

    def __init__(self, name: str, url: str, scheme: str, size: int, options: RemoteOptions, why: str):
        self.name, self.url, self.scheme, self.size, self.options, self.why = name, url, scheme, size, options, why

    def origin(self) -> str:
        return f"stored:{self.url}"

    def fetch(self, start: int, end: int, read: ReadContext) -> bytes:
        """The failure of a read of bytes the store lacks (a mount logs it as the read's one EIO line)."""
        raise CheckpointError(self.name, start, f"not in the cache folder {self.options.cache_dir} ({self.why}: "
                                                f"the origin is not asked)")


class StoredSource(RemoteSource):
    """A remote file served by its name record from the ``--cache-dir`` store alone (see the module
    docstring): the origin is never asked; an absent chunk is a failed read."""

    def __init__(self, name: str, options: RemoteOptions, record: dict[str, Any], why: str):
        scheme = str(record.get("scheme") or "remote")
        url = str(record.get("url") or name)
        size = int(record["size"])
        super().__init__(name, options, StoredRange(name, url, scheme, size, options, why))
        self.scheme = scheme
        self.url = url
        self.record = record
        self.why = why
        self.size = size
        self.validator = record.get("validator")
        self.identity = (self.size, self.validator, self.url)
        self.mtime_ns = int(record.get("mtime_ns") or 0)
        self.fetcher.identify(str(record["content_id"]), self.size, shared=True)

    def origin(self) -> str:
        return f"stored:{self.url}"


def open_file(open_online: Callable[[RemoteOptions], ByteSource], src: str, options: RemoteOptions) -> ByteSource:
    """The source of the remote file ``src`` (see the module docstring): ``open_online(options)`` opens it at
    its origin under ``options`` (these, or these with one attempt at open: ``RemoteOptions.open_once``)."""
    offline = bool(options.open_options.offline)
    store = store_of(options)
    if offline and store is None:
        raise CheckpointError(src, None, "--offline serves what the --cache-dir folder holds: give --cache-dir DIR"
                                         + (" (it cannot be used here)" if options.cache_dir else ""))
    record = store.recall(record_name(src)) if store is not None else None
    if offline:
        if record is None:
            raise CheckpointError(src, None, f"not in the cache folder {options.cache_dir} (--offline: the origin "
                                             f"is not asked; run ckptfs prefetch first)")
        log.info("%s: offline: serving %s from the cache folder, fetched %s", public_name(src),
                 version_of(record), fetched_when(record))
        return StoredSource(src, options, record, "--offline")
    if record is None:
        return open_online(options)
    memo = ("stored", record_name(src))  # the open's later opens of the file (header reader, pool): no probe
    if memo in options.probes:
        return StoredSource(src, options, record, "its origin did not answer at open")
    try:
        return open_online(dataclasses.replace(options, open_once=True))
    except SourceUnavailable as exc:
        log.warning("%s: the origin did not answer (%s): serving %s from the cache folder, fetched %s",
                    public_name(src), exc.reason, version_of(record), fetched_when(record))
        options.probes[memo] = True
        return StoredSource(src, options, record, "its origin did not answer at open")


class StoredFolder(Folder):
    """A remote folder whose listing is kept in the store (see the module docstring): listed at the origin
    and kept; listed from the store when offline, or when the origin does not answer."""

    def __init__(self, inner: Folder, options: RemoteOptions, store: ChunkStore | None,
                 revision: str | None = None):
        self.inner = inner
        self.name = inner.name
        self.options = options
        self.store = store
        self.revision = revision

    def list(self) -> dict[str, int]:
        name = record_name(self.name)
        record = self.store.recall(name) if self.store is not None else None
        if self.options.open_options.offline:
            if self.store is None:
                raise CheckpointError(self.name, None, "--offline serves what the --cache-dir folder holds: give "
                                                       "--cache-dir DIR")
            if record is None:
                raise CheckpointError(self.name, None, f"no listing in the cache folder {self.options.cache_dir} "
                                                       f"(--offline: the origin is not asked; run ckptfs prefetch first)")
            log.info("%s: offline: the listing of revision %s from the cache folder, listed %s",
                     public_name(self.name), record.get("revision"), fetched_when(record, "listed_at"))
            return self._kept(record)
        try:
            files = self.inner.list()  # (one request: a listing is never retried, stored or not)
        except SourceUnavailable as exc:
            if record is None:
                raise
            log.warning("%s: the origin did not answer (%s): the listing of revision %s from the cache folder, "
                        "listed %s", public_name(self.name), exc.reason, record.get("revision"),
                        fetched_when(record, "listed_at"))
            return self._kept(record)
        if self.store is not None:
            self.store.remember(name, {"files": files, "places": self.inner.places(), "revision": self.revision,
                                       "listed_at": time.time()})
        return files

    def _kept(self, record: dict[str, Any]) -> dict[str, int]:
        """The kept listing's files, the folder told where the names it cannot derive lead."""
        places = record.get("places")
        if isinstance(places, dict):
            self.inner.adopt_places({str(k): str(v) for k, v in places.items()})
        return _files(record)

    def broken(self) -> builtins.list[str]:  # builtins: ``list`` here is the method
        return self.inner.broken()

    def join(self, name: str) -> str:
        return self.inner.join(name)


def _files(record: dict[str, Any]) -> dict[str, int]:
    return {str(k): int(v) for k, v in dict(record.get("files") or {}).items()}


def open_folder(inner: Folder | None, options: RemoteOptions) -> Folder | None:
    """``inner`` (a remote folder, not listed yet) with its listing kept in, or taken from, the store."""
    if inner is None or not (options.cache_dir or options.open_options.offline):
        return inner
    from ckptfs.sources.remote.hub import HfFolder

    revision = inner.path.rev if isinstance(inner, HfFolder) else None
    return StoredFolder(inner, options, store_of(options), revision)
