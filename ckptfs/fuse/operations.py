"""The FUSE callbacks: a thin map from paths to the views of a ``MountTree``.

The class follows the calling convention mfusepy and fusepy share (paths as str, ``OSError(errno)`` for
failures, ``use_ns`` times) and imports neither, so it can be unit-tested without libfuse.

Every callback catches everything. An ``OSError`` we raise on purpose (ENOENT, EROFS, ...) passes through;
a ``CheckpointError`` (stored bytes missing or changed) becomes EIO with one log line naming the file and the
byte range; anything else is a bug: logged (traceback at debug level) and answered with EIO — left
uncaught, the bindings would answer EINVAL, which tools misreport as a bad argument.

The mount is read-only by construction: the kernel sees ``ro`` and answers most writes with EROFS itself;
the write callbacks are still registered so that whatever reaches us gets EROFS, never ENOSYS.
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ckptfs.core.errors import CheckpointError
from ckptfs.core.reads import NOTHING_SAID
from ckptfs.core.runtime import Runtime, runtime as default_runtime
from ckptfs.util.oneline import one_line
from ckptfs.ahead.decode import DecodeAhead
from ckptfs.workers.scheduler import WORKERS
from ckptfs.tree.mount_tree import MountTree
from ckptfs.tree.ownership import MODES_TTL_S, Ownership

if TYPE_CHECKING:  # imported when a folder of several checkpoints is mounted
    from ckptfs.checkpoint.api import Checkpoint
    from ckptfs.tree.repository import RepositoryTree
from ckptfs.engine.views import NpyView, View
from ckptfs.fuse.kernel import tune_connection, use_one_malloc_arena
from ckptfs.fuse.counters import MountCounters, instrument_decoding
from ckptfs.fuse.direct import DirectReads
from ckptfs.util.once import OncePerCause
from ckptfs.fuse.stats import service_stats

log = logging.getLogger(__name__)
_clock = time.perf_counter

STATS_XATTR = "user.ckptfs.stats"
BLOCK_SIZE = 128 * 1024  # st_blksize: the kernel's readahead request size; cp/cat size their buffers by it
FILE_MODE = stat.S_IFREG | 0o444
DIR_MODE = stat.S_IFDIR | 0o555
ENOATTR = getattr(errno, "ENOATTR", errno.ENODATA)  # probe: platform
PRIME_SCAN = 4096  # tensors looked at for storage types to prime the read path with (prime_read_path)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class FsError(OSError):
    """An answer we chose (ENOENT, EROFS, ...), passed to the kernel as is."""

    def __init__(self, code: int):
        super().__init__(code, os.strerror(code))


def _guarded(method: Callable[..., Any], op: str | None = None) -> Callable[..., Any]:
    """Map every failure of a callback to an errno (see the module docstring): each counted per errno, an EIO
    logged once per cause (logs.py); time it under --metrics. ``op``: the FUSE operation's name (default: the
    method's). The answer to a failure is ``CkptOperations.refusal``'s."""
    name = op or method.__name__

    @functools.wraps(method)
    def callback(self: CkptOperations, path: str | None, *args: Any) -> Any:
        timer = self.counters.request_seconds
        start = _clock() if timer is not None else 0.0
        try:
            return method(self, path, *args)
        except Exception as exc:  # noqa: BLE001 - every failure is answered with an errno (refusal)
            raise self.refusal(name, path, args, exc) from None
        finally:
            if timer is not None:
                timer.observe(name, _clock() - start)

    return callback


def _describe_range(name: str, args: tuple[Any, ...]) -> str:
    if name == "read" and len(args) >= 2:
        size, offset = args[0], args[1]
        if not isinstance(size, int):  # read_into: a buffer of the size asked for
            size = len(size)
        return f" bytes {offset}..{offset + size}"
    return ""


def _read_only(method: Callable[..., Any]) -> Callable[..., Any]:
    """A write operation: always EROFS, whatever its arguments."""

    @functools.wraps(method)
    def callback(self: CkptOperations, *args: Any) -> Any:
        self.counters.errors.add((method.__name__, errno.EROFS))
        raise FsError(errno.EROFS)

    return callback


def prime_read_path(tree: MountTree | RepositoryTree) -> None:
    """Run the read path once per storage type before the first request (from ``init``, before the mount is
    ready): the ``.npy`` view of the first tensor of each type is made and its first block decoded into a
    scratch array (``TensorData.prime``: past the cache, no lookup counted). A fresh daemon's first read
    otherwise pays for the first calls of its codec, the block engine and numpy's paths, which cost more
    than the read itself. One block per type whatever the checkpoint's
    size; never raises (a tensor that cannot be read now will say so when it is read). Not for remote
    checkpoints (those with a read scope): the mount must not wait for a server before it is ready."""
    if tree.read_scope is not None:
        return

    def prime(ck: Checkpoint) -> None:
        seen: set[str] = set()
        for index in range(min(len(ck.tensors), PRIME_SCAN)):  # not every Tensor of 94,000: a bounded look
            storage_type = ck.tensors.info(index).storage_type
            if storage_type in seen:
                continue
            seen.add(storage_type)
            tensor = ck.tensors[index]
            try:
                if tensor.decodable:
                    NpyView(tensor.data)
                    tensor.data.prime()
            except Exception:  # priming is an optimization
                log.debug("priming the read path with %s failed", tensor.name, exc_info=True)

    try:
        tree.each_checkpoint(prime)
    except Exception:
        log.debug("priming the read path failed", exc_info=True)


class CkptOperations:
    """Serves one ``MountTree`` (or a ``RepositoryTree``: the same interface over several checkpoints);
    ``on_ready`` is called once libfuse has mounted (its ``init``)."""

    use_ns = True  # times as integer nanoseconds (both bindings)

    def __init__(self, tree: MountTree | RepositoryTree, on_ready: Callable[[], None] | None = None,
                 describe: dict[str, Any] | None = None, counters: MountCounters | None = None,
                 runtime: Runtime | None = None):
        self.tree = tree
        self.runtime = runtime if runtime is not None else default_runtime()  # the state its stats report
        self.counters = counters if counters is not None else MountCounters()
        self._causes = OncePerCause()
        self._kinds: dict[str | None, str] = {}
        tree.each_checkpoint(lambda ck: instrument_decoding(ck, self.counters.decode))
        self._on_ready = on_ready
        self._describe = dict(describe or {})
        self._uid, self._gid = os.getuid(), os.getgid()
        # remote checkpoints: one --timeout for a whole FUSE read, however many source reads it takes
        self._read_scope = tree.read_scope
        mtime_ns = tree.mtime_ns
        self._times = {"st_atime": mtime_ns, "st_mtime": mtime_ns, "st_ctime": mtime_ns}
        #: per path, files and folders: (when taken, attributes); owner and mode come from what each is made of
        #: as it is now, so they are taken again once older than MODES_TTL_S (tree.ownership)
        self._file_attrs: dict[str | None, tuple[float, dict[str, int]]] = {}
        self._handles: dict[int, View] = {}
        #: handles opened with O_DIRECT: what they read the kernel's page cache does not hold (see read_into)
        self._uncached: set[int] = set()
        use_one_malloc_arena()  # a memory bound, not a speed-up to switch off (fuse/kernel.py)
        self._decode_ahead = DecodeAhead.from_env(tree.sources, tree.cache.capacity, self.runtime.get(WORKERS))
        self._next_handle = itertools.count(1)
        self._stored_bytes = tree.stored_bytes()
        #: plain ranges of local files, read in C without the GIL once the binding installed it (fuse/direct.py)
        self.direct_reads = DirectReads()

    # -- lookups -----------------------------------------------------------------------------------

    def _attrs(self, mode: int, size: int, nlink: int = 1, owner: Ownership | None = None) -> dict[str, int]:
        """``mode``: the file type and the permission bits used when ``owner`` is None (the mounting user's)."""
        uid, gid = (self._uid, self._gid) if owner is None else (owner.uid, owner.gid)
        if owner is not None:
            mode = stat.S_IFMT(mode) | owner.perm
        return {"st_mode": mode, "st_nlink": nlink, "st_size": size, "st_uid": uid, "st_gid": gid,
                "st_blksize": BLOCK_SIZE, "st_blocks": -(-size // 512), **self._times}

    def _view(self, path: str | None) -> View:
        """The view of the file ``/<path>``; only the tree's own paths resolve (nothing outside the tree)."""
        if not path or path[0] != "/":
            raise FsError(errno.ENOENT)
        view = self.tree.view(path[1:])
        if view is None:
            raise FsError(errno.EISDIR if self.tree.is_dir(path[1:]) else errno.ENOENT)
        return view

    def _check_exists(self, path: str | None) -> None:
        """ENOENT unless ``path`` is a file or a folder of the tree (xattr calls: a folder has none, no EISDIR)."""
        if path != "/" and not (path and path[0] == "/" and self.tree.is_dir(path[1:])):
            self._view(path)

    # -- the read-only callbacks --------------------------------------------------------------------

    def init(self, path: str) -> None:
        # Never raises: the bindings pass an exception from init to libfuse, which cannot report it.
        try:
            if self._on_ready is not None:
                self._on_ready()
        except Exception:
            log.exception("reporting readiness failed")

    def init_with_config(self, conn: Any, config: Any) -> None:
        """mfusepy's ``init`` with the connection info: read-ahead raises the mount's kernel readahead."""
        tune_connection(conn, self._describe.get("mountpoint"))
        prime_read_path(self.tree)
        self.init("/")

    def destroy(self, path: str | None) -> None:
        """Unmount: stop read-ahead, then close the cache tiers and the sources (never raises: libfuse is
        tearing the session down and cannot report an error)."""
        try:
            self._decode_ahead.close(wait=False)
            self.tree.close()
        except Exception:
            log.exception("closing the checkpoint at unmount failed")

    @_guarded
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, int]:
        taken = self._file_attrs.get(path)
        now = time.monotonic()
        if taken is not None and now - taken[0] < MODES_TTL_S:
            return taken[1]
        if path is None:  # a handle's attributes: libfuse passes the path unless told otherwise
            raise FsError(errno.ENOENT)
        if path == "/" or (path and path[0] == "/" and self.tree.is_dir(path[1:])):
            attrs = self._attrs(DIR_MODE, 0, nlink=2, owner=self.tree.owner(path[1:]))
        else:
            # The size is exact from the first lookup: mmap and the page cache trust it.
            size = self._view(path).size
            attrs = self._attrs(FILE_MODE, size, owner=self.tree.owner(path[1:]))
        self._file_attrs[path] = (now, attrs)
        return attrs

    @_guarded
    def readdir(self, path: str | None, fh: int = 0) -> list[str]:
        # Not kept here: the mfusepy binding keeps each folder's listing once, encoded (fuse/binding.py).
        names = self.tree.listdir(path[1:]) if path and path[0] == "/" else None
        if names is None:
            raise FsError(errno.ENOTDIR if path and self.tree.kind(path[1:]) else errno.ENOENT)
        return [".", "..", *names]

    @_guarded
    def listing_blob(self, path: str | None) -> bytes:
        """The folder's names as one NUL-separated bytes object (with ``.`` and ``..``), built name by name: the
        mfusepy binding hands it to libfuse in one C loop and keeps it, so a folder of 282,000 names costs one
        bytes object instead of a list of strings and a list of their encodings (fuse/binding.py)."""
        if not path or path[0] != "/" or not self.tree.is_dir(path[1:]):
            raise FsError(errno.ENOTDIR if path and self.tree.kind(path[1:]) else errno.ENOENT)
        blob = bytearray(b".\0..\0")
        for name in self.tree.iter_listdir(path[1:]):
            blob += name.encode("utf-8", "surrogateescape")
            blob += b"\0"
        return bytes(blob)

    @_guarded
    def open(self, path: str | None, flags: int) -> int:
        if flags & _WRITE_FLAGS:
            raise FsError(errno.EROFS)
        view = self._view(path)
        handle = next(self._next_handle)
        self._handles[handle] = view
        if flags & getattr(os, "O_DIRECT", 0):  # probe: platform
            self._uncached.add(handle)
        self._decode_ahead.opened(handle, view)
        if self.direct_reads.active:
            self.direct_reads.register(handle, view, self._kind(path))
        return handle

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        """``read_into`` a buffer of its own, for a caller that wants the bytes (the mfusepy binding hands
        libfuse's buffer to ``read_into`` itself: fuse/binding.py)."""
        buf = bytearray(size)
        served = self.read_into(path, memoryview(buf), offset, fh)
        return bytes(memoryview(buf)[:served])

    def read_into(self, path: str | None, target: memoryview, offset: int, fh: int) -> int:
        """The FUSE ``read``: ``len(target)`` bytes at ``offset`` written into ``target`` (``View.read_into``;
        the mfusepy binding passes libfuse's own buffer, so the bytes are copied there once, not joined into
        bytes that mfusepy copies again); the number written. Guarded as every callback (``_guarded``, under
        the name "read"), with the guard written out here: a read's walk down to its source is a frame
        shorter."""
        timer = self.counters.request_seconds
        start = _clock() if timer is not None else 0.0
        try:
            size = len(target)
            view = self._handles.get(fh)
            if view is None:
                view = self._view(path)
            streaming = self._decode_ahead.on_read(fh, offset, size)
            # What a read decodes into its reply is kept in the block cache only for a reader the kernel's page
            # cache does not serve (O_DIRECT): the mount is kernel_cache, so everything else it serves stays in
            # the page cache, and a copy here would be the same bytes twice in memory and one more copy per
            # request (a sizeable part of an mmap fault's read-around). A sequential stream keeps nothing
            # either way: it will not come back.
            keep = fh in self._uncached and not streaming
            # remote checkpoints: the read's deadline, and whether the handle decides its stream's read-ahead
            # (not the remote source below); local sources have no use for either
            scope = NOTHING_SAID if self._read_scope is None else self._decode_ahead.scope(fh, self._read_scope())
            served = view.read_into(offset, target, keep, scope=scope)
            if served != size and served != max(0, min(size, view.size - offset)):
                self._short_reply(path, view, offset, size, served)
            if self.counters.timed:
                self.counters.read_bytes.add(self._kind(path), served)
            return served
        except Exception as exc:  # noqa: BLE001 - every failure is answered with an errno (refusal)
            raise self.refusal("read", path, (target, offset, fh), exc) from None
        finally:
            if timer is not None:
                timer.observe("read", _clock() - start)

    def refusal(self, name: str, path: str | None, args: tuple[Any, ...], exc: Exception) -> FsError:
        """The answer to the FUSE operation ``name``'s failure ``exc`` (see the module docstring): an FsError
        as it is, any other failure EIO (a bug must not become EINVAL or kill the daemon); each counted per
        errno, an EIO logged once per cause (logs.py), on one line whatever the names hold (a tensor or file
        name may contain a newline)."""
        if isinstance(exc, FsError):
            self.counters.errors.add((name, exc.errno))
            return exc
        self.counters.errors.add((name, errno.EIO))
        if isinstance(exc, CheckpointError):
            if self._causes.first((path, str(exc))):
                log.error("EIO: %s%s: %s", one_line(path), _describe_range(name, args), one_line(exc),
                          extra={"op": name, "path": path, "errno": "EIO"})
        elif self._causes.first((name, path, type(exc).__name__, str(exc))):
            log.debug("unexpected failure in %s(%r, %r)", name, path, args, exc_info=exc)
            log.error("EIO: %s(%s): unexpected %s: %s", name, one_line(path), type(exc).__name__,
                      one_line(exc), extra={"op": name, "path": path, "errno": "EIO"})
        return FsError(errno.EIO)

    def _short_reply(self, path: str | None, view: View, offset: int, size: int, served: int) -> None:
        """A reply with fewer bytes than asked before the end of the file is never sent: the kernel would
        take it for the end of the file and shrink the file's size (mmap and later reads would then see a
        shorter file). Counted (``short_replies`` in the stats: a bug if ever non-zero) and answered EIO."""
        self.counters.short_replies.add("python")
        raise CheckpointError(path, offset, f"short reply refused: {served} bytes of {size} asked, the file "
                                            f"holds {view.size} bytes")

    def _kind(self, path: str | None) -> str:
        """The file kind of ``path`` (``ckptfs_read_bytes_total{kind}``), remembered per path."""
        kind = self._kinds.get(path)
        if kind is None:
            kind = self._kinds[path] = (path and self.tree.kind(path[1:])) or "file"
        return kind

    @_guarded
    def release(self, path: str | None, fh: int) -> int:
        self.direct_reads.unregister(fh)
        self._handles.pop(fh, None)
        self._uncached.discard(fh)
        self._decode_ahead.released(fh)
        return 0

    @_guarded
    def statfs(self, path: str | None) -> dict[str, int]:
        return {"f_bsize": BLOCK_SIZE, "f_frsize": 4096, "f_blocks": -(-self._stored_bytes // 4096),
                "f_bfree": 0, "f_bavail": 0, "f_files": len(self.tree) + 1, "f_ffree": 0, "f_favail": 0,
                "f_namemax": 255}

    @_guarded
    def getxattr(self, path: str | None, name: str, position: int = 0) -> bytes:
        if path == "/" and name == STATS_XATTR:
            return json.dumps(self.stats()).encode()
        self._check_exists(path)
        raise FsError(ENOATTR)

    @_guarded
    def listxattr(self, path: str | None) -> list[str]:
        if path == "/":
            return [STATS_XATTR]
        self._check_exists(path)
        return []

    def describe(self, key: str, value: Any) -> None:
        """Add a fact about the mount to the stats (the exporter's address once it listens), or a function
        that gives it when the stats are read (a background warm-up's progress)."""
        self._describe[key] = value

    def stats(self) -> dict[str, Any]:
        """What ``user.ckptfs.stats`` on the root holds: the tree's counters, the daemon's pid, the binding, and
        ``short_replies`` (replies that would have ended before the end of the file, Python's and C's: 0)."""
        return {**self.tree.stats(), **service_stats(self.tree, self.counters.decode.total_bytes(), self.runtime),
                "pid": os.getpid(), "open_handles": len(self._handles), "c_reads": self.direct_reads.snapshot(),
                "short_replies": self.counters.short_replies.total() + self.direct_reads.short_replies(),
                **{key: value() if callable(value) else value for key, value in self._describe.items()}}

    def read_bytes_by_kind(self) -> dict[str, int]:
        """Bytes returned to readers per file kind, by Python and by the C read path together."""
        by_kind = self.counters.read_bytes.snapshot()
        for kind, served in self.direct_reads.snapshot()["by_kind"].items():
            by_kind[kind] = by_kind.get(kind, 0) + served["bytes"]
        return by_kind

    # -- every write operation: EROFS ---------------------------------------------------------------

    @_read_only
    def write(self, path: str, data: bytes, offset: int, fh: int) -> None: ...

    @_read_only
    def create(self, path: str, mode: int, flags: int = 0) -> None: ...

    @_read_only
    def mkdir(self, path: str, mode: int) -> None: ...

    @_read_only
    def mknod(self, path: str, mode: int, dev: int) -> None: ...

    @_read_only
    def rmdir(self, path: str) -> None: ...

    @_read_only
    def unlink(self, path: str) -> None: ...

    @_read_only
    def rename(self, old: str, new: str) -> None: ...

    @_read_only
    def link(self, target: str, source: str) -> None: ...

    @_read_only
    def symlink(self, target: str, source: str) -> None: ...

    @_read_only
    def chmod(self, path: str, mode: int) -> None: ...

    @_read_only
    def chown(self, path: str, uid: int, gid: int) -> None: ...

    @_read_only
    def truncate(self, path: str, length: int, fh: int | None = None) -> None: ...

    @_read_only
    def utimens(self, path: str, times: tuple[float, float] | None = None) -> None: ...

    @_read_only
    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> None: ...

    @_read_only
    def removexattr(self, path: str, name: str) -> None: ...
