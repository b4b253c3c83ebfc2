"""A byte source that records every range read of a file: what the laziness tests count."""

from __future__ import annotations

from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.sources.base import ByteSource


class Counting(ByteSource):
    """Records every range read of a file."""

    def __init__(self, inner: ByteSource, calls: list):
        self.inner, self.name, self.size, self.identity = inner, inner.name, inner.size, inner.identity
        self.calls = calls

    def content_id(self) -> str:
        return self.inner.content_id()

    def pread(self, offset: int, size: int, *, scope: ReadScope = NOTHING_SAID) -> bytes:
        self.calls.append((offset, size))
        return self.inner.pread(offset, size, scope=scope)
