"""Mountpoints: checks before mounting (for a fast one-line error), and unmounting.

Checks happen in the parent before it forks, so that the common mistakes (missing directory, already
mounted, not empty, no /dev/fuse) are reported at once instead of by a daemon that has already detached.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess

from .errors import MountError

MOUNTINFO = "/proc/self/mountinfo"


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in a path as octal escapes (\\040 ...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1: i + 4].isdigit() and len(field[i + 1: i + 4]) == 3:
            out.append(chr(int(field[i + 1: i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points() -> set[str]:
    """Every mount point of this process's mount namespace (empty where /proc is missing)."""
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as fh:
            return {_unescape(line.split()[4]) for line in fh if len(line.split()) > 4}
    except OSError:
        return set()


def is_mount_point(path: str) -> bool:
    """True for live mounts and for dead FUSE mounts (whose stat fails with ENOTCONN, fooling ismount)."""
    path = os.path.abspath(path)
    return os.path.ismount(path) or path in mount_points()


# What a FUSE mount whose daemon died answers: ENOTCONN, or ECONNABORTED once the kernel aborted the connection.
DEAD_MOUNT_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED)


def _dead_mount(path: str, reason: str) -> MountError:
    return MountError(f"mountpoint {path} is a dead mount ({reason}): run 'ckptfs umount {path}' first")


def check_mountpoint(path: str, allow_nonempty: bool) -> str:
    """The absolute mountpoint, or MountError saying in one line why it cannot be mounted on."""
    path = os.path.abspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MountError(f"mountpoint {path} does not exist") from None
    except OSError as exc:
        if path in mount_points():
            raise _dead_mount(path, exc.strerror) from None
        raise MountError(f"mountpoint {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise MountError(f"mountpoint {path} is not a directory")
    try:
        with os.scandir(path) as entries:
            nonempty = any(True for _ in entries)
    except OSError as exc:
        # A dead FUSE mount may still stat (cached attributes) but cannot be listed.
        if exc.errno in DEAD_MOUNT_ERRNOS:
            raise _dead_mount(path, exc.strerror) from None
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

    The daemon notices the unmount and exits by itself.
    """
    path = os.path.abspath(mountpoint)
    if not is_mount_point(path):
        raise MountError(f"{path} is not a mount point")
    reason = "no fusermount3, fusermount or umount found"
    for command in _unmount_commands(path):
        result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if result.returncode == 0 and not is_mount_point(path):
            return
        lines = (result.stderr or result.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"{command[0]} exited with status {result.returncode}"
    raise MountError(f"cannot unmount {path}: {reason}")
