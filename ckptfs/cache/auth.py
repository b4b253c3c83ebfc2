"""Who may change what the shared tiers serve: the cache folder's ownership and modes, and the entries' key.

A decoded entry is served as the tensor's values, so whoever can write one decides what a mount returns.
Two rules keep that to the user running ckptfs (the attack they stop: another local user pre-creates the
folder a documented recipe names (docs/caches.md), or rewrites entries with a forged payload and recomputed crc32s):

- **Modes, like ssh's StrictModes.** A cache folder must be owned by this process's user (``geteuid``) and
  not writable by group or others; each folder on the way to it (symbolic links followed, ``walk``) must be
  owned by this user or root and, when writable by others, sticky (``/tmp``, ``/dev/shm``), and so must each
  symbolic link met on the way (a link's owner can point it elsewhere). A key file must be owned by this user and readable by
  nobody else. Anything else is refused with one line naming the fix, before anything is read or written.
  Folders ckptfs creates are 0700 and entries 0600 whatever the umask. Root using a folder a normal user
  made is refused like any other owner mismatch.
- **A key.** Every entry carries a MAC (``entry.py``) under a secret key: the ``--cache-key-file`` given
  (``$CKPTFS_CACHE_KEY_FILE``; the same file on every machine sharing a Redis), else, for a cache folder,
  ``DIR/.key``, 32 random bytes created 0600 on first use. An entry whose MAC does not check is a miss,
  deleted and counted (``forged``). A Redis without a key file has no key: its values are trusted as-is
  (the mount says so once), since a key of one machine's folder would fail every other machine's entries.

A key file's bytes are the key, whatever they are (``head -c 32 /dev/urandom``, ``openssl rand -hex 32``),
at least ``MIN_KEY_BYTES`` of them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import threading
from pathlib import Path

from ckptfs.core.runtime import Part, runtime
from ckptfs.util.keyed import MadeOnce

KEY_NAME = ".key"          # a cache folder's own key file
KEY_BYTES = 32             # of a key ckptfs makes
MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 4096
DIR_MODE = 0o700
FILE_MODE = 0o600


#: A runtime's cache keys read, by folder and key file (``folder_key``): each read, its folder and file
#: checked, once per process.
KEYS_READ = Part("cache keys read", MadeOnce[tuple[str, str | None], bytes], MadeOnce.in_child)


class CacheRefused(ValueError):
    """A cache folder or key file this user must not trust (the message: one line naming the fix)."""


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _check_own(path: str | os.PathLike[str], st: os.stat_result, what: str, kind: str, denied: int, how: str,
               fix: str) -> None:
    """CacheRefused unless ``st`` (of ``path``, a ``kind``) is this user's and has none of the ``denied``
    mode bits (``how`` says what they allow, ``fix`` the command that clears them)."""
    euid = os.geteuid()
    if st.st_uid != euid:
        raise CacheRefused(f"{what} {path} is owned by {_user(st.st_uid)}, not by {_user(euid)} who runs ckptfs: "
                           f"use a {kind} of your own (or, if you trust it, chown {_user(euid)} {path})")
    if st.st_mode & denied:
        raise CacheRefused(f"{what} {path} is {how} by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
                           f"{fix} {path}")


def check_dir(path: str | os.PathLike[str], what: str = "cache dir") -> None:
    """CacheRefused unless ``path`` (an existing folder), every folder on the way to it and every symbolic link
    met on the way pass the mode rules (``walk``)."""
    path = Path(os.path.abspath(path))
    real, missing = walk(path, what)
    if missing:
        raise FileNotFoundError(2, "No such file or directory", str(path))
    st = os.stat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheRefused(f"{what} {path} is not a folder")
    _check_own(path, st, what, "folder", 0o022, "writable", "chmod 700")


#: symbolic links followed on one path at most (the kernel's own limit, ELOOP past it)
MAX_LINKS = 40


def walk(path: Path, what: str) -> tuple[Path, list[str]]:
    """Follow absolute ``path`` from ``/`` as the kernel does, checking as it goes (as ssh's StrictModes
    judges a path): each folder a name is looked up in must be owned by this user or root and, when writable
    by group or others, sticky (``_check_folder``); each symbolic link met must be owned by this user or root
    (its owner could point it elsewhere: a link in ``/tmp`` is another user's to replace). Returns the real
    path of the longest part of ``path`` that exists, and the names after it that do not (none: all exist).
    CacheRefused for a component that fails; NotADirectoryError for a name looked up in a file."""
    euid = os.geteuid()
    todo = list(path.parts[1:])
    todo.reverse()
    here, links = Path("/"), 0
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            here = here.parent
            continue
        _check_folder(path, here, what)
        nxt = here / name
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return here, [name, *reversed(todo)]
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise CacheRefused(f"{what} {path}: more than {MAX_LINKS} symbolic links on its path")
            if st.st_uid not in (0, euid):
                raise CacheRefused(f"{what} {path}: the symbolic link {nxt} on its path is owned by "
                                   f"{_user(st.st_uid)}, who could point it elsewhere: use a path without it")
            target = os.readlink(nxt)
            if target.startswith("/"):
                here = Path("/")
            todo.extend(reversed(Path(target).parts[1:] if target.startswith("/") else Path(target).parts))
            continue
        if todo and not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(20, "Not a directory", str(nxt))
        here = nxt
    return here, []


def _check_folder(path: Path, folder: Path, what: str) -> None:
    """CacheRefused unless ``folder`` (one ``path`` is reached through) is owned by this user or root and, when
    writable by group or others, sticky: otherwise its owner could swap what is below it for their own."""
    euid = os.geteuid()
    pst = os.stat(folder)
    if pst.st_uid not in (0, euid):
        raise CacheRefused(f"{what} {path}: the folder {folder} above it is owned by {_user(pst.st_uid)}, who "
                           f"could replace it: use a folder under one owned by you or root")
    if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
        raise CacheRefused(f"{what} {path}: the folder {folder} above it is writable by group or others "
                           f"(mode {stat.S_IMODE(pst.st_mode):04o}) and not sticky: chmod go-w {folder}")


def make_dirs(path: str | os.PathLike[str]) -> None:
    """Create ``path`` and missing folders above it, each 0700 whatever the umask (existing ones untouched)."""
    path = Path(os.path.abspath(path))
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first: checked like any other
            folder.mkdir(mode=DIR_MODE)
            os.chmod(folder, DIR_MODE)


def check_creatable(path: str | os.PathLike[str], what: str = "cache dir") -> None:
    """CacheRefused when ``path`` is missing and the way to the nearest folder of it that exists, or that
    folder itself, would make ``check_dir`` refuse it once made: a refused folder is never created, nothing
    is left behind."""
    path = Path(os.path.abspath(path))
    real, missing = walk(path, what)
    if not missing:
        return
    if not real.is_dir():
        raise CacheRefused(f"{what} {path}: {real} above it is not a folder")
    _check_folder(path, real, what)


def prepare_dir(path: str | os.PathLike[str]) -> None:
    """The cache folder, created 0700 if missing, then checked (CacheRefused, or OSError for one unusable).
    What is above a missing folder is checked before it is made (``check_creatable``)."""
    check_creatable(path)
    make_dirs(path)
    check_dir(path)


def read_key(key_file: str | os.PathLike[str]) -> bytes:
    """The key in ``key_file``; CacheRefused for a file others could read or change, or no key."""
    key_file = os.fspath(key_file)
    try:
        fd = os.open(key_file, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise CacheRefused(f"cache key file {key_file}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheRefused(f"cache key file {key_file} is not a regular file")
        _check_own(key_file, st, "cache key file", "key file", 0o077, "accessible", "chmod 600")
        key = os.read(fd, MAX_KEY_BYTES + 1)
    finally:
        os.close(fd)
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise CacheRefused(f"cache key file {key_file} holds {len(key)} bytes, not {MIN_KEY_BYTES} to "
                           f"{MAX_KEY_BYTES}: make one with: head -c 32 /dev/urandom > {key_file}")
    return key


def _folder_key_file(root: Path) -> Path:
    """``root/.key``, created with a fresh random key if missing (atomically: racing processes agree)."""
    path = root / KEY_NAME
    if path.exists():
        return path
    tmp = root / f".tmp.key.{os.getpid()}.{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        os.write(fd, os.urandom(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # never replaces: the first key made wins, the others read it
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return path


def folder_key(root: str | os.PathLike[str], key_file: str | os.PathLike[str] | None = None) -> bytes:
    """The key of cache folder ``root`` (prepared and checked first): ``key_file``'s, else ``root/.key``'s.
    Read once per process; CacheRefused with one line when the folder or the key must not be trusted."""
    root = Path(os.path.abspath(root))
    name = (str(root), os.fspath(key_file) if key_file else None)
    return runtime().get(KEYS_READ).get(name, lambda: _read_folder_key(root, key_file))


def _read_folder_key(root: Path, key_file: str | os.PathLike[str] | None) -> bytes:
    """``folder_key``'s reading: the folder prepared, its key file made if it has none."""
    try:
        prepare_dir(root)
    except FileNotFoundError:
        raise CacheRefused(f"cache dir {root}: a folder above it was deleted while it was made") from None
    except OSError as exc:
        raise CacheRefused(f"cache dir {root} cannot be made: {exc.strerror or exc}") from None
    if not key_file:
        try:
            key_file = _folder_key_file(root)
        except OSError as exc:
            raise CacheRefused(f"cache dir {root} has no key file and cannot make one ({exc.strerror or exc}): "
                               f"give --cache-key-file FILE, or a writable folder") from None
    return read_key(key_file)
