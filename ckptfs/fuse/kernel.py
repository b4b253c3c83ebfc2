"""Daemon-wide kernel and allocator settings of a mount (the FUSE side of read-ahead).

- The mount's kernel readahead. Page-cache reads of a FUSE file arrive as requests of the backing device's
  ``read_ahead_kb`` (128 KiB by default) however large the reader's ``read`` is, and every request costs a
  FUSE round trip through Python. Raising it to 1 MiB for this mount's own device (``/sys/class/bdi/<dev>``,
  root only; it disappears with the mount) makes a stream 8x fewer requests. Small random reads are not
  affected (the kernel reads those as they are); an mmap fault reads around it by that much.
  ``CKPTFS_READAHEAD_KB`` sets it (0 leaves the kernel's); ``CKPTFS_PREFETCH=0`` leaves it too.
- One malloc arena. Decoded groups are allocated by whichever thread decodes them (a FUSE thread or a
  read-ahead worker) and freed by whichever evicts them; with glibc's arena per thread, memory freed into
  another thread's arena is kept there, and the daemon's anonymous memory grows well past ``--cache-size``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from typing import Any

from ckptfs.ahead.decode import enabled_from_env
from ckptfs.fuse.mountinfo import mount_entries

log = logging.getLogger(__name__)

READAHEAD_ENV = "CKPTFS_READAHEAD_KB"
DEFAULT_READAHEAD_KB = 1024
M_ARENA_MAX = -8  # glibc's mallopt parameter number


def readahead_from_env() -> int:
    try:
        return max(0, int(os.environ.get(READAHEAD_ENV, DEFAULT_READAHEAD_KB)))
    except ValueError:
        return DEFAULT_READAHEAD_KB


def tune_connection(conn: Any, mountpoint: str | None) -> None:
    """Raise this mount's kernel readahead; called from ``init`` (libfuse's, before its reply to the kernel's
    INIT). The kernel keeps the smaller of the device's ``read_ahead_kb`` and the ``max_readahead`` of the
    reply, so both are raised here: the device's now, the reply's through the connection info (``conn``,
    from mfusepy's ``init_with_config``; None leaves the kernel default). Never raises: nothing may keep the
    mount from reporting ready."""
    kib = readahead_from_env()
    if not enabled_from_env() or not kib or conn is None or not mountpoint:
        return
    try:
        if not set_mount_readahead(mountpoint, kib):
            log.debug("kernel readahead of %s left as it is (not root, or no sysfs)", mountpoint)
            return
        conn.max_readahead = max(int(conn.max_readahead), kib * 1024)
    except Exception:
        log.debug("raising the readahead of %s failed", mountpoint, exc_info=True)


def mount_device(mountpoint: str) -> str | None:
    """``major:minor`` of the filesystem mounted at ``mountpoint`` (the last one stacked there), read from
    /proc/self/mountinfo — never by stat (nor realpath, which stats): from ``init`` that would ask the
    FUSE daemon itself for the attributes of its root before it has answered INIT, and hang."""
    target = os.path.normpath(os.path.abspath(mountpoint))  # not realpath: it would stat the mount root
    device = None
    for entry in mount_entries():
        if entry.path == target:
            device = entry.device
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
