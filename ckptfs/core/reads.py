"""What a caller says about one read of stored bytes: :class:`ReadScope`, passed down by hand.

A read made for an application (a FUSE request, a library ``pread``) goes down through layers that each know
one thing about it, and the remote byte source at the bottom is the one that must act on them:

- the mount (``ckptfs.sources.plan.SourcePlan.read_scope``) knows the read must end by ``--timeout`` from
  now, however many source reads it takes (``deadline``); a mirror wrapper narrows that deadline so one
  covers every copy it tries;
- a mirror wrapper (``ckptfs.sources.mirror``) knows whether another copy stands behind the member it asks
  (``fallback``: a stalled attempt gives up at once and other failures are retried once, so the deadline is
  left for the next copy);
- the handle's decode-ahead (a layer nearer the reader than the source) knows when it watches the reader's
  stream and advises the source what comes next (``decided``: the source then follows that advice instead of
  detecting the stream again, ``ckptfs.ahead.detect``).

The object travels as the keyword-only ``scope`` of ``ByteSource.pread`` / ``pread_into`` / ``advise``, and
of the engine's reads between a view and its source (``View.read_into``, ``TensorValues.bytes_into``...),
so what a read is carrying can be seen in the signature of every function it passes through, and a piece of
work handed to another thread carries it as an argument. It lives here, on the ground floor, because both
``ckptfs.engine`` (which passes it) and ``ckptfs.sources`` (which acts on it) import it and neither may
import the other's way; the remote layer turns it into its own richer per-read state
(``ckptfs.sources.remote.context.ReadContext``) as the read enters a remote source.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ReadScope:
    """What a caller above ``ByteSource.pread`` says about a read (see the module docstring). The default,
    :data:`NOTHING_SAID`, leaves everything to the source: its own ``--timeout`` per read, no copy behind it,
    the stream judged by the source itself."""

    deadline: float | None = None  # monotonic seconds the read must end by; None: each source read's own timeout
    fallback: bool = False         # another copy is tried when this read fails (a mirror)
    decided: bool = False          # the read belongs to a stream a layer nearer the reader watches (decode-ahead)

    def within(self, timeout: float) -> ReadScope:
        """This scope, ending ``timeout`` seconds from now at the latest (or at its own deadline if sooner)."""
        end = time.monotonic() + timeout
        return replace(self, deadline=end if self.deadline is None else min(self.deadline, end))

    def backed(self, fallback: bool = True) -> ReadScope:
        """This scope, with (or without) another copy behind the read."""
        return self if self.fallback == fallback else replace(self, fallback=fallback)

    def streaming(self) -> ReadScope:
        """This scope, for a read of a stream decided above (decode-ahead's)."""
        return self if self.decided else replace(self, decided=True)

    def end(self, timeout: float) -> float:
        """The deadline of a source read entering now whose own timeout is ``timeout``: that, or this scope's
        end if sooner."""
        end = time.monotonic() + timeout
        return end if self.deadline is None else min(self.deadline, end)


#: Nothing said about a read: the default of every ``scope`` parameter.
NOTHING_SAID = ReadScope()
#: A read (or advice) of a stream whose read-ahead a layer above the source decides, with no deadline of its own.
DECIDED = ReadScope(decided=True)
