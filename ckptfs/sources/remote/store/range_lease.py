"""Byte-range leases between processes: open-file-description locks (``F_OFD_SETLK``) on a file's ranges.

Why OFD locks and not ``flock`` or classic ``fcntl`` locks: ``flock`` locks a whole file (one fetcher per
remote file, not per chunk); classic POSIX record locks belong to the process, so any ``close`` of any
descriptor of the file by any thread drops them all, and they never conflict between two descriptions of
one process. OFD locks belong to the open file description: they conflict between two ``open`` calls (two
processes, or two opens in one process), survive other descriptors being closed, and vanish when the
holder's description is closed, so a killed fetcher never leaves a lease behind.

Within one description (the threads of one process sharing an open store file) a lock never conflicts;
the threads of a process are kept to one fetch per chunk by their single flight (``ckptfs.cache.flight``).
"""

from __future__ import annotations

import errno
import fcntl
import struct

# Linux's ABI numbers (since 3.15), where the fcntl module lacks the names
F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)  # probe: platform
F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)  # probe: platform
F_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)  # probe: platform

#: ``struct flock`` (l_type, l_whence, l_start, l_len, l_pid; native alignment, padded to 32 bytes on 64-bit)
_FLOCK = struct.Struct("@hhqqi4x")


def _flock(kind: int, start: int, length: int) -> bytes:
    return _FLOCK.pack(kind, 0, start, length, 0)  # l_pid must be 0 for OFD locks


def try_lock(fd: int, start: int, length: int) -> bool:
    """Take the exclusive lease of bytes ``[start, start + length)`` of ``fd``'s file; False when another
    open file description holds a lock overlapping it."""
    try:
        fcntl.fcntl(fd, F_OFD_SETLK, _flock(fcntl.F_WRLCK, start, length))
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def lock(fd: int, start: int, length: int) -> None:
    """``try_lock`` that waits for the range (only for short critical sections: an index header's update)."""
    fcntl.fcntl(fd, F_OFD_SETLKW, _flock(fcntl.F_WRLCK, start, length))


def unlock(fd: int, start: int, length: int) -> None:
    """Give up whatever this description holds of ``[start, start + length)`` (nothing held: no effect)."""
    fcntl.fcntl(fd, F_OFD_SETLK, _flock(fcntl.F_UNLCK, start, length))


def held_elsewhere(fd: int, start: int, length: int) -> bool:
    """Whether another open file description holds a lock overlapping ``[start, start + length)``."""
    answer = fcntl.fcntl(fd, F_OFD_GETLK, _flock(fcntl.F_WRLCK, start, length))
    return bool(_FLOCK.unpack(answer)[0] != fcntl.F_UNLCK)
