"""Sequential detection, once: whether each read of a stream continues the ones before it.

A read continues a run when it starts within ``slack`` bytes of where the run has reached (the kernel sends
neighbouring readahead requests slightly out of order, and FUSE serves them on several threads). The run
reaches the furthest byte read; a read elsewhere starts a new run. The caller holds its own lock around a
stream (it updates more state of its own in the same step).
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
