"""Decode-ahead for a mount's sequential readers: decode ahead in the background, tell the kernel what comes next.

A reader that streams a ``.npy`` (``cat``, ``np.load``, ``cp``) asks for one readahead-sized request after
another, and each one, on a cache miss, waits for ``pread`` + decode of its block groups before the copy.
The :class:`DecodeAhead` watches each open file handle: once a read starts where the previous one ended, it
decodes the next groups into the shared block cache on a small worker pool (the C kernels release the GIL,
so on two cores the decode overlaps the FUSE thread's copying), and advises the kernel about the stored
bytes those groups will read (``POSIX_FADV_WILLNEED``; ``SEQUENTIAL`` once per stream), so the worker's
``pread`` finds them in the page cache (a remote source starts fetching them). A read that jumps elsewhere
ends the stream: queued work for it is skipped. Read-ahead never holds more than a fraction of the cache:
at most 1/8 of it ahead of one stream and 1/4 in flight over all streams, so it cannot evict what readers
are using. Streams are recognized by the one sequential detector and the decoding runs on the process's
worker pools (``ckptfs.workers``: its ``decode`` pool, within its byte budget).

What lies ahead is the served file's to say (``Served.ahead``, an :class:`Ahead`): the stored bytes to advise
and the decoding jobs (block groups) that cover the next bytes of the file, so a new kind of served file gets
read-ahead by answering it. This module declares what it needs of a served file (:class:`Served`, which
``ckptfs.engine.views.Served`` implements) and of the sources it advises (:class:`Sources`, a checkpoint's
``SourcePool``): it is handed them and imports neither the engine nor the sources. The kernel's side (the
mount's readahead, the allocator) is the FUSE adapter's.

The handle is where a mount's stream is decided (``ckptfs.ahead.detect``: one decision per stream): its
reads (:meth:`DecodeAhead.scope`), its advice and its decoding ahead say so to the source in the scope they
pass down (``ckptfs.core.reads.ReadScope.decided``), so a remote source under it fetches what the advice
names, following its reader, instead of detecting the stream again with a rule of its own. A handle whose stream is not tracked (read-ahead off, a view that does
not read ahead) leaves the decision to the source.

``CKPTFS_DECODE_AHEAD=0`` turns it off (for measuring its gain), ``CKPTFS_DECODE_AHEAD=kernel`` keeps only
the advice (no background decoding: no worker thread, no decoded data ahead in memory). ``CKPTFS_PREFETCH``
is the variable's older name, read when the new one is not set. Knows nothing
of FUSE: it sees file handles, served files and byte ranges.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import Protocol

from ckptfs.ahead.detect import SequentialRun
from ckptfs.core.reads import DECIDED, NOTHING_SAID, ReadScope
from ckptfs.core.runtime import runtime
from ckptfs.workers.scheduler import WORKERS, Scheduler

log = logging.getLogger(__name__)

DECODE_AHEAD_ENV = "CKPTFS_DECODE_AHEAD"
#: the older name of DECODE_AHEAD_ENV, kept as an alias (docs/reference/environment.md)
PREFETCH_ENV = "CKPTFS_PREFETCH"
MAX_AHEAD_BYTES = 8 << 20
#: How much of a streamed file's rest is advised at once when the stream is found (its stored bytes: the
#: remote read-ahead's budget, ckptfs.ahead.fetch.FETCH_BUDGET).
WHOLE_ADVICE_BYTES = 128 << 20
#: How far a streaming reader moves before the advice ahead of it is extended (to ``WHOLE_ADVICE_BYTES`` ahead).
ADVICE_STEP = 8 << 20
#: For a reader seen reading in file order, how many bytes of the files stored after the one it reads are
#: advised ahead of it (from when it is this close to that file's end; at most ``FOLLOW_FILES`` more files at
#: a time): a checkpoint's many small tensors (norms of a few KiB) then arrive as a few large requests ahead
#: of the reader instead of one round trip per file, and a large file's end is no pause in the stream.
FOLLOW_ADVICE_BYTES = 128 << 20
FOLLOW_FILES = 256
#: Ranges of advice this close are advised as one (a GGUF aligns each tensor's data to 32 bytes by default).
MERGE_GAP = 64 << 10
STREAM_SHARE = 8  # ahead of one stream: at most capacity / 8
TOTAL_SHARE = 4  # in flight over all streams: at most capacity / 4


@dataclass(frozen=True)
class Ahead:
    """What lies ahead of a sequential reader of a served file, as the file knows it (``Served.ahead``): stored
    byte ranges to advise their source about (``(source name, offset, nbytes)``), and decoding jobs that warm
    the cache (``(file offset the job covers up to, bytes of output, job)``; ``job(scope)`` reads under the
    scope it is given), in file order."""

    advise: tuple[tuple[str, int, int], ...] = ()
    decode: tuple[tuple[int, int, Callable[[ReadScope], None]], ...] = ()


NOTHING_AHEAD = Ahead()


class Served(Protocol):
    """What decode-ahead needs of a served file (``ckptfs.engine.views.Served``): its size, whether a sequential
    reader of it gains from reading ahead, what lies ahead of such a reader, the file a reader of its end opens
    next, what names it among the files of its kind, and whether its reads decode into the reply anyway."""

    @property
    def size(self) -> int: ...

    @property
    def reads_ahead(self) -> bool: ...

    @property
    def slot(self) -> Hashable | None: ...

    @property
    def decodes_into_reply(self) -> bool: ...

    def ahead(self, start: int, stop: int) -> Ahead: ...

    def following(self) -> Served | None: ...


class Advised(Protocol):
    """What decode-ahead asks of a source of stored bytes (``ckptfs.sources.ByteSource``): advice that bytes are
    wanted soon, and whether such advice makes it fetch ahead (a remote source)."""

    def advise(self, offset: int, size: int, sequential: bool = False, *, scope: ReadScope = NOTHING_SAID) -> None: ...

    @property
    def fetches_ahead(self) -> bool: ...


class Sources(Protocol):
    """Where read-ahead advises the bytes it wants: a checkpoint's ``SourcePool``, or a repository's pools."""

    def get(self, path: str) -> Advised: ...


def _setting() -> str:
    """``CKPTFS_DECODE_AHEAD``, else its alias ``CKPTFS_PREFETCH``, else "1"."""
    value = os.environ.get(DECODE_AHEAD_ENV)
    if value is None:
        value = os.environ.get(PREFETCH_ENV, "1")
    return value.strip().lower()


def enabled_from_env() -> bool:
    return _setting() not in ("0", "false", "no", "off")


def decode_ahead_from_env() -> bool:
    return enabled_from_env() and _setting() != "kernel"


@dataclass
class _Stream:
    """What one open file handle has read, and how far ahead of it work is scheduled."""

    view: Served
    run: SequentialRun = field(default_factory=SequentialRun)
    ahead_until: int = 0
    generation: int = 0
    advised: bool = False
    followed: bool = False  # read-ahead has gone on into the next tensor's file (Served.following)
    chained: bool = False   # the files stored after this one were advised (a reader in file order)
    far: bool = False       # its stored bytes come from a source that fetches what is advised (remote)
    advised_to: int = 0     # the file's bytes up to here were advised as one unit (the rest, in steps)
    closed: bool = False


class DecodeAhead:
    """Per-handle sequential detection and bounded background decoding (see the module docstring)."""

    def __init__(self, sources: Sources, cache_capacity: int, enabled: bool = True, decode_ahead: bool = True,
                 scheduler: Scheduler | None = None, into_reply: bool = False) -> None:
        self.enabled = enabled
        self.decode_ahead = decode_ahead and cache_capacity > 0
        # into_reply (the mount's): a view whose reads decode straight into the reply (Served.decodes_into_reply)
        # gets advice only. Decoding its groups ahead into the cache would add a copy per byte and hand-offs
        # between threads on top of the decode the read does anyway (measured: docs/performance.md)
        self.into_reply = into_reply
        self._sources = sources
        # decoded data ahead must fit the cache; advice alone costs no memory of ours
        self._ahead = min(MAX_AHEAD_BYTES, cache_capacity // STREAM_SHARE) if self.decode_ahead else MAX_AHEAD_BYTES
        self._share = cache_capacity // TOTAL_SHARE  # this cache's cap on decoded bytes in flight
        self._scheduler = scheduler if scheduler is not None else runtime().get(WORKERS)  # the mount hands its own
        self._streams: dict[int, _Stream] = {}
        self._lock = threading.Lock()
        self._pending: set[Future[None]] = set()
        self._closed = False
        # Tensor-aware read-ahead goes on into the next tensor's file only for a reader seen to read in file
        # order: the slot of the file a finished stream leads to, and whether the last one opened was it.
        self._expected: object = None
        self._in_file_order = False
        # the files stored after the one a reader in file order reads whose bytes were advised, in order
        self._chain: collections.deque[tuple[Hashable, Served]] = collections.deque()

    @classmethod
    def from_env(cls, sources: Sources, cache_capacity: int, scheduler: Scheduler | None = None) -> DecodeAhead:
        """A decode-ahead configured by ``CKPTFS_DECODE_AHEAD`` (its older name ``CKPTFS_PREFETCH`` too: the
        mount daemon's), on ``scheduler``'s pools."""
        return cls(sources, cache_capacity, enabled_from_env(), decode_ahead=decode_ahead_from_env(),
                   scheduler=scheduler, into_reply=True)

    def opened(self, fh: int, view: Served) -> None:
        next_in_order = False
        if self._expected is not None and view.slot is not None:
            next_in_order = self._in_file_order = view.slot == self._expected  # the file stored next, or not
            self._expected = None
            with self._lock:
                if next_in_order and self._chain and self._chain[0][0] == view.slot:
                    self._chain.popleft()  # what was advised ahead of it is now ahead of this file
                else:
                    self._chain.clear()  # left file order: what was advised ahead is no longer ahead
        if self.enabled and view.reads_ahead:
            stream = _Stream(view)
            if next_in_order and self._fetch_ahead(view):
                # the reader went on from the end of the file stored before this one: its stream continues
                # here, and its first read (a small file's only one) counts as sequential
                stream.run.end, stream.run.streak = 0, 1
                stream.far = True
            with self._lock:
                self._streams[fh] = stream

    def released(self, fh: int) -> None:
        with self._lock:
            stream = self._streams.pop(fh, None)
            if stream is not None:
                stream.closed = True

    def scope(self, fh: int, scope: ReadScope) -> ReadScope:
        """The scope a read of handle ``fh`` passes down: ``scope``, decided here when the handle's stream is
        tracked (the source below follows this decode-ahead's advice), else left to the source."""
        return scope.streaming() if fh in self._streams else scope

    def on_read(self, fh: int, offset: int, size: int) -> bool:
        """Note a read about to be served; schedule what a sequential reader will ask for next. Whether the
        read continues a sequential stream (what it decodes then need not stay in the block cache)."""
        stream = self._streams.get(fh)
        if stream is None:
            return False
        with self._lock:
            was_streaming = stream.run.streak > 0
            # concurrent readahead requests may arrive slightly out of order
            if not stream.run.observe(offset, size, slack=4 * max(size, 128 << 10)):
                if was_streaming:
                    stream.generation += 1  # the access turned random: skip what is queued for it
                stream.ahead_until = 0
                if offset == 0 and size >= stream.view.size:
                    # a whole file in one read is no stream, but a reader that opens the file stored next
                    # reads in file order (a small tensor first in a checkpoint)
                    following = stream.view.following()
                    self._expected = following.slot if following is not None else None
                return False
            end = stream.run.end
            start = max(end, stream.ahead_until)
            stop = min(stream.view.size, end + self._ahead)
            beyond = 0  # bytes of the window past this file's end: the start of the next tensor's file
            if not stream.followed and end + self._ahead > stream.view.size:
                stream.followed = True
                beyond = end + self._ahead - stream.view.size
            chain = not stream.chained and end + FOLLOW_ADVICE_BYTES > stream.view.size
            stream.chained = stream.chained or chain
            # the rest of the file as one unit: at once when the stream is found, then extended each time the
            # reader has moved ADVICE_STEP on (a file longer than WHOLE_ADVICE_BYTES keeps its source's window
            # full to its end instead of falling back to the decode window's few MiB)
            rest = (stream.advised_to < stream.view.size
                    and (not stream.advised
                         or (stream.far and end + WHOLE_ADVICE_BYTES >= stream.advised_to + ADVICE_STEP)))
            if (stop <= start or start - end > self._ahead // 2) and not beyond and not rest and not chain:
                return True  # at end of file, or more than half a window is already ahead
            first = not stream.advised
            stream.advised = True
            rest_from = max(stop, stream.advised_to)
            if rest:
                stream.advised_to = min(stream.view.size, end + WHOLE_ADVICE_BYTES)
            rest_to = stream.advised_to
            generation = stream.generation
        try:
            # what is advised and decoded here continues this handle's stream: said so (DECIDED) to the sources
            if stop > start:
                self._schedule(stream, start, stop, generation, first)
            if rest and rest_to > rest_from:
                stream.far = self._advise_rest(stream.view, rest_from, rest_to) or stream.far
            if chain and stream.far:
                self._chain_after(stream.view)
            if beyond:
                self._follow(stream, beyond)
        except Exception:  # read-ahead is an optimization; the read itself reports errors
            log.debug("read-ahead of %d..%d failed", start, stop, exc_info=True)
        return True

    # -- scheduling ---------------------------------------------------------------------------------------

    def _schedule(self, stream: _Stream, start: int, stop: int, generation: int, first: bool) -> None:
        plan = stream.view.ahead(start, stop)
        for name, offset, nbytes in plan.advise:
            self._advise(name, offset, nbytes, first)
        if not self._decodes_ahead(stream.view) or not plan.decode:
            stream.ahead_until = stop
            return
        for until, nbytes, job in plan.decode:
            if not self._submit(functools.partial(self._run, stream, generation, job), nbytes):
                return  # over budget: try again on a later read
            stream.ahead_until = until

    def _advise_rest(self, view: Served, start: int, stop: int) -> bool:
        """Tensor-aware read-ahead: a reader found streaming a file has the stored bytes of the rest of it
        advised as one unit (``WHOLE_ADVICE_BYTES`` ahead of the reader; for a source that fetches what is
        advised, extended as the reader moves on) — a remote source fetches them over as many parallel
        ranges as its origin allows instead of growing a window read by read, a local file's kernel reads
        them in. Decoding stays within the window above: it costs cache memory. Whether the sources fetch
        ahead (``Advised.fetches_ahead``)."""
        far = False
        for name, offset, nbytes in view.ahead(start, stop).advise:
            self._advise(name, offset, nbytes, False)
            far = far or self._sources.get(name).fetches_ahead
        return far

    def _fetch_ahead(self, view: Served) -> bool:
        """Whether the source of ``view``'s stored bytes fetches what is advised (a remote source)."""
        return any(self._sources.get(name).fetches_ahead for name, _, _ in view.ahead(0, min(view.size, 1)).advise)

    def _follow(self, stream: _Stream, nbytes: int) -> None:
        """Tensor-aware read-ahead: a stream reaching its file's end goes on into the file of the tensor stored
        next (``Served.following``), whose first ``nbytes`` are advised and decoded now, before the reader opens
        it — once the reader has been seen to go on to the file stored next (a loader reading in file order;
        ``cat *`` reads in name order, where the work would be wasted). That work outlives the handle (the
        reader closes this file to open the next)."""
        following = stream.view.following()
        if following is None or not following.reads_ahead:
            return
        self._expected = following.slot
        if not self._in_file_order:
            return  # not (yet) seen reading in file order: decoding ahead for it would be wasted work
        plan = following.ahead(0, min(following.size, nbytes))
        for name, offset, size in plan.advise:
            self._advise(name, offset, size, False)
        if self._decodes_ahead(following):
            for _, size, job in plan.decode:
                if not self._submit(functools.partial(self._unless_closed, job), size):
                    return

    def _chain_after(self, view: Served) -> None:
        """For a reader in file order near the end of ``view``: advise the stored bytes of the files stored
        after it until ``FOLLOW_ADVICE_BYTES`` of them are advised ahead (``FOLLOW_FILES`` more at most), as a
        few merged ranges. The files advised and not yet opened are kept in order (``_chain``), so each file
        extends the chain from its end instead of walking it again. Called for a stream whose source fetches
        what is advised (``_Stream.far``): a local file's kernel reads ahead itself."""
        following = view.following()
        if following is None:
            return
        self._expected = following.slot
        if not self._in_file_order:
            return  # not (yet) seen reading in file order
        with self._lock:
            if self._chain and self._chain[0][0] != following.slot:
                self._chain.clear()  # advised for another place in the file: not what lies ahead of this one
            last = self._chain[-1][1] if self._chain else view
            ahead = sum(chained.size for _, chained in self._chain)
        advice: list[tuple[str, int, int]] = []
        added: list[tuple[Hashable, Served]] = []
        for _ in range(FOLLOW_FILES):
            if ahead >= FOLLOW_ADVICE_BYTES:
                break
            nxt = last.following()
            if nxt is None or not nxt.reads_ahead:
                break
            advice += nxt.ahead(0, nxt.size).advise
            added.append((nxt.slot, nxt))
            ahead += nxt.size
            last = nxt
        with self._lock:
            self._chain.extend(added)
        for name, offset, size in _merged(advice):
            self._advise(name, offset, size, False)

    def _decodes_ahead(self, view: Served) -> bool:
        return self.decode_ahead and not (self.into_reply and view.decodes_into_reply)

    def _submit(self, job: Callable[[], None], nbytes: int) -> bool:
        """Queue a decode job on the scheduler within this cache's share; False when over budget."""
        future = self._scheduler.submit("decode", job, nbytes, cap=self._share)
        if future is None:
            return False
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)
        return True

    def _unless_closed(self, job: Callable[[ReadScope], None]) -> None:
        if not self._closed:
            job(DECIDED)

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    def _run(self, stream: _Stream, generation: int, job: Callable[[ReadScope], None]) -> None:
        """A decode job, unless its stream ended, turned random or this decode-ahead closed since it was queued
        (a failing group fails the read that needs it, with its own error: the scheduler logs it)."""
        if not self._closed and not stream.closed and stream.generation == generation:
            job(DECIDED)

    def _advise(self, path: str, offset: int, nbytes: int, sequential: bool) -> None:
        if nbytes > 0:
            self._sources.get(path).advise(offset, nbytes, sequential=sequential, scope=DECIDED)

    def close(self, wait: bool = False) -> None:
        """Stop: queued work of this decode-ahead is skipped, or with ``wait`` finished first (the scheduler's
        workers are the process's and stay)."""
        if wait:
            with self._lock:
                pending = list(self._pending)
            wait_for(pending)
        self._closed = True


def _merged(advice: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Advice with the ranges of one file that overlap or lie within ``MERGE_GAP`` of each other joined (the
    stored bytes of tensors stored one after another, between them the format's alignment padding): one range
    is fetched as whole pieces, many small ones as as many small requests."""
    out: list[tuple[str, int, int]] = []
    for name, offset, size in sorted(advice):
        if out and out[-1][0] == name and offset <= out[-1][1] + out[-1][2] + MERGE_GAP:
            last = out[-1]
            out[-1] = (name, last[1], max(last[2], offset + size - last[1]))
        else:
            out.append((name, offset, size))
    return out
