"""A persistent cache folder shared by every ckptfs process on a machine (``--cache-dir DIR``).

``DiskStore(root, max_bytes, namespace)`` keeps entries under ``DIR/<namespace>/``: decoded block groups in
``blocks`` (``DiskTier``), fetched remote bytes in ``bytes``, whole decoded tensors for worker processes in
``tensors`` (``shared.py``). One bound, ``--cache-dir-size``, covers the whole folder.

Why it is built this way:

- **No index.** Processes come and go (mounts, DataLoader workers, ``ckptfs prefetch``) and any of them may
  be killed, so there is no shared index to corrupt or to lock on every read. An entry is a file named by
  the blake2b of its key, ``DIR/<namespace>/<2 hex>/<32 hex>.e``; its size and mtime are all the state.
- **Crash-safe writes.** An entry is written to a ``.tmp.*`` file in the same folder and renamed into place
  once complete, so a killed writer leaves only a temporary file (never read, removed by the next prune)
  and concurrent writers of one key each rename a complete entry. There is no fsync: after a power loss a
  renamed entry may come back short or zeroed, and the header and payload checksums (``entry.py``) reject
  it like any other corrupt entry, which is then decoded again.
- **Approximate LRU across processes.** A hit touches the entry's mtime (at most once a minute). Each
  process sums the folder after its first write and again after every ``max_bytes / 64`` it writes; when
  the sum is over the bound, the process holding ``DIR/.lock`` (``flock``; the others skip) deletes the
  least recently used entries down to 90 % of the bound. The folder may exceed the bound by what the
  writing processes wrote between two checks. The prune runs on a thread of its own, except in a process
  about to fork (``PruneHold``: ``ckptfs mount`` before its daemon), which starts it after the fork.
  This schedule, the pauses and the lock are the folder's (``folder.py``), shared with the fetched bytes' store.
- **Only this user's entries.** The folder is checked and its key read when the store is made
  (``auth.py``: owned by this user, not writable by others, else refused with one line); every entry
  carries a MAC under that key, and one that fails it counts as ``forged`` (deleted, a miss). Folders
  are created 0700, entries and locks 0600, whatever the umask.
- **Never a failed read.** A corrupt entry is deleted and counts as a miss; a full file system (ENOSPC), a
  read-only or deleted folder pause writing for a while (a deleted folder is created again); each kind of
  trouble is logged once per process. The caller then decodes, as without the tier.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any


from ckptfs.cache import auth, entry
from ckptfs.cache.folder import FolderBound, folder_lock, open_private, scandir, unlink
from ckptfs.cache.writer import BackgroundWriter

if TYPE_CHECKING:  # (imported where values are decoded: a remote fetch into the store does not need numpy)
    import numpy as np

log = logging.getLogger(__name__)

NAMESPACES = ("blocks", "bytes", "tensors")
DEFAULT_CACHE_DIR_SIZE = 10 << 30  # --cache-dir-size
TOUCH_AFTER_S = 60.0          # a hit refreshes the mtime (the LRU clock) when it is older than this
STALE_TMP_S = 3600.0          # a temporary file this old belongs to a killed writer
LOW_WATER = 0.9               # a prune deletes down to this fraction of the bound
DISK_WRITE_WAIT_S = 10.0      # a reader waits this long for room in a full write queue (then drops)
_SUFFIX = ".e"


class DiskStore(FolderBound):
    """Authenticated entries in ``root/namespace``; safe to share between threads and processes.

    ``key_file``: the key's file (``--cache-key-file``), else the folder's own ``root/.key``. The folder is
    created and checked here: ``auth.CacheRefused`` (one line) for one this user must not trust, OSError
    for one that cannot be made."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int, namespace: str = "blocks",
                 key_file: str | os.PathLike[str] | None = None) -> None:
        if "/" in namespace or namespace.startswith("."):
            raise ValueError(f"bad cache namespace {namespace!r}")
        self._mac_key = auth.folder_key(root, key_file)
        super().__init__(root, max_bytes, ("hits", "misses", "hit_bytes", "stored", "stored_bytes", "corrupt",
                                           "forged", "errors"), log)
        self.key_file = os.fspath(key_file) if key_file else None
        self.namespace = namespace
        self.dir = self.root / namespace
        self._dir = os.fspath(self.dir) + os.sep  # str paths on the hot path: pathlib costs more than the syscalls

    # -- names ---------------------------------------------------------------------------------------

    def path_for(self, key: str) -> Path:
        return Path(self._entry_path(key))

    def _entry_path(self, key: str) -> str:
        digest = entry.key_digest(key).hex()
        return f"{self._dir}{digest[:2]}{os.sep}{digest}{_SUFFIX}"

    # -- reads ---------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The bytes stored for ``key`` (as ``put`` got them), or None."""
        values = self.get_array(key)
        return None if values is None else values.tobytes()

    def get_array(self, key: str) -> np.ndarray | None:
        """The read-only array stored for ``key``, read into memory, or None (missing or bad: a miss)."""
        return self._load(key, mapped=False)

    def map_array(self, key: str) -> np.ndarray | None:
        """Like ``get_array``, but a read-only view of the entry file mapped into memory: every process that
        maps one entry shares the same page-cache pages (``shared.py``)."""
        return self._load(key, mapped=True)

    def contains(self, key: str) -> bool:
        # access(2) answers without raising for a missing file: half of os.path.exists's cost, and a warm-up
        # asks for every chunk of a checkpoint
        return os.access(self._entry_path(key), os.F_OK)

    def _load(self, key: str, mapped: bool) -> np.ndarray | None:
        path = self._entry_path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._count(misses=1)
            return None
        except OSError as exc:
            self._trouble("read", exc)
            self._count(misses=1)
            return None
        try:
            st = os.fstat(fd)
            data: bytes | mmap.mmap
            if mapped:
                data = _map(fd, st.st_size)
            else:
                data = _pread_all(fd, st.st_size)
            values = entry.decode(key, data, mac_key=self._mac_key)
            if time.time() - st.st_mtime > TOUCH_AFTER_S:
                with contextlib.suppress(OSError):
                    os.utime(fd)
        except entry.ForgedEntry as exc:
            self._drop(path, exc, "forged")
            self._count(misses=1, forged=1)
            return None
        except entry.BadEntry as exc:
            self._drop(path, exc)
            self._count(misses=1, corrupt=1)
            return None
        except OSError as exc:
            self._trouble("read", exc)
            self._count(misses=1)
            return None
        finally:
            os.close(fd)
        self._count(hits=1, hit_bytes=values.nbytes)
        return values

    def _drop(self, path: str, why: Exception, kind: str = "corrupt") -> None:
        self._warn_once(kind, "cache dir %s: %s entry %s (%s): deleted, decoding instead "
                        "(further %s entries are counted, not logged)", self.root, kind, os.path.basename(path),
                        why, kind)
        with contextlib.suppress(OSError):
            os.unlink(path)

    # -- writes --------------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` for ``key``; never raises for a full, read-only or deleted folder."""
        import numpy as np

        self.put_array(key, np.frombuffer(data, np.uint8))

    def put_array(self, key: str, values: np.ndarray) -> None:
        header, payload = entry.encode(key, values.reshape(-1), self._mac_key)
        self.write_chunks(key, values.dtype, payload.nbytes, [payload], header=header)

    def put_parts(self, key: str, parts: list[bytes]) -> bool:
        """Store the bytes ``parts`` (at hand: a run of fetched chunks) one after the other as the entry of
        ``key``, in one write, without joining them. True when the entry is in place."""
        header = entry.header_for(key, "|u1", parts, self._mac_key)
        return self.write_chunks(key, "|u1", sum(len(part) for part in parts), parts, header=header)

    def write_chunks(self, key: str, dtype: np.dtype | str, nbytes: int, chunks: Iterable[Any],
                     header: bytes | None = None) -> bool:
        """Write an entry of ``nbytes`` payload bytes from ``chunks`` (buffers, produced lazily: a whole
        tensor is decoded step by step, never held twice). True when the entry is in place."""
        if time.monotonic() < self._paused_until:
            return False
        path = self._entry_path(key)
        folder, _, name = path.rpartition(os.sep)
        tmp = f"{folder}{os.sep}.tmp.{os.getpid()}.{threading.get_ident()}.{name}"
        renamed = False
        try:
            fd = self._create(tmp)
        except OSError as exc:
            self._trouble("write", exc)
            return False
        try:
            if header is not None:  # the payload is at hand (the header holds its checksums): one pwritev
                views = [memoryview(chunk).cast("B") for chunk in chunks]
                written = sum(view.nbytes for view in views)
                _write_all(fd, [header, *views])
            else:  # checksummed as it is produced, the header written last
                crc, written = 0, 0
                mac = entry.new_mac(self._mac_key, key, dtype, nbytes)
                _write_at(fd, bytes(entry.HEADER_SIZE), 0)
                for chunk in chunks:
                    view = memoryview(chunk).cast("B")
                    crc = entry.payload_crc(view, crc)
                    mac.update(view)
                    _write_at(fd, view, entry.HEADER_SIZE + written)
                    written += view.nbytes
            if written != nbytes:
                raise ValueError(f"entry for {key!r}: {written} bytes written, {nbytes} announced")
            if header is None:
                _write_at(fd, entry.make_header(key, dtype, nbytes, crc & 0xFFFFFFFF, mac), 0)
            os.close(fd)
            fd = -1
            os.replace(tmp, path)
            renamed = True
        except OSError as exc:
            self._trouble("write", exc)
            return False
        finally:
            if fd >= 0:
                os.close(fd)
            if not renamed:  # anything but a completed rename leaves no temporary file behind
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        self._count(stored=1, stored_bytes=nbytes)
        self._after_write(entry.HEADER_SIZE + nbytes)
        return True

    def _create(self, tmp: str) -> int:
        return open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC)

    @contextlib.contextmanager
    def key_lock(self, key: str) -> Iterator[None]:
        """An exclusive lock on ``key`` across processes (``flock``, released if the holder dies): one
        process fills an expensive entry while the others wait for it. Unlocked if the folder is unusable."""
        path = self.path_for(key).with_suffix(".lock")
        try:
            fd = open_private(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        except OSError as exc:
            self._trouble("lock", exc)
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- the size bound ------------------------------------------------------------------------------

    def _prune_due(self) -> None:
        self.prune(wait=False)

    def prune(self, max_bytes: int | None = None, wait: bool = True) -> dict[str, int]:
        """Delete least-recently-used entries (every namespace) until the folder is at most 90 % of the bound
        when it is over it, and temporary files of killed writers. ``wait=False`` gives up at once when
        another process is pruning. Returns {"files", "bytes"} removed and "total" left."""
        bound = self.max_bytes if max_bytes is None else int(max_bytes)
        removed = {"files": 0, "bytes": 0, "total": 0}
        with folder_lock(self.root, wait) as locked:
            if not locked:
                return removed
            now = time.time()
            entries = []
            for _, item, st in _walk(self.root):
                if item.name.startswith(".tmp."):
                    if now - st.st_mtime > STALE_TMP_S and unlink(item.path):
                        removed["files"] += 1
                        removed["bytes"] += st.st_size
                    continue
                if item.name.endswith(_SUFFIX):
                    entries.append((st.st_mtime, st.st_size, item.path))
            total = sum(size for _, size, _ in entries)
            if total > bound:
                entries.sort()
                for _, size, path in entries:
                    if total <= bound * LOW_WATER:
                        break
                    if unlink(path):
                        total -= size
                        removed["files"] += 1
                        removed["bytes"] += size
            removed["total"] = total
        with self._lock:
            self._folder_bytes = total
        return removed

    def clear(self) -> dict[str, int]:
        """Delete every entry of every namespace (for ``ckptfs cache clear``)."""
        return self.prune(max_bytes=0, wait=True) | {"total": 0}

    def usage(self) -> dict[str, dict[str, int]]:
        """{namespace: {"files", "bytes"}} of the whole folder, by one scan."""
        found: dict[str, dict[str, int]] = {}
        for namespace, item, st in _walk(self.root):
            if item.name.endswith(_SUFFIX) and not item.name.startswith("."):
                ns = found.setdefault(namespace, {"files": 0, "bytes": 0})
                ns["files"] += 1
                ns["bytes"] += st.st_size
        return found


def _walk(root: Path) -> Iterator[tuple[str, os.DirEntry[str], os.stat_result]]:
    """(namespace, entry, stat) of every file two levels under each namespace folder; vanishing files are
    skipped. No ``Path`` per file: a prune walks every entry of the folder (tens of thousands), during a
    warm-up every ``max_bytes / 64`` written."""
    for ns in scandir(root):
        if not ns.is_dir(follow_symlinks=False) or ns.name.startswith("."):
            continue
        for sub in scandir(ns.path):
            if not sub.is_dir(follow_symlinks=False):
                continue
            for item in scandir(sub.path):
                try:
                    st = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                yield ns.name, item, st


def _pread_all(fd: int, size: int) -> bytes:
    data = os.pread(fd, size, 0)
    if len(data) == size:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _map(fd: int, size: int) -> mmap.mmap:
    if size < entry.HEADER_SIZE:
        raise entry.BadEntry(f"short file ({size} bytes)")
    return mmap.mmap(fd, size, prot=mmap.PROT_READ)


def _write_all(fd: int, buffers: list[Any]) -> None:
    """``buffers`` one after the other from offset 0, in one ``pwritev`` (the rest, if it wrote short, by
    ``_write_at``)."""
    views = [memoryview(b).cast("B") for b in buffers]
    done = os.pwritev(fd, views, 0)
    at = 0
    for view in views:
        if done < at + view.nbytes:
            _write_at(fd, view[max(0, done - at):], max(done, at))
        at += view.nbytes


def _write_at(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class DiskTier:
    """The ``disk`` cache tier: decoded block groups in a ``DiskStore`` under namespace ``blocks``, written
    by a background thread (``writer.py``) so that a read never waits for the disk after decoding."""

    name = "disk"

    def __init__(self, root: str | os.PathLike[str], max_bytes: int, background: bool = True,
                 key_file: str | os.PathLike[str] | None = None) -> None:
        self.store = DiskStore(root, max_bytes, "blocks", key_file)
        self._writer = BackgroundWriter(self.store.put_array, "disk", max_wait=DISK_WRITE_WAIT_S) if background else None

    def get(self, key: str) -> np.ndarray | None:
        if self._writer is not None:
            queued = self._writer.lookup(key)
            if queued is not None:
                self.store._count(hits=1, hit_bytes=queued.nbytes)
                return queued
        return self.store.get_array(key)

    def put(self, key: str, value: np.ndarray) -> None:
        if self._writer is None:
            self.store.put_array(key, value)
        else:
            self._writer.submit(key, value)

    def contains(self, key: str) -> bool:
        return (self._writer is not None and self._writer.lookup(key) is not None) or self.store.contains(key)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the queued writes (True when all are done)."""
        return True if self._writer is None else self._writer.flush(timeout)

    def stats(self) -> dict[str, Any]:
        extra = {} if self._writer is None else {"pending": self._writer.pending, "dropped": self._writer.dropped}
        return {**self.store.stats(), **extra}

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
