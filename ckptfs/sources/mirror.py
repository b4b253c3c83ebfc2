"""Mirrors: byte-identical copies of a checkpoint's files, read when the primary fails (``--mirror SRC``).

``MirrorSet(src, mirrors)`` is a source wrapper: for each file of the checkpoint it opens the same file in
every mirror (``mirror_name``: the mirror given for ``src`` itself, or the file's name relative to the
checkpoint's folder joined to the mirror's) and returns a :class:`MirrorSource`. Opening refuses, with one
line, a mirror that is not the same file: one whose first bytes (the header) differ, or that is smaller
than the primary. A mirror that cannot be reached at open (``SourceUnavailable``: connection refused, a
timeout, 5xx; one attempt, so it does not spend the open's deadline) does not refuse the primary: one warning
line, and it is a :class:`DeferredMirror`, opened and checked by the first read that fails over to it. An
open opens each file several times (the format's detection, the header reader, the pool), each with a
``MirrorSet``; a mirror found down is remembered for the open (``RemoteOptions.mirrors_down``): it is asked
and warned about once, not at each of them. A
primary that is shorter than its mirrors is a truncated download: the source takes the
mirrors' size, and bytes past the primary's end come from a mirror.

A read tries the primary, then each mirror in order, on any ``CheckpointError`` (connection errors and
5xx/429 after retries, a stalled attempt, short or missing bytes, a local I/O error, a manifest mismatch
when each member is a checked source). One deadline (``--timeout``) covers the whole read, failover
included; a member with a fallback after it gives up a stalled attempt at once instead of retrying, so the
next one gets its turn. After a failover the mirror that answered is asked first for ``PREFER_SECONDS``, so
a dead primary does not cost every read a timeout.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ckptfs.core.errors import CheckpointError, SourceUnavailable, public_name
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.sources.base import ByteSource
from ckptfs.sources.netstats import SourceCounters
from ckptfs.sources.remote.options import default_options
from ckptfs.sources.remote.transport import REMOTE_INITIAL_READ, check_range

log = logging.getLogger(__name__)

#: How many leading bytes must be equal for a mirror to count as the same file (the header, or its start).
CHECK_BYTES = REMOTE_INITIAL_READ
PREFER_SECONDS = 30.0
#: How a mirror is opened at the checkpoint's open: as a read with a fallback (the primary is served anyway).
AT_OPEN = ReadScope(fallback=True)


class MirrorSource(ByteSource):
    """A primary source with byte-identical mirrors (see the module docstring)."""

    def __init__(self, primary: ByteSource, mirrors: list[ByteSource], timeout: float,
                 counters: SourceCounters | None = None) -> None:
        self.primary = primary
        self._counters = counters if counters is not None else default_options().counters  # failovers
        self.mirrors = list(mirrors)
        self.name = primary.name
        self.timeout = timeout
        self.identity = primary.identity
        self.mtime_ns = primary.mtime_ns
        self.size = primary.size
        ready = [m for m in self.mirrors if not isinstance(m, DeferredMirror)]
        for mirror in ready:
            self.check_same(mirror, ready)
        if ready:
            self.size = max(primary.size, ready[0].size)
        for mirror in self.mirrors:
            if isinstance(mirror, DeferredMirror):
                mirror.owner, mirror.size = self, self.size
        self._preferred: ByteSource | None = None
        self._preferred_until = 0.0
        self._lock = threading.Lock()

    def check_same(self, mirror: ByteSource, ready: list[ByteSource] | None = None,
                   scope: ReadScope = NOTHING_SAID) -> None:
        """CheckpointError unless ``mirror`` can be the same file: no smaller than the primary, the size of
        the first mirror opened, the same first bytes (``ready``: the mirrors opened; default: all; ``scope``:
        the read failing over to it, when it is checked then)."""
        ready = [m for m in self.mirrors if not isinstance(m, DeferredMirror)] if ready is None else ready
        reference = ready[0] if ready and mirror is not ready[0] else None
        refused = f"refused as a mirror of {public_name(self.primary.name)}"
        if mirror.size < self.primary.size:
            raise CheckpointError(mirror.name, None, f"{refused}: it has {mirror.size} bytes, the primary "
                                                     f"{self.primary.size}")
        if reference is not None and mirror.size != reference.size:
            raise CheckpointError(mirror.name, None, f"{refused}: it has {mirror.size} bytes, mirror "
                                                     f"{public_name(reference.name)} {reference.size}")
        n = min(CHECK_BYTES, self.primary.size, mirror.size)
        if n and self.primary.pread(0, n, scope=scope) != mirror.pread(0, n, scope=scope):
            raise CheckpointError(mirror.name, None, f"{refused}: its first {n} bytes (the header) differ")

    @property
    def fetches_ahead(self) -> bool:
        return self.primary.fetches_ahead

    @property
    def wrapped(self) -> ByteSource:
        """The primary (``WrapsSource``): what a warm-up fetches, the mirrors being its stand-ins."""
        return self.primary

    def content_id(self) -> str:
        return self.primary.content_id()

    def _order(self) -> list[ByteSource]:
        members = [self.primary, *self.mirrors]
        with self._lock:
            preferred = self._preferred if time.monotonic() < self._preferred_until else None
        if preferred is not None:
            members.remove(preferred)
            members.insert(0, preferred)
        return members

    def pread(self, offset: int, size: int, *, scope: ReadScope = NOTHING_SAID) -> bytes:
        """The bytes from the first copy that has them: one deadline (``--timeout``, or the caller's if sooner)
        for every copy tried, and each copy but the last asked as one with a fallback behind it."""
        if not check_range(self, offset, size):
            return b""
        members = self._order()
        failures: list[str] = []
        scope = scope.within(self.timeout)
        for k, member in enumerate(members):
            last = k + 1 == len(members)
            if offset + size > member.size:  # a truncated primary: these bytes are only in the mirrors
                failures.append(f"{public_name(member.name)}: has only {member.size} bytes")
                if not last:
                    self._counters.failover()
                continue
            try:
                data = member.pread(offset, size, scope=scope.backed(not last))
            except CheckpointError as exc:
                failures.append(str(exc))
                if not last:
                    self._counters.failover()
                    log.warning("read of %s @ %d failed (%s): trying %s", public_name(member.name), offset,
                                exc.reason, public_name(members[k + 1].name))
                continue
            if k:
                with self._lock:
                    self._preferred, self._preferred_until = member, time.monotonic() + PREFER_SECONDS
            return data
        raise CheckpointError(self.name, offset, "every copy failed: " + "; ".join(failures))

    def advise(self, offset: int, size: int, sequential: bool = False, *, scope: ReadScope = NOTHING_SAID) -> None:
        member = self._order()[0]
        if offset + size <= member.size:
            member.advise(offset, size, sequential, scope=scope)

    @property
    def is_open(self) -> bool:
        return self.primary.is_open

    def ensure_open(self) -> None:
        self.primary.ensure_open()

    def close_if_idle(self) -> bool:
        return self.primary.close_if_idle()

    def close(self) -> None:
        for member in (self.primary, *self.mirrors):
            member.close()


def _is_url(name: str) -> bool:
    return "://" in name


def _parent(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[0] if _is_url(name) else os.path.dirname(name)


def _join(base: str, rel: str) -> str:
    return base.rstrip("/") + "/" + rel if _is_url(base) else os.path.join(base, rel)


class MirrorSet:
    """The ``source_wrapper`` that gives every file of the checkpoint ``src`` its mirrors.

    ``member_wrapper(source, path)`` (optional) wraps each member, the primary under its own name and each
    mirror under the primary's name (checked reads against a manifest).
    """

    def __init__(self, src: str, mirrors: list[str], is_folder: bool,
                 member_wrapper: Callable[[ByteSource, str], ByteSource] | None = None,
                 options: Any = None) -> None:
        self.src = src.rstrip("/") if is_folder and _is_url(src) else src
        self.mirrors = [str(m) for m in mirrors]
        self.is_folder = is_folder
        self.member_wrapper = member_wrapper
        self.options = options if options is not None else default_options()

    def mirror_name(self, name: str, mirror: str) -> str:
        """The name in ``mirror`` of the checkpoint file ``name``."""
        if name == self.src or (not self.is_folder and os.path.normpath(name) == os.path.normpath(self.src)):
            return mirror
        base = self.src if self.is_folder else _parent(self.src)
        mirror_base = mirror if self.is_folder else _parent(mirror)
        if _is_url(name):
            rel = name[len(base):].lstrip("/") if name.startswith(base) else name.rsplit("/", 1)[-1]
        else:
            rel = os.path.relpath(name, base or ".")
        return _join(mirror_base, rel)

    def open_mirror(self, name: str, primary_name: str, scope: ReadScope = AT_OPEN) -> ByteSource:
        """The mirror ``name`` of ``primary_name``, opened (and wrapped) under ``scope``
        (``RemoteOptions.open_scope``): at open, one with a fallback (a mirror that cannot be reached costs a
        stalled attempt and one retry, not the deadline); later, the failing-over read's own."""
        from ckptfs.sources.registry import Opener

        try:
            opened = Opener(dataclasses.replace(self.options, open_scope=scope)).source(name)
        except SourceUnavailable:
            raise
        except CheckpointError as exc:
            raise CheckpointError(name, None, f"mirror of {public_name(primary_name)} cannot be used: "
                                              f"{exc.reason}") from None
        return opened if self.member_wrapper is None else self.member_wrapper(opened, primary_name)

    def __call__(self, source: ByteSource) -> ByteSource:
        members: list[ByteSource] = []
        down = self.options.mirrors_down  # one per open: the header read's opens and the pool's share it
        for mirror in self.mirrors:
            name = self.mirror_name(source.name, mirror)
            if name in down:  # found down by this open already (said once): a read opens it when it fails over
                members.append(DeferredMirror(self, name, source.name))
                continue
            try:
                members.append(self.open_mirror(name, source.name))
            except SourceUnavailable as exc:
                # down now: the primary is mounted anyway, and this mirror is opened when a read needs it
                down.add(name)
                log.warning("mirror %s of %s is unavailable (%s): it is tried again when a read fails over",
                            public_name(name), public_name(source.name), exc.reason)
                members.append(DeferredMirror(self, name, source.name))
        primary = source
        if self.member_wrapper is not None:
            primary = self.member_wrapper(source, source.name)
        return MirrorSource(primary, members, self.options.timeout, self.options.counters)


class DeferredMirror(ByteSource):
    """A mirror that could not be reached when the checkpoint was opened: opened (and checked against the
    primary, as at open) by the first read that fails over to it; until then its size is the primary's.
    A read that finds it still down fails over to the next copy, so a dead mirror costs only its failover."""

    def __init__(self, mirror_set: MirrorSet, name: str, primary_name: str) -> None:
        self.mirror_set = mirror_set
        self.name = name
        self.primary_name = primary_name
        self.owner: MirrorSource | None = None  # set by the MirrorSource, which checks the mirror once open
        self.size = 0
        self.identity = ()
        self._opened: ByteSource | None = None
        self._lock = threading.Lock()

    def _source(self, scope: ReadScope = NOTHING_SAID) -> ByteSource:
        """The mirror, opened now (under ``scope``: the read failing over to it) unless it was already."""
        with self._lock:
            if self._opened is None:
                opened = self.mirror_set.open_mirror(self.name, self.primary_name, scope)
                if self.owner is not None:
                    self.owner.check_same(opened, scope=scope)
                self._opened = opened
            return self._opened

    def pread(self, offset: int, size: int, *, scope: ReadScope = NOTHING_SAID) -> bytes:
        return self._source(scope).pread(offset, size, scope=scope)

    def content_id(self) -> str:
        return self._source().content_id()

    def close(self) -> None:
        if self._opened is not None:
            self._opened.close()
