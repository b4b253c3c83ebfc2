"""Read-ahead for a mount's sequential readers: decode ahead in the background, tell the kernel what comes next.

A reader that streams a ``.npy`` (``cat``, ``np.load``, ``cp``) asks for one readahead-sized request after
another, and each one, on a cache miss, waits for ``pread`` + decode of its block groups before the copy.
The :class:`Prefetcher` watches each open file handle: once a read starts where the previous one ended, it
decodes the next groups into the shared block cache on a small worker pool (the C kernels release the GIL,
so on two cores the decode overlaps the FUSE thread's copying), and advises the kernel about the stored
bytes those groups will read (``POSIX_FADV_WILLNEED``; ``SEQUENTIAL`` once per stream), so the worker's
``pread`` finds them in the page cache. A read that jumps elsewhere ends the stream: queued work for it is
skipped. Read-ahead never holds more than a fraction of the cache: at most 1/8 of it ahead of one stream
and 1/4 in flight over all streams, so it cannot evict what readers are using.

Two daemon-wide settings belong to the same concern:

- the mount's kernel readahead. Page-cache reads of a FUSE file arrive as requests of the backing device's
  ``read_ahead_kb`` (128 KiB by default) however large the reader's ``read`` is, and every request costs a
  FUSE round trip through Python. Raising it to 1 MiB for this mount's own device (``/sys/class/bdi/<dev>``,
  root only; it disappears with the mount) makes a stream 8x fewer requests. Small random reads are not
  affected (the kernel reads those as they are); an mmap fault reads around it by that much.
- one malloc arena. Decoded groups are allocated by whichever thread decodes them (a FUSE thread or a
  worker) and freed by whichever evicts them; with glibc's arena per thread, memory freed into another
  thread's arena is kept there, and the daemon's anonymous memory grows well past ``--cache-size``.

``CKPTFS_PREFETCH=0`` turns the read-ahead off (for measuring its gain; the arena setting stays),
``CKPTFS_PREFETCH=kernel`` keeps only the kernel's part (readahead and advice, no background decoding: no
worker thread, no decoded data ahead in memory); ``CKPTFS_READAHEAD_KB`` sets the mount's readahead (0
leaves the kernel's). Knows nothing of FUSE: it sees file handles, views and byte ranges.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .blocks import TensorData
from .sources import SourcePool
from .views import NpyView, RawView, View

log = logging.getLogger(__name__)

PREFETCH_ENV = "CKPTFS_PREFETCH"
READAHEAD_ENV = "CKPTFS_READAHEAD_KB"
DEFAULT_READAHEAD_KB = 1024
MAX_AHEAD_BYTES = 8 << 20
STREAM_SHARE = 8  # ahead of one stream: at most capacity / 8
TOTAL_SHARE = 4  # in flight over all streams: at most capacity / 4
WORKERS = 1
M_ARENA_MAX = -8  # glibc's mallopt parameter number


def enabled_from_env() -> bool:
    return os.environ.get(PREFETCH_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def decode_ahead_from_env() -> bool:
    return enabled_from_env() and os.environ.get(PREFETCH_ENV, "").strip().lower() != "kernel"


@dataclass
class _Stream:
    """What one open file handle has read, and how far ahead of it work is scheduled."""

    view: View
    end: int = -1
    run: int = 0
    ahead_until: int = 0
    generation: int = 0
    advised: bool = False
    closed: bool = False


class Prefetcher:
    """Per-handle sequential detection and bounded background decoding (see the module docstring)."""

    def __init__(self, sources: SourcePool, cache_capacity: int, enabled: bool = True, workers: int = WORKERS,
                 decode_ahead: bool = True):
        self.enabled = enabled
        self.decode_ahead = decode_ahead and cache_capacity > 0
        self._sources = sources
        # decoded data ahead must fit the cache; advice alone costs no memory of ours
        self._ahead = min(MAX_AHEAD_BYTES, cache_capacity // STREAM_SHARE) if self.decode_ahead else MAX_AHEAD_BYTES
        self._budget = cache_capacity // TOTAL_SHARE
        self._in_flight = 0
        self._streams: dict[int, _Stream] = {}
        self._lock = threading.Lock()
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None  # started on first use: never before a fork

    @classmethod
    def for_daemon(cls, sources: SourcePool, cache_capacity: int) -> Prefetcher:
        """The mount daemon's prefetcher, configured from the environment; also limits malloc to one arena
        (always: that is a memory bound, not a speed-up to switch off)."""
        use_one_malloc_arena()
        return cls(sources, cache_capacity, enabled_from_env(), decode_ahead=decode_ahead_from_env())

    # -- the hooks the FUSE operations call ------------------------------------------------------------

    def tune_connection(self, conn: object | None, mountpoint: str | None) -> None:
        """Raise this mount's kernel readahead; called from ``init`` (libfuse's, before its reply to the
        kernel's INIT). The kernel keeps the smaller of the device's ``read_ahead_kb`` and the
        ``max_readahead`` of the reply, so both are raised here: the device's now, the reply's through the
        connection info (``conn``, from mfusepy's ``init_with_config``; None leaves the kernel default).
        Never raises: nothing may keep the mount from reporting ready."""
        kib = _readahead_from_env()
        if not self.enabled or not kib or conn is None or not mountpoint:
            return
        try:
            if not set_mount_readahead(mountpoint, kib):
                log.debug("kernel readahead of %s left as it is (not root, or no sysfs)", mountpoint)
                return
            conn.max_readahead = max(int(conn.max_readahead), kib * 1024)
        except Exception:  # noqa: BLE001
            log.debug("raising the readahead of %s failed", mountpoint, exc_info=True)

    def opened(self, fh: int, view: View) -> None:
        if self.enabled and isinstance(view, (NpyView, RawView)):
            with self._lock:
                self._streams[fh] = _Stream(view)

    def released(self, fh: int) -> None:
        with self._lock:
            stream = self._streams.pop(fh, None)
            if stream is not None:
                stream.closed = True

    def on_read(self, fh: int, offset: int, size: int) -> None:
        """Note a read about to be served; schedule what a sequential reader will ask for next."""
        stream = self._streams.get(fh)
        if stream is None:
            return
        with self._lock:
            slack = 4 * max(size, 128 << 10)  # concurrent readahead requests may arrive slightly out of order
            if stream.end >= 0 and -slack <= offset - stream.end <= slack:
                stream.run += 1
                stream.end = max(stream.end, offset + size)
            else:
                if stream.run:
                    stream.generation += 1  # the access turned random: skip what is queued for it
                stream.run, stream.end, stream.ahead_until = 0, offset + size, 0
                return
            start = max(stream.end, stream.ahead_until)
            stop = min(stream.view.size, stream.end + self._ahead)
            if stop <= start or start - stream.end > self._ahead // 2:
                return  # at end of file, or more than half a window is already ahead
            first = not stream.advised
            stream.advised = True
            generation = stream.generation
        try:
            self._schedule(stream, start, stop, generation, first)
        except Exception:  # noqa: BLE001 - read-ahead is an optimization; the read itself reports errors
            log.debug("read-ahead of %d..%d failed", start, stop, exc_info=True)

    # -- scheduling ---------------------------------------------------------------------------------------

    def _schedule(self, stream: _Stream, start: int, stop: int, generation: int, first: bool) -> None:
        view = stream.view
        if isinstance(view, RawView):
            self._advise(view.info.source, view.info.offset + start, stop - start, first)
            stream.ahead_until = stop
            return
        data: TensorData = view.data
        hlen, item = len(view.header), view.itemsize
        e0 = max(0, start - hlen) // item
        e1 = min(data.n_elements, -(-max(0, stop - hlen) // item))
        if e1 <= e0:
            stream.ahead_until = stop
            return
        offset, nbytes = data.stored_range(e0, e1)
        self._advise(data.info.source, offset, nbytes, first)
        if data.direct or not self.decode_ahead:
            stream.ahead_until = stop
            return
        group_elements = data.group_blocks * data.info.block_elements
        group_bytes = group_elements * item
        for g in range(data.group_of_element(e0), data.group_of_element(e1 - 1) + 1):
            with self._lock:
                if self._in_flight + group_bytes > self._budget:
                    return  # over budget: try again on a later read
                self._in_flight += group_bytes
            stream.ahead_until = hlen + (g + 1) * group_elements * item
            self._pool_started().submit(self._decode, stream, generation, data, g, group_bytes)

    def _decode(self, stream: _Stream, generation: int, data: TensorData, g: int, group_bytes: int) -> None:
        try:
            if not stream.closed and stream.generation == generation:
                data.prefetch_group(g)
        except Exception:  # noqa: BLE001 - a failing group fails the read that needs it, with its own error
            log.debug("prefetch of group %d of %r failed", g, data.info.name, exc_info=True)
        finally:
            with self._lock:
                self._in_flight -= group_bytes

    def _advise(self, path: str, offset: int, nbytes: int, sequential: bool) -> None:
        if nbytes > 0:
            self._sources.get(path).advise(offset, nbytes, sequential=sequential)

    def _pool_started(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="ckptfs-prefetch")
        return self._pool

    def close(self, wait: bool = False) -> None:
        """Stop the workers: drop queued work, or with ``wait`` finish it first."""
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=not wait)
            self._pool = None


# -- daemon-wide settings ------------------------------------------------------------------------------------

def _readahead_from_env() -> int:
    try:
        return max(0, int(os.environ.get(READAHEAD_ENV, DEFAULT_READAHEAD_KB)))
    except ValueError:
        return DEFAULT_READAHEAD_KB


def _unescape(field: str) -> str:
    """/proc/self/mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_device(mountpoint: str) -> str | None:
    """``major:minor`` of the filesystem mounted at ``mountpoint`` (the last one stacked there), read from
    /proc/self/mountinfo — never by stat (nor realpath, which stats): from ``init`` that would ask the
    FUSE daemon itself for the attributes of its root before it has answered INIT, and hang."""
    target = os.path.normpath(os.path.abspath(mountpoint))  # not realpath: it would stat the mount root
    device = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and _unescape(fields[4]) == target:
                    device = fields[2]
    except OSError:
        return None
    return device


def set_mount_readahead(mountpoint: str, kib: int) -> bool:
    """Set the kernel readahead of the mount's own backing device; False where that is not possible."""
    device = mount_device(mountpoint)
    if device is None:
        return False
    try:
        with open(f"/sys/class/bdi/{device}/read_ahead_kb", "w") as f:
            f.write(str(kib))
    except OSError:
        return False
    return True


def use_one_malloc_arena() -> bool:
    """Make every thread of this process allocate from one glibc arena (see the module docstring)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        return False
