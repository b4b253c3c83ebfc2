"""Mountpoints: checks before mounting (for a fast one-line error), and unmounting.

Checks happen in the parent before it forks, so that the common mistakes (missing directory, already
mounted, not empty, no /dev/fuse) are reported at once instead of by a daemon that has already detached.

A mountpoint is named by its real path (``realpath``) everywhere, as the kernel records it: ``mount`` and
``umount`` through a symlink name the same mount. ``MountpointLock`` makes two ``ckptfs mount`` at one
mountpoint take turns, so the second sees the first's mount instead of stacking a hidden one on it.
``check_answers`` is what "ready" means: the new mount's root answers, as this daemon. ``unmount`` removes
only ckptfs mounts (``fuse.ckptfs``, or a FUSE mount whose source names ckptfs), never another filesystem.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import subprocess
import threading
import time

from ckptfs.fuse.errors import MountError
from ckptfs.fuse.mountinfo import MountEntry, mount_entries

STATS_XATTR = "user.ckptfs.stats"  # the root's stats (operations.py serves it): names the daemon's pid


def mount_points() -> set[str]:
    """Every mount point of this process's mount namespace (empty where /proc is missing)."""
    return {entry.path for entry in mount_entries()}


def mount_entry(path: str) -> MountEntry | None:
    """The mount visible at ``path`` (the last one mounted there), or None."""
    path = real_mountpoint(path)
    found = [entry for entry in mount_entries() if entry.path == path]
    return found[-1] if found else None


def real_mountpoint(path: str) -> str:
    """``path`` as the kernel names a mount on it: absolute, symlinks resolved (a dead FUSE mount, which
    cannot be stat'ed, is kept as it is rather than failing)."""
    if not path:
        raise MountError("the mountpoint is an empty string: name a directory", exit_code=2)
    return os.path.realpath(path)


def is_mount_point(path: str) -> bool:
    """True for live mounts and for dead FUSE mounts (whose stat fails with ENOTCONN, fooling ismount)."""
    path = real_mountpoint(path)
    return os.path.ismount(path) or path in mount_points()


# What a FUSE mount whose daemon died answers: ENOTCONN, or ECONNABORTED once the kernel aborted the connection.
DEAD_MOUNT_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED)


def _dead_mount(path: str, reason: str) -> MountError:
    return MountError(f"mountpoint {path} is a dead mount ({reason}): run 'ckptfs umount {path}' first")


