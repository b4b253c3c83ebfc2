"""Byte sources: where stored tensor bytes come from.

Reads use ``pread`` on a file descriptor opened once, never a long-lived mmap: a mounted checkpoint can be
truncated or rewritten under a live daemon, and touching an mmap'd page past the new end of file raises
SIGBUS, which would kill the daemon and leave a dead mount. With pread a vanished byte is just a short read,
which becomes a ``CheckpointError`` (EIO at the mount).

Every read is pinned to the file as it was when first opened: the size is fixed then, and a change of size
or mtime seen after a read turns that read into an error — a reader gets the bytes as of open time or an
error, never other bytes. A replaced or deleted file keeps serving its old bytes through the open
descriptor. When the descriptor had to be closed (the pool bounds open files), reopening checks that the
path still names the same file.

A remote source (HTTP range, S3) plugs in by offering the same three things: ``path``, ``size``, ``pread``.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from .errors import CheckpointError


class FileSource:
    """One local file, read with pread and pinned to its state at first open.

    ``path`` names the file in messages; ``open_path`` (default: ``path``) is what is opened, so that a
    relative name can be opened from the directory it was given in (see ``SourcePool``).
    """

    def __init__(self, path: str, open_path: str | None = None):
        self.path = path
        self._open_path = open_path if open_path is not None else path
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._users = 0
        self._close_when_idle = False
        fd = self._open_fd()
        st = os.fstat(fd)
        self.size = st.st_size
        self._identity = (st.st_dev, st.st_ino)
        self._stamp = (st.st_size, st.st_mtime_ns)
        self._fd = fd

    def _open_fd(self) -> int:
        try:
            return os.open(self._open_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise CheckpointError(self.path, None, f"cannot open: {exc.strerror}") from None

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def _reopen_locked(self) -> None:
        if self._fd is None:
            fd = self._open_fd()
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self._identity or (st.st_size, st.st_mtime_ns) != self._stamp:
                os.close(fd)
                raise CheckpointError(self.path, None, "the file was replaced or changed since it was opened")
            self._fd = fd

    def ensure_open(self) -> None:
        """Reopen the descriptor if the pool closed it, refusing a file that is no longer the same."""
        with self._lock:
            self._reopen_locked()

    def _acquire_fd(self) -> int:
        with self._lock:
            self._reopen_locked()
            self._users += 1
            return self._fd

    def _release_fd(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._close_when_idle:
                self._close_locked()

    def _close_locked(self) -> None:
        # Only with no read in progress: a descriptor closed under a pread could be reused by another open.
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._close_when_idle = False

    def close_if_idle(self) -> bool:
        """Close the descriptor unless a read is using it; True if it is closed now."""
        with self._lock:
            if self._users == 0:
                self._close_locked()
            return self._fd is None

    def pread(self, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset``, as the file was at open, or CheckpointError."""
        if size <= 0:
            return b""
        if offset < 0 or offset + size > self.size:
            raise CheckpointError(self.path, max(offset, self.size),
                                  f"bytes {offset}..{offset + size} lie past the end of the file ({self.size} bytes)")
        fd = self._acquire_fd()
        try:
            chunks = []
            done = 0
            while done < size:
                chunk = os.pread(fd, size - done, offset + done)
                if not chunk:
                    break
                chunks.append(chunk)
                done += len(chunk)
            st = os.fstat(fd)
        except OSError as exc:
            raise CheckpointError(self.path, offset, f"read failed: {exc.strerror}") from None
        finally:
            self._release_fd()
        if done < size or (st.st_size, st.st_mtime_ns) != self._stamp:
            raise CheckpointError(self.path, offset, "the file changed since it was opened (truncated or rewritten)")
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def advise(self, offset: int, size: int, sequential: bool = False) -> None:
        """Tell the kernel these bytes are wanted soon (best effort; never fails, never reopens)."""
        if not hasattr(os, "posix_fadvise"):
            return
        with self._lock:
            if self._fd is None:
                return
            fd = self._fd
            self._users += 1
        try:
            if sequential:
                os.posix_fadvise(fd, offset, size, os.POSIX_FADV_SEQUENTIAL)
            os.posix_fadvise(fd, offset, size, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            self._release_fd()

    def close(self) -> None:
        """Close the descriptor now, or as soon as the reads using it are done."""
        with self._lock:
            if self._users:
                self._close_when_idle = True
            else:
                self._close_locked()


class SourcePool:
    """The files of one checkpoint, opened lazily, with a bound on descriptors held open at once.

    A checkpoint of hundreds of shards must not hold hundreds of descriptors; the least recently used idle
    ones are closed and reopened (identity-checked) when needed again. Only open sources are tracked in
    the LRU order, so a lookup costs O(1) however many shards there are.

    Relative paths are opened from the working directory the pool was made in: files are opened lazily, and
    by then the process may have moved (libfuse puts a mount daemon in ``/``; a program may ``chdir``), so
    ``model.gguf`` given in the model's folder must still name that file. The path stays as given everywhere
    else (messages, ``source`` in meta.json).
    """

    def __init__(self, max_open: int = 64):
        self.max_open = max(1, max_open)
        try:
            self._base: str | None = os.getcwd()
        except OSError:  # the working directory was deleted: only absolute paths can be opened anyway
            self._base = None
        self._sources: dict[str, FileSource] = {}
        self._open_lru: OrderedDict[str, FileSource] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str) -> FileSource:
        with self._lock:
            src = self._sources.get(path)
            if src is None:
                open_path = os.path.join(self._base, path) if self._base is not None else path
                src = self._sources[path] = FileSource(path, open_path)
            else:
                src.ensure_open()
            self._open_lru[path] = src
            self._open_lru.move_to_end(path)
            if len(self._open_lru) > self.max_open:
                self._trim()
            return src

    def _trim(self) -> None:
        for path, src in list(self._open_lru.items())[:-1]:
            if len(self._open_lru) <= self.max_open:
                break
            if src.close_if_idle():
                del self._open_lru[path]

    def open_count(self) -> int:
        with self._lock:
            return sum(1 for s in self._sources.values() if s.is_open)

    def close(self) -> None:
        """Close every descriptor. The sources stay known: a later read reopens one identity-checked, as
        after any close, instead of pinning whatever file has the name by then."""
        with self._lock:
            for src in self._sources.values():
                src.close()
            self._open_lru.clear()
