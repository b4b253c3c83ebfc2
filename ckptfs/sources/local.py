"""The local-file byte source: one file read with ``pread``, pinned to its state at open.

Reads use ``pread`` on a file descriptor opened once, never a long-lived mmap: a mounted checkpoint can be
truncated or rewritten under a live daemon, and touching an mmap'd page past the new end of file raises
SIGBUS, which would kill the daemon and leave a dead mount. With pread a vanished byte is just a short read,
which becomes a ``CheckpointError`` (EIO at the mount).

Every read is pinned to the file as it was when first opened: the size is fixed then, and a change of size
or mtime seen after a read turns that read into an error — a reader gets the bytes as of open time or an
error, never other bytes. A replaced or deleted file keeps serving its old bytes through the open
descriptor. When the descriptor had to be closed (the pool bounds open files), reopening checks that the
path still names the same file.

Identity: ``(dev, ino, size, mtime_ns, ctime_ns)`` fixed at open. Each read re-checks size and mtime, and
ctime: a change of ctime alone (a ``chmod``, ``chown``, ``link``, ``rename``, or an in-place rewrite that
put the mtime back: ``touch -r``, ``rsync --inplace -t``) never fails a read — a ``chmod`` must not break
a mount — but is counted (``changes``), and the readers that check bytes check them again: a manifest's
chunks (``integrity.checked``), the checksums of what was served (``sources.served``). ctime is part of
the *content identity* that caches shared across processes key on, so such a rewrite gets a new identity at
the next open.
"""

from __future__ import annotations

import builtins
import logging
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ckptfs.core.errors import CheckpointError
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.sources.base import ByteSource, Folder
from ckptfs.sources.identity import local_content_id
from ckptfs.sources.served import ServedSums, chunk_sum_fd

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileStamp:
    """What a mount fixes about a local file when it is mounted: which file it is (``pin``: device, inode,
    size, mtime, the first four parts of a ``FileSource``'s identity) and who may read it (owner, group, mode
    of the file itself: a symlink's target's). ``MISSING`` stands for a file that could not be stat'ed: it
    matches no file and lets nobody read."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    uid: int
    gid: int
    mode: int
    MISSING: ClassVar[FileStamp]

    @classmethod
    def of(cls, st: os.stat_result) -> FileStamp:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_uid, st.st_gid, st.st_mode)

    @property
    def pin(self) -> tuple[int, int, int, int]:
        return self.dev, self.ino, self.size, self.mtime_ns

    def matches(self, identity: tuple[Any, ...]) -> bool:
        """Whether a source whose ``identity`` this is (a ``FileSource``'s, or a wrapper's copy of it) reads
        the file this stamp was taken of, as it was then."""
        return tuple(identity[:4]) == self.pin


FileStamp.MISSING = FileStamp(-1, -1, -1, -1, 0, 0, 0)


def stamp_path(path: str) -> FileStamp:
    """The stamp of the file or folder at ``path`` now (links followed); ``FileStamp.MISSING`` if it cannot be
    stat'ed."""
    try:
        return FileStamp.of(os.stat(path))
    except (OSError, ValueError):
        return FileStamp.MISSING


