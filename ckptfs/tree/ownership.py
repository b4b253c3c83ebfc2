"""Who may read what a mount shows, and which file each local file of a mount is: both fixed at mount time.

Why: the kernel checks a mount's permissions itself (``default_permissions``) against the owner and mode that
``getattr`` reports, and a mount made by root with ``-o allow_other`` serves every user. If every file showed
0444, any user would read through the mount a ``secret.json`` of mode 0600, or the tensors of a checkpoint
they may not read. So each file carries the owner, group and permission bits of the file it comes from (a
symlink's target's), write bits cleared since the mount is read-only:

- a passed-through file or a checkpoint's own file: its file's bits, read and execute kept;
- a tensor's ``.npy``, ``.raw`` and ``.meta.json``: the bits of the file the tensor is stored in, read only;
- a file made from several files (``metadata.json`` of a sharded checkpoint, a split set's ``model.gguf``,
  ``hf/``, a view of packed parts): readable only by those who can read every one of them (``combined``);
- a folder that is a folder of the source (a folder mount's root): its own bits, write cleared;
- a folder made from files (a single-file mount's root, a repository's folder of one checkpoint):
  ``r-x`` for each class that may read those files; folders that only sort names (``--layout tree``,
  ``hf/``) are ``r-x`` for all: what they hold carries its own bits.

The mount's root is walled in by the folders above the source as well (``walled``): a class of users that
cannot search one of them cannot reach the folder without the mount, so the root's bits for that class are
cleared (``mkdir -m700 p; ckptfs mount p/m M -o allow_other``: others find ``M`` 0500, closed).

Owner and mode are those of the files as they are now, not as they were at mount: each file's (and each
folder's above the root) ``stat`` is taken again when the last one is older than ``MODES_TTL_S``, and the
kernel asks again for a local mount's attributes after ``ATTR_TIMEOUT_S`` (service/options.py), so a ``chmod``
after the mount is honoured within the sum of the two.

Remote files have no owner: their files are the mounting user's, 0444, and folders 0555, as before.

The stamps taken at mount also pin each file (``FileStamp.pin``: device, inode, size, mtime): a file
opened after the mount (a passed-through file at its first read, a repository's checkpoint at the first look
into its folder) must be the file stamped, or its reads give EIO, never the bytes of a file put there later.
"""

from __future__ import annotations

import functools
import os
import pwd
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ckptfs.core.errors import CheckpointError
from ckptfs.sources import is_url
from ckptfs.sources.local import FileStamp, stamp_path

READ = 0o444
READ_EXECUTE = 0o555
#: How long a stat taken of a file or folder tells its owner and mode (seconds); see the module docstring.
MODES_TTL_S = 1.0
_CLASSES = (stat.S_IRUSR | stat.S_IXUSR, stat.S_IRGRP | stat.S_IXGRP, stat.S_IROTH | stat.S_IXOTH)


@dataclass(frozen=True)
class Ownership:
    """The owner, group and permission bits (no file type) a mount reports for one file or folder."""

    uid: int
    gid: int
    perm: int


def of_file(stamp: FileStamp, keep_execute: bool) -> Ownership:
    """A file served from the file ``stamp`` describes: its owner and read (and execute) bits."""
    return Ownership(stamp.uid, stamp.gid, stamp.mode & (READ_EXECUTE if keep_execute else READ))


def of_folder(stamp: FileStamp) -> Ownership:
    """A folder of the mount that is the folder ``stamp`` describes: its bits, write cleared."""
    return Ownership(stamp.uid, stamp.gid, stamp.mode & READ_EXECUTE)


def as_folder(readers: Ownership) -> Ownership:
    """A folder made from files that ``readers`` may read: ``r-x`` for each class with read permission."""
    perm = 0
    for bits, read in zip(_CLASSES, (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)):
        perm |= bits if readers.perm & read else 0
    return Ownership(readers.uid, readers.gid, perm)


def combined(stamps: Iterable[FileStamp]) -> Ownership | None:
    """Read bits that let a user read a file made from all of ``stamps`` only if they may read each of them.

    Files of one owner and group: the bits all of them grant. Where owners (or groups) differ, the owner's
    (group's) bits are those every file grants to others: owning one of the files says nothing about the
    others. None for no files."""
    stamps = list(stamps)
    if not stamps:
        return None
    first = stamps[0]
    others = _all(s.mode for s in stamps) & 0o004
    user = _all(s.mode for s in stamps) & 0o400 if all(s.uid == first.uid for s in stamps) else others << 6
    group = _all(s.mode for s in stamps) & 0o040 if all(s.gid == first.gid for s in stamps) else others << 3
    return Ownership(first.uid, first.gid, user | group | others)


