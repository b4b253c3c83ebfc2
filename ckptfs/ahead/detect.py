"""Sequential detection, once: whether each read of a stream continues the ones before it.

A read continues a run when it starts within ``slack`` bytes of where the run has reached (the kernel sends
neighbouring readahead requests slightly out of order, and FUSE serves them on several threads). The run
reaches the furthest byte read; a read elsewhere starts a new run. The caller holds its own lock around a
stream (it updates more state of its own in the same step).

One stream, one decision. A read of a mount's open file passes through two layers that could each watch
it: the handle (``ckptfs.ahead.decode``: decode-ahead) and, for a remote file, the byte source below it
(``ckptfs.ahead.fetch``: fetch-ahead). The layer nearest the reader that watches the stream
decides: a handle that tracks its stream says so in the scope its reads, its advice and the work it
schedules ahead pass down (``ckptfs.core.reads.ReadScope.decided``), and tells the source what comes next by
advising those bytes; a source then follows that advice and its reader's position instead of detecting on
its own. A source read by no such handle (the library API, a view that does not read ahead, read-ahead
turned off) is told nothing and decides for itself.
"""

from __future__ import annotations


class SequentialRun:
    """The state of one stream (see the module docstring)."""

    __slots__ = ("slack", "end", "streak")

    def __init__(self, slack: int = 0) -> None:
        self.slack = slack
        self.end = -1      # the furthest byte the run has read (exclusive); -1 before any read
        self.streak = 0    # reads in a row that continued the run

    def observe(self, offset: int, size: int, slack: int | None = None) -> int:
        """Note a read of ``size`` bytes at ``offset``; the reads in a row that continued the run, this one
        included (0: this read starts a new run). ``slack`` overrides the stream's for this read."""
        slack = self.slack if slack is None else slack
        if self.end >= 0 and -slack <= offset - self.end <= slack:
            self.streak += 1
            self.end = max(self.end, offset + size)
        else:
            self.streak = 0
            self.end = offset + size
        return self.streak
