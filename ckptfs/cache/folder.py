"""The mechanics of a ``--cache-dir`` folder that both of its stores share: the decoded groups' ``DiskStore``
(``disk.py``) and the fetched remote bytes' ``SparseStore``.

Both stores write into one folder under one bound (``--cache-dir-size``), so what bounds and protects the
folder is written once, here, and each store is a :class:`FolderBound` that says only how it prunes: the
schedule of the bound's checks and the prune thread, the prunes held while a process forks
(:class:`PruneHold`), the pause after a full, read-only or vanished folder, the ``DIR/.lock`` that keeps
the prunes of all processes apart, and files opened private to this user whatever the umask.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ckptfs.cache import auth
from ckptfs.cache.counters import TierCounters
from ckptfs.core.runtime import Part, runtime

#: How long writing pauses after each kind of trouble (seconds).
PAUSE_S = {"full": 30.0, "read-only": 60.0, "error": 30.0}
#: Why writing pauses (``FolderBound.writes_paused``), for callers that advise on it.
FULL = "the file system is full"
NOT_WRITABLE = "the folder is not writable"


class FolderBound:
    """What the two stores of a ``--cache-dir`` folder share (the decoded groups' :class:`DiskStore` and the
    fetched bytes' ``SparseStore``): the schedule of the folder's size bound — a check every
    ``max_bytes / 64`` written, its prune on a thread of its own (a read never walks the folder), held back
    while a process is about to fork (:class:`PruneHold`) — and trouble: a full, read-only or vanished folder
    pauses writing for ``PAUSE_S`` and is logged once. A store says how it prunes (``_prune_due``)."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int, counters: tuple[str, ...],
                 logger: logging.Logger) -> None:
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self._check_every = max(4 << 20, self.max_bytes // 64)
        self._lock = threading.Lock()
        self._written_since_check = 0
        self._checked_once = False
        self._pruning = False
        self._pruner_pid = os.getpid()  # a child forked during a prune has no pruning thread
        self._paused_until = 0.0
        self._paused_why = ""  # what paused writing (``writes_paused``)
        self._counters = TierCounters(logger, counters)
        self._count, self._warn_once = self._counters.add, self._counters.warn_once
        self._folder_bytes = 0
        self._prunes = runtime().get(PRUNE_HOLD)  # the process's (a mount holds it across its fork)

    def _prune_due(self) -> None:  # pragma: no cover - interface
        """Prune the folder as the bound's schedule found it due (``wait=False``: give up at once when another
        process is pruning)."""
        raise NotImplementedError

    def _after_write(self, size: int) -> None:
        with self._lock:
            self._written_since_check += size
            self._folder_bytes += size
            due = not self._checked_once or self._written_since_check >= self._check_every
            if self._pruning and self._pruner_pid != os.getpid():
                self._pruning = False
            if not due or self._pruning:
                return
            self._pruning = True
            self._pruner_pid = os.getpid()
            self._checked_once = True
            self._written_since_check = 0
        if not self._prunes.owe(self):
            self._start_prune()

    def _start_prune(self) -> None:
        """The prune that fell due, on a thread of its own (a read never walks the folder)."""
        with self._lock:  # also after a fork: the thread runs in this process
            self._pruning = True
            self._pruner_pid = os.getpid()
        threading.Thread(target=self._background_prune, name="ckptfs-cache-prune", daemon=True).start()

    def _background_prune(self) -> None:
        """Prune until no prune is owed: writes made while one walks the folder can make the next one due,
        and ``_after_write`` does not start a second thread beside this one, so this one runs again (a burst
        of writes ending during a prune would otherwise leave the folder over its bound until the next write)."""
        while True:
            try:
                self._prune_due()
            except Exception as exc:  # noqa: BLE001 - a failed prune must not kill the process or a read
                self._warn_once("prune", "cache dir %s: prune failed: %s", self.root, exc)
                with self._lock:
                    self._pruning = False
                return
            with self._lock:
                if self._written_since_check < self._check_every:
                    self._pruning = False
                    return
                self._written_since_check = 0

    # -- trouble and counters ------------------------------------------------------------------------

    def _trouble(self, op: str, exc: OSError) -> None:
        code = exc.errno
        if code in (errno.ENOSPC, errno.EDQUOT):
            kind, what = "full", FULL
        elif code in (errno.EROFS, errno.EACCES, errno.EPERM):
            kind, what = "read-only", NOT_WRITABLE
        elif code == errno.ENOENT:
            kind, what = "error", "the folder is gone"
        else:
            kind, what = "error", errno.errorcode.get(code, str(code)) if code is not None else str(exc)
        self._count(errors=1)
        if op != "read":
            self._pause(kind, what)
            self._warn_once(kind, "cache dir %s: %s (%s: %s): not storing for %.0f s, decoding instead",
                            self.root, what, op, exc.strerror or exc, PAUSE_S[kind])
            if kind == "full":
                with self._lock:
                    self._checked_once = False  # the next successful write checks the bound again
        else:
            self._warn_once(f"read-{kind}", "cache dir %s: cannot read an entry (%s): decoding instead",
                            self.root, exc.strerror or exc)

    def _pause(self, kind: str, why: str) -> float:
        """Store nothing for ``PAUSE_S[kind]`` seconds (``writes_paused`` answers ``why`` meanwhile); how long."""
        self._paused_until = time.monotonic() + PAUSE_S[kind]
        self._paused_why = why
        return PAUSE_S[kind]

    def writes_paused(self) -> str | None:
        """Why this process stores nothing now (``"the file system is full"``, ...: the last write failed
        and writing pauses for ``PAUSE_S``), or None while writes go. A warm-up stops fetching on it: every
        byte it fetched would be thrown away."""
        return self._paused_why if time.monotonic() < self._paused_until else None

    def stats(self) -> dict[str, Any]:
        """This process's counters (``forged``: entries that failed the MAC, ``corrupt``: damaged ones); ``folder_bytes`` is the folder's size as last measured plus what this
        process wrote since (the whole folder, every namespace)."""
        counts = self._counters.snapshot()
        with self._lock:
            return {**counts, "bytes": counts["hit_bytes"], "folder_bytes": self._folder_bytes,
                    "max_bytes": self.max_bytes}


class PruneHold:
    """Prunes that fall due while a process is about to fork wait here instead of starting their thread.

    ``ckptfs mount`` opens the checkpoint before forking its daemon (so a bad source is a one-line error from
    the command itself), and a process can fork only while it has a single thread (``service/daemon.py``). Opening
    a remote checkpoint with ``--cache-dir`` writes its header's chunks into the folder, and the first write
    makes a prune due: were its thread started then, it could still be walking the folder at the fork (a
    large or slow folder, a loaded machine), and the mount failed. So the mount calls ``hold()`` before
    opening, and the daemon ``release()`` once forked, which starts the prunes owed meanwhile there, in the
    process that keeps the stores. Holding changes nothing else: entries are written as always.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = False
        self._owed: list[FolderBound] = []

    def hold(self) -> None:
        with self._lock:
            self._held = True

    def owe(self, store: FolderBound) -> bool:
        """True when prunes are held: ``store``'s prune is started by ``release`` instead of now."""
        with self._lock:
            if self._held and store not in self._owed:
                self._owed.append(store)
            return self._held

    def release(self) -> int:
        """Stop holding and start the prunes owed (in this process); how many were started."""
        with self._lock:
            owed, self._owed, self._held = self._owed, [], False
        for store in owed:
            store._start_prune()
        return len(owed)

    def in_child(self) -> PruneHold:
        """In a forked child (a mount's daemon): the prunes owed, to start at ``release``; a fresh lock."""
        self._lock = threading.Lock()
        return self


#: A runtime's hold on starting prune threads (see ``PruneHold``).
PRUNE_HOLD = Part("prune hold", PruneHold, PruneHold.in_child)


@contextlib.contextmanager
def folder_lock(root: Path, wait: bool) -> Iterator[bool]:
    """``DIR/.lock`` held exclusively (``flock``, released if the holder dies): one prune of the folder at a
    time across processes, whichever store runs it. Yields False when ``wait`` is False and another process
    holds it; True in a folder where the lock cannot be made (read-only: nothing can be deleted anyway)."""
    try:
        fd = open_private(root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    except OSError:
        yield True  # a read-only folder: nothing can be deleted anyway, but scanning is harmless
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open(path, flags)`` of a file only this user can read, 0600 whatever the umask; missing folders
    (the first write there, or the folder was deleted under us) are made again, 0700."""
    try:
        fd = os.open(path, flags, auth.FILE_MODE)
    except FileNotFoundError:
        auth.make_dirs(os.path.dirname(os.fspath(path)))
        fd = os.open(path, flags, auth.FILE_MODE)
    if flags & os.O_EXCL:
        try:
            os.fchmod(fd, auth.FILE_MODE)  # the umask may have taken bits this user needs (0600 exactly)
        except OSError:
            os.close(fd)
            raise
    return fd


def scandir(path: str | os.PathLike[str]) -> list[os.DirEntry[str]]:
    """The entries of ``path``, or none when it cannot be read (a vanished or unreadable folder is empty to a
    prune: another process may be deleting under it)."""
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []


def unlink(path: str) -> bool:
    """Delete ``path``; False when it could not be (already gone: another process pruned it first)."""
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