class FileSource(ByteSource):
    """One local file, read with pread and pinned to its state at first open.

    ``path`` names the file in messages; ``open_path`` (default: ``path``) is what is opened, so that a
    relative name can be opened from the directory it was given in (see ``SourcePool``).
    """

    def __init__(self, path: str, open_path: str | None = None) -> None:
        self.path = self.name = path
        self._open_path = open_path if open_path is not None else path
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._users = 0
        self._close_when_idle = False
        fd = self._open_fd()
        st = os.fstat(fd)
        # a block device (a checkpoint written to a raw device) has st_size 0: its size is where it ends
        self.size = os.lseek(fd, 0, os.SEEK_END) if stat.S_ISBLK(st.st_mode) else st.st_size
        self._identity = (st.st_dev, st.st_ino)
        self._stamp = (st.st_size, st.st_mtime_ns)
        self.identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        self.mtime_ns = st.st_mtime_ns
        self._ctime_ns = st.st_ctime_ns  # the last ctime seen: a change is counted in ``changes``
        #: a checksum of each chunk as first read, compared once the ctime moves (sources/served.py)
        self.sums = ServedSums(self.size, st.st_ctime_ns)
        self._fd = fd

    def content_id(self) -> str:
        """The machine-local content identity (see ``ckptfs.sources.identity``)."""
        return local_content_id(self.identity)

    def _open_fd(self) -> int:
        try:
            return os.open(self._open_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))  # probe: platform
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
            self._saw(st.st_ctime_ns)
            self._fd = fd

    def _saw(self, ctime_ns: int) -> None:
        """Count a ctime other than the last one seen (``changes``: the bytes checkers check again)."""
        if ctime_ns != self._ctime_ns:
            self._ctime_ns = ctime_ns
            self.changes += 1

    def ensure_open(self) -> None:
        """Reopen the descriptor if the pool closed it, refusing a file that is no longer the same."""
        with self._lock:
            self._reopen_locked()

    def _acquire_fd(self) -> int:
        with self._lock:
            self._reopen_locked()
            self._users += 1
            assert self._fd is not None  # reopened above
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

    def pread(self, offset: int, size: int, *, scope: ReadScope = NOTHING_SAID) -> bytes:
        """Exactly ``size`` bytes at ``offset``, as the file was at open, or CheckpointError (``scope``: a local
        read has no use for it)."""
        if size <= 0:
            return b""
        chunks = []

        def read(fd: int, done: int) -> int:
            chunk = os.pread(fd, size - done, offset + done)
            chunks.append(chunk)
            return len(chunk)

        ctime_ns = self._read_checked(offset, size, read)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._check_served(offset, data, ctime_ns)
        return data

    def pread_into(self, offset: int, target: memoryview, *, scope: ReadScope = NOTHING_SAID) -> None:
        """``pread`` straight into ``target`` (a writable byte buffer): no intermediate bytes object."""
        if not isinstance(target, memoryview):
            target = memoryview(target)  # slicing a bytearray would copy it: the read would fill the copy
        size = len(target)
        if size > 0:
            ctime_ns = self._read_checked(offset, size, lambda fd, done: os.preadv(fd, [target[done:]], offset + done))
            self._check_served(offset, target, ctime_ns)

    def _check_served(self, offset: int, data: bytes | memoryview, ctime_ns: int) -> None:
        """CheckpointError when bytes served before differ now (a rewrite that put the mtime back), or when
        the file's ctime keeps moving while the chunks a read covers in part are read whole for the check."""
        changed, edges = self.sums.check(offset, data, ctime_ns, self._chunk_sum)
        if changed is not None:
            raise CheckpointError(self.path, changed, "bytes served before differ now: the file was rewritten in "
                                                      "place (its ctime moved, its size and mtime kept)")
        if edges and self._ctime_now() != ctime_ns:
            raise CheckpointError(self.path, offset, "the file's status changed while its bytes were checked "
                                                     "(ctime): read it again")

    def _chunk_sum(self, start: int, length: int) -> int:
        """The sum of the whole served-checksum chunk at ``start``, read for it (sources/served.py)."""
        fd = self._acquire_fd()
        try:
            got = chunk_sum_fd(fd, start, length)
        except OSError as exc:
            raise CheckpointError(self.path, start, f"read failed: {exc.strerror}") from None
        finally:
            self._release_fd()
        if got is None:
            raise CheckpointError(self.path, start, "the file changed since it was opened (truncated or rewritten)")
        return got

    def _ctime_now(self) -> int:
        fd = self._acquire_fd()
        try:
            return os.fstat(fd).st_ctime_ns
        finally:
            self._release_fd()

    def _read_checked(self, offset: int, size: int, read: Callable[[int, int], int]) -> int:
        """Run ``read(fd, bytes done so far) -> bytes read`` until ``size`` bytes at ``offset`` are read, then
        check the file is as it was at open (size and mtime); CheckpointError otherwise. Returns the file's
        ctime after the read (a change is counted, never an error)."""
        if offset < 0 or offset + size > self.size:
            raise CheckpointError(self.path, max(offset, self.size),
                                  f"bytes {offset}..{offset + size} lie past the end of the file ({self.size} bytes)")
        fd = self._acquire_fd()
        try:
            done = 0
            while done < size:
                n = read(fd, done)
                if not n:
                    break
                done += n
            st = os.fstat(fd)
        except OSError as exc:
            raise CheckpointError(self.path, offset, f"read failed: {exc.strerror}") from None
        finally:
            self._release_fd()
        if done < size or (st.st_size, st.st_mtime_ns) != self._stamp:
            raise CheckpointError(self.path, offset, "the file changed since it was opened (truncated or rewritten)")
        self._saw(st.st_ctime_ns)
        return st.st_ctime_ns

    def advise(self, offset: int, size: int, sequential: bool = False, *, scope: ReadScope = NOTHING_SAID) -> None:
        """Tell the kernel these bytes are wanted soon (best effort; never fails, never reopens)."""
        if not hasattr(os, "posix_fadvise"):  # probe: platform
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


