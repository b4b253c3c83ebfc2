"""Reading the front of a checkpoint file through its byte source, growing the buffer only as needed.

Headers are parsed from an in-memory ``bytearray`` prefix rather than an mmap: a file that is truncated
while we parse it would make an mmap raise SIGBUS, whereas a failed ``pread`` is just an error we can
report. The prefix grows geometrically, so a header of any size costs O(log size) reads — which matters
most for remote sources, where each read is a round trip: their first read is larger (``initial_read`` of
the source, a few MiB), so a 262,144-token vocabulary or a 94,000-tensor header arrives in a few requests.
A hostile length field can never make us read (or allocate) past the real end of the file: every request is
checked against the file size first, and the caller turns the refusal into a ``CheckpointError`` that names
the field.
"""

from __future__ import annotations

from ckptfs.core.errors import CheckpointError
from ckptfs.sources import DEFAULT_OPENER, ByteSource, Opener

#: First read size for a local file: most headers in one read, free for tiny files.
INITIAL_READ = 256 * 1024


class FilePrefix:
    """The bytes ``[0, len(self.data))`` of one file, read on demand; ``size`` is the file size at open.

    ``source`` may be given (an already open ByteSource, which the prefix then does not close); otherwise
    ``path`` is opened through ``opener`` (``ckptfs.sources.Opener``: a checkpoint's remote options, mirrors).
    """

    def __init__(self, path: str, source: ByteSource | None = None, opener: Opener = DEFAULT_OPENER) -> None:
        self.path = path
        self._owned = source is None
        self.source: ByteSource | None = opener.source(path) if source is None else source
        self.size = self.source.size
        self._initial = max(INITIAL_READ, self.source.initial_read)
        self.data = bytearray()

    def close(self) -> None:
        if self._owned and self.source is not None:
            self.source.close()
        self.source = None

    def __enter__(self) -> FilePrefix:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def has(self, end: int) -> bool:
        """Whether ``end`` bytes exist in the file (not necessarily loaded yet)."""
        return end <= self.size

    def need(self, end: int) -> None:
        """Load at least the first ``end`` bytes. The caller must have checked ``end <= self.size``."""
        have = len(self.data)
        if end <= have:
            return
        target = min(self.size, max(end, 2 * have, self._initial))
        self.data += self._pread(have, target - have)

    def read_at(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer at the end of the file), not kept."""
        size = max(0, min(size, self.size - offset))
        have = len(self.data)
        if offset + size <= have:
            return bytes(self.data[offset: offset + size])
        return self._pread(offset, size)

    def _pread(self, offset: int, size: int) -> bytes:
        if size <= 0:
            return b""
        if self.source is None:
            raise CheckpointError(self.path, offset, "cannot read the header: the file was closed")
        try:
            return self.source.pread(offset, size)
        except CheckpointError as exc:
            raise CheckpointError(self.path, exc.offset, f"cannot read the header: {exc.reason}") from None

    def snapshot(self, end: int) -> bytes:
        """An immutable copy of the first ``end`` loaded bytes, for values decoded after the file is closed."""
        return bytes(memoryview(self.data)[:end])