def _all(modes: Iterable[int]) -> int:
    bits = READ
    for mode in modes:
        bits &= mode
    return bits


class Stamps:
    """The stamps of a mount's local files and folders, taken when the mount is made (``take``) and looked up
    by the path the file is read by (``get``: the pins). A path not stamped then (a remote one: None) is
    stamped at its first lookup. ``now`` gives a file's stamp as it is now, within ``MODES_TTL_S``: the owner
    and mode the mount shows."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._stamps: dict[str, FileStamp] = {}
        self._now: dict[str, tuple[float, FileStamp]] = {}
        self._ancestors: dict[str, tuple[str, ...]] = {}
        self._clock = clock

    def take(self, paths: Iterable[str]) -> Stamps:
        for path in paths:
            self.get(path)
        return self

    def get(self, path: str) -> FileStamp | None:
        if is_url(path):
            return None
        stamp = self._stamps.get(path)
        if stamp is None:
            stamp = self._stamps.setdefault(path, stamp_path(path))
        return stamp

    def now(self, path: str) -> FileStamp | None:
        """The stamp of ``path`` taken at most ``MODES_TTL_S`` ago (None for a remote one)."""
        if is_url(path):
            return None
        now = self._clock()
        taken = self._now.get(path)
        if taken is None or now - taken[0] >= MODES_TTL_S:
            taken = self._now[path] = (now, stamp_path(path))
        return taken[1]

    def readers(self, paths: Iterable[str]) -> Ownership | None:
        """``combined`` over the files at ``paths`` as they are now; None when one of them is remote."""
        stamps = [self.now(path) for path in paths]
        return None if None in stamps else combined(s for s in stamps if s is not None)

    def walled(self, owner: Ownership, path: str) -> Ownership:
        """``owner`` (of the mount's root, made from ``path``) with the bits cleared of each class that cannot
        search every folder above ``path`` (as given and once links are resolved)."""
        ancestors = self._ancestors.get(path)
        if ancestors is None:
            ancestors = self._ancestors[path] = _ancestors(path)
        perm = owner.perm
        for folder in ancestors:
            stamp = self.now(folder)
            perm &= _searchers(stamp, owner) if stamp is not None else 0
        return Ownership(owner.uid, owner.gid, perm)


def _ancestors(path: str) -> tuple[str, ...]:
    """The folders above ``path``: those of the path as given (made absolute) and of its real path."""
    found: dict[str, None] = {}
    for start in (os.path.abspath(path), os.path.realpath(path)):
        here = os.path.dirname(start.rstrip(os.sep) or os.sep)
        while True:
            found[here] = None
            parent = os.path.dirname(here)
            if parent == here:
                break
            here = parent
    return tuple(found)


def _searchers(folder: FileStamp, owner: Ownership) -> int:
    """The permission bits of ``owner``'s classes that may search ``folder``: for the owner, the folder's bits
    for it as its owner, a member of its group or another; for the owner's group, the group bits when the
    folder has that group, else the others' (a member's other groups are not known); others: the others'."""
    mode = folder.mode
    if folder.uid == owner.uid:
        user = mode & stat.S_IXUSR
    elif folder.gid in _groups(owner.uid):
        user = mode & stat.S_IXGRP
    else:
        user = mode & stat.S_IXOTH
    group = mode & stat.S_IXGRP if folder.gid == owner.gid else mode & stat.S_IXOTH
    return (0o700 if user else 0) | (0o070 if group else 0) | (0o007 if mode & stat.S_IXOTH else 0)


@functools.lru_cache(maxsize=64)
def _groups(uid: int) -> frozenset[int]:
    """The groups user ``uid`` is a member of (none known for a uid no account names)."""
    try:
        account = pwd.getpwuid(uid)
        return frozenset(os.getgrouplist(account.pw_name, account.pw_gid))
    except (KeyError, OSError):
        return frozenset()


def check_pinned(path: str, identity: tuple, stamp: FileStamp | None) -> None:
    """CheckpointError unless the source of ``path`` (its ``identity``) reads the file stamped at mount."""
    if stamp is not None and not stamp.matches(identity):
        raise CheckpointError(path, None, "is not the file that was there when the folder was mounted "
                                          "(replaced or changed since)")