class LocalFolder(Folder):
    """A local directory as a model folder. Names are joined to the path as given, never resolved: Hugging
    Face cache snapshots are folders of links into ``blobs/``, and resolving would lose every name.

    A symlink is listed when the file it leads to lies inside the folder (once every link is resolved), or,
    for a folder inside a Hugging Face cache (``.../REPO/snapshots/REV``), inside that repository's folder
    (its ``blobs/``). A link that leads elsewhere (``shadow.txt -> /etc/shadow``) is left out, with one log
    line: a folder's files are what a mount of it serves, and a link planted there must not bring in a file
    from anywhere on the machine.
    """

    def __init__(self, path: str) -> None:
        self.name = path
        self._broken: list[str] = []

    def list(self) -> dict[str, int]:
        files: dict[str, int] = {}
        self._broken = []
        roots: list[str] | None = None  # where links may lead: found at the first link
        with os.scandir(self.name or ".") as entries:
            for entry in entries:
                name = entry.name
                if name.startswith("."):
                    continue
                try:
                    st = entry.stat()  # follows links: a link to a file is a file
                except OSError:
                    self._broken.append(name)
                    continue
                if stat.S_ISDIR(st.st_mode):
                    continue
                if not stat.S_ISREG(st.st_mode):
                    self._broken.append(name)
                    continue
                if entry.is_symlink():
                    roots = roots if roots is not None else link_roots(self.name or ".")
                    if not _inside(os.path.realpath(entry.path), roots):
                        log.warning("%s: left out %s: a link to a file outside the folder", self.name or ".", name)
                        continue
                files[name] = st.st_size
        return files

    def broken(self) -> builtins.list[str]:  # builtins: ``list`` here is the method
        return list(self._broken)

    def join(self, name: str) -> str:
        return os.path.join(self.name, name)


def link_roots(folder: str) -> list[str]:
    """The folders a link listed in ``folder`` may lead into: the folder itself (resolved) and, inside a
    Hugging Face cache, the repository folder that holds ``snapshots/`` and ``blobs/``."""
    real = os.path.realpath(folder)
    roots = [real]
    here = real
    while True:
        parent = os.path.dirname(here)
        if parent == here:
            return roots
        if os.path.basename(here) == "snapshots" and os.path.isdir(os.path.join(parent, "blobs")):
            return roots + [parent]
        here = parent


def within(path: str, roots: list[str]) -> bool:
    """Whether ``path``, every link resolved, lies in one of ``roots`` (``link_roots``): where a folder's
    listing lets a link lead."""
    return _inside(os.path.realpath(path), roots)


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def open_local_folder(path: str) -> LocalFolder | None:
    return LocalFolder(path) if os.path.isdir(path) else None
