"""A read's state inside the remote layer, passed explicitly: :class:`ReadContext`.

One application read (a FUSE request, a library ``pread``) fans out inside ``ckptfs.sources.remote`` into
chunk fetches, retries, version checks and pieces handed to the scheduler's workers. What decides how each
of them behaves belongs to the read, not to the thread it runs on: its deadline (``--timeout``, narrowed by
a mirror wrapper so one deadline covers every copy), whether another copy waits behind it (a mirror: give
up a stall at once, retry once), whether it fetches ahead of readers (read-ahead, a warm-up: its version
checks are spaced), and when the answer to its ranged request began (a version check sent after that covers
the answer's bytes). A :class:`ReadContext` carries exactly that, handed from call to call (and to the
worker that fetches a handed-out piece), so nothing depends on which thread or ``contextvars`` context a
piece of work happens to run in.

It is built, as a read enters a remote source (:meth:`ReadContext.entering`), from what the caller said
about the read above ``ByteSource.pread`` (``ckptfs.core.reads.ReadScope``: its deadline, a mirror behind it),
handed down as an argument like everything else here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ckptfs.core.reads import NOTHING_SAID, ReadScope


class Slot(Protocol):
    """What a fetch ahead holds of its origin's in-flight limit (``ckptfs.ahead.limits.HeldSlot``)."""

    def release(self) -> None: ...


@dataclass
class ReadContext:
    """One read's state (see the module docstring). ``answered_at`` is the one field written on the way: a
    scheme's attempt sets it (``answered``) on the context it was given, and the retry loop hands the
    successful attempt's value to the fetch that asked (``ckptfs.sources.remote.origin``)."""

    deadline: float                  # monotonic seconds: the read ends by then
    fallback: bool = False           # a mirror waits behind this read
    ahead: bool = False              # fetched ahead of readers (read-ahead, a warm-up)
    once: bool = False               # one attempt, no retry (an open with a stored copy behind it)
    fresh: bool = False              # this attempt on a connection of its own (the last answer was odd)
    answered_at: float | None = None  # when the answer to this attempt's ranged request began (None: unsaid)
    slot: Slot | None = None          # the origin slot a fetch ahead holds: given back once its body is in
    on_answer: Callable[[], None] | None = None  # told when the answer begins (``version.VersionPin.fetching``)
    cut: Callable[[float], float] | None = None  # an attempt's deadline as the origin's outage cuts it (``until``)
    into: memoryview | None = None   # where the body may be written (a warm-up's landing buffer): ``landing_in``

    @classmethod
    def entering(cls, timeout: float, scope: ReadScope = NOTHING_SAID, once: bool = False) -> ReadContext:
        """The context of a read that enters a remote source now, as its caller scoped it (``scope``: a
        deadline, a mirror behind it); ``once``: one attempt (an open whose options say so:
        ``RemoteOptions.open_once``)."""
        return cls(scope.end(timeout), scope.fallback, once=once)

    @classmethod
    def fetching_ahead(cls, timeout: float, slot: Slot | None = None) -> ReadContext:
        """A fetch ahead of readers (read-ahead's pieces, a warm-up's): its own ``timeout``, no mirror, and
        the origin slot it holds, if any."""
        return cls(time.monotonic() + timeout, ahead=True, slot=slot)

    def bounded(self, deadline: float, cut: Callable[[float], float] | None = None) -> ReadContext:
        """This read's context for one attempt that must end by ``deadline`` (no answer heard yet); ``cut``: how
        an outage of its origin found meanwhile cuts that deadline (``outage.Outage.bound``)."""
        return dataclasses.replace(self, deadline=deadline, answered_at=None, cut=cut, fresh=False)

    def landing_in(self, into: memoryview | None) -> ReadContext:
        """This context for a request whose body may be written into ``into`` (exactly the range's length: a
        buffer the ``--cache-dir`` store lent, ``ChunkCache.landing``). A range client that can write there
        does, and answers ``[into]`` itself; one that cannot answers its parts as ever."""
        return self if into is None else dataclasses.replace(self, into=into)

    def until(self) -> float:
        """When this attempt must end, asked at each of its waits: its deadline, or sooner once its origin is
        found in an outage meanwhile (a body trickling in, a stall after the headers: such an attempt ends with
        the outage's patience, not its own)."""
        return self.deadline if self.cut is None else self.cut(self.deadline)

    def body_in(self) -> None:
        """A request's whole body is in: the origin slot this fetch holds is given back (the fetch may still
        wait for a version check; the origin no longer works for it)."""
        if self.slot is not None:
            self.slot.release()

    def answered(self) -> None:
        """For a scheme's attempt: the answer's status and headers are in, so the version its bytes come from
        is fixed (the server opened the file before answering). A version check sent after this moment covers
        the answer's bytes even while its body is still arriving (``ckptfs.sources.remote.version``)."""
        self.answered_at = time.monotonic()
        if self.on_answer is not None:
            self.on_answer()