def check_mountpoint(path: str, allow_nonempty: bool) -> str:
    """The real path of the mountpoint, or MountError saying in one line why it cannot be mounted on."""
    path = real_mountpoint(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MountError(f"mountpoint {path} does not exist") from None
    except OSError as exc:
        if path in mount_points():
            raise _dead_mount(path, exc.strerror or str(exc)) from None
        raise MountError(f"mountpoint {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise MountError(f"mountpoint {path} is not a directory")
    try:
        with os.scandir(path) as entries:
            nonempty = any(True for _ in entries)
    except OSError as exc:
        # A dead FUSE mount may still stat (cached attributes) but cannot be listed.
        if exc.errno in DEAD_MOUNT_ERRNOS:
            raise _dead_mount(path, exc.strerror or str(exc)) from None
        raise MountError(f"mountpoint {path}: {exc.strerror}") from None
    if is_mount_point(path):
        raise MountError(f"mountpoint {path} is already a mount point")
    if nonempty and not allow_nonempty:
        raise MountError(f"mountpoint {path} is not empty (add -o nonempty to mount over its contents)")
    return path


def check_dev_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        raise MountError("/dev/fuse is missing: load the fuse kernel module (modprobe fuse), "
                         "or in a container pass --device /dev/fuse --cap-add SYS_ADMIN")


def check_fusermount(fusermount: str) -> None:
    """The setuid helper libfuse needs for unprivileged mounts and for ``auto_unmount``."""
    if shutil.which(fusermount) is None and not os.path.exists(f"/usr/bin/{fusermount}"):
        package = "fuse3" if fusermount == "fusermount3" else "fuse (or fuse3 with libfuse2)"
        raise MountError(f"{fusermount} not found: install {package}")


def _unmount_commands(path: str) -> list[list[str]]:
    commands = [["fusermount3", "-u", path], ["fusermount", "-u", path]]
    if os.geteuid() == 0:
        commands.append(["umount", "-l", path])
    commands += [["fusermount3", "-uz", path], ["fusermount", "-uz", path]]
    return [c for c in commands if shutil.which(c[0])]


def unmount(mountpoint: str) -> None:
    """Unmount cleanly if possible (fusermount3 -u, fusermount -u), lazily if busy (umount -l, -uz).

    Only a ckptfs mount: anything else (a tmpfs, another FUSE filesystem) is refused, since ``umount -l`` as
    root would remove it. The daemon notices the unmount and exits by itself.
    """
    path = real_mountpoint(mountpoint)
    entry = mount_entry(path)
    if entry is None:
        raise MountError(f"{path} is not a mount point")
    if not entry.is_ckptfs:
        raise MountError(f"{path} is a {entry.fstype} mount, not a ckptfs mount: not unmounting it")
    reason = "no fusermount3, fusermount or umount found"
    for command in _unmount_commands(path):
        result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if result.returncode == 0 and not is_mount_point(path):
            return
        lines = (result.stderr or result.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"{command[0]} exited with status {result.returncode}"
    raise MountError(f"cannot unmount {path}: {reason}")


class MountpointLock:
    """An exclusive ``flock`` on the mountpoint directory, held while one ``ckptfs mount`` checks, mounts and
    verifies it. A second mount at the same place waits, then finds it mounted and says so.

    The lock is on the directory under the mount (opened before mounting); a daemon forked meanwhile must
    ``close_inherited()`` its copy, or the lock would last as long as the daemon.
    """

    def __init__(self, path: str, timeout: float):
        path = real_mountpoint(path)
        try:
            cloexec = getattr(os, "O_CLOEXEC", 0)  # probe: platform
            self.fd: int | None = os.open(path, os.O_RDONLY | os.O_DIRECTORY | cloexec)
        except OSError:
            self.fd = None  # missing, not a directory, dead mount: check_mountpoint says why in one line
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return  # no locking here (some network filesystems): mount unserialized
            if time.monotonic() > deadline:
                self.release()
                raise MountError(f"mountpoint {path} is being mounted by another ckptfs (waited {timeout:.0f} s)")
            time.sleep(0.05)

    def close_inherited(self) -> None:
        """In a forked child: drop this process's descriptor (the parent's keeps the lock)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor of the open file drops the flock
            self.fd = None

    def __enter__(self) -> MountpointLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class MountGone(MountError):
    """``check_answers`` found no mount to ask any more: its session ended while it asked (a signal, an
    unmount), which is not a mount that answers wrongly."""


def check_answers(path: str, pid: int, timeout: float) -> None:
    """MountError unless the mount at ``path`` is served by daemon ``pid``: its root's stats xattr must
    answer and name that pid. libfuse can call ``init`` and then give up (``-o max_read`` on libfuse 3), and
    options such as ``modules=subdir`` leave a root that answers nothing; neither is a working mount. Asked
    from a thread, so a mount that never answers costs ``timeout`` seconds, not a hang. MountGone when the
    mount was gone by the time the question was answered (its connection aborted, or no mount at ``path``)."""
    answer: dict[str, object] = {}

    def ask() -> None:
        try:
            answer["stats"] = json.loads(os.getxattr(path, STATS_XATTR))
        except (OSError, ValueError) as exc:
            answer["error"] = exc

    thread = threading.Thread(target=ask, name="ckptfs-check-mount", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise MountError(f"the mount at {path} did not answer within {timeout:.0f} s")
    error = answer.get("error")
    if error is not None:
        os_error = error if isinstance(error, OSError) else None
        reason = (os_error.strerror if os_error is not None else None) or str(error)
        gone = ((os_error is not None and os_error.errno in (*DEAD_MOUNT_ERRNOS, errno.ENODEV))
                or not is_mount_point(path))
        raise (MountGone if gone else MountError)(f"the mount at {path} does not answer at its root ({reason}): "
                                                  "not mounted")
    stats = answer.get("stats")
    if not isinstance(stats, dict) or stats.get("pid") != pid:
        raise MountError(f"the mount at {path} is not served by this ckptfs daemon (pid {pid}): not mounted")
