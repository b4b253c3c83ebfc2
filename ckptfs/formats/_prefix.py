"""Reading the front of a checkpoint file with plain ``pread`` calls, growing the buffer only as needed.

Headers are parsed from an in-memory ``bytes``/``bytearray`` prefix rather than an mmap: a file that is
truncated while we parse it would make an mmap raise SIGBUS, whereas a short ``pread`` is just an error we
can report. The prefix grows geometrically, so a header of any size costs O(size) reads, and a hostile
length field can never make us read (or allocate) past the real end of the file: every request is checked
against the file size first, and the caller turns the refusal into a ``CheckpointError`` that names the
field.
"""

from __future__ import annotations

import os

from ..errors import CheckpointError

#: First read size: large enough for most headers without a regrowth, small enough to be free for tiny files.
INITIAL_READ = 256 * 1024


class FilePrefix:
    """The bytes ``[0, len(self.data))`` of one file, read on demand; ``size`` is the file size at open."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise CheckpointError(path, None, f"cannot open: {exc.strerror or exc}") from None
        try:
            self.size = os.fstat(self._fd).st_size
        except OSError as exc:
            self.close()
            raise CheckpointError(path, None, f"cannot stat: {exc.strerror or exc}") from None
        self.data = bytearray()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

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
        target = min(self.size, max(end, 2 * have, INITIAL_READ))
        self._read_into(have, target)
        if len(self.data) < end:
            raise CheckpointError(self.path, len(self.data),
                                  f"file shrank while reading its header (has {len(self.data)} bytes, "
                                  f"needed {end})")

    def read_at(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` without keeping them (for data beyond the header)."""
        out = bytearray()
        while len(out) < size:
            chunk = self._pread(size - len(out), offset + len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def _read_into(self, start: int, end: int) -> None:
        while start < end:
            chunk = self._pread(end - start, start)
            if not chunk:
                return
            self.data += chunk
            start += len(chunk)

    def _pread(self, size: int, offset: int) -> bytes:
        try:
            return os.pread(self._fd, min(size, 1 << 30), offset)
        except OSError as exc:
            raise CheckpointError(self.path, offset, f"cannot read: {exc.strerror or exc}") from None

    def snapshot(self, end: int) -> bytes:
        """An immutable copy of the first ``end`` loaded bytes, for values decoded after the file is closed."""
        return bytes(memoryview(self.data)[:end])
