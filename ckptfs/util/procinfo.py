"""What /proc says about a process (Linux): alive or not, its children, its anonymous memory.

The benchmark and the tests watch the mount daemon from outside: it is not their child (it detached), so
``waitpid`` cannot be used, and its memory bound is about RssAnon (file-backed pages of the checkpoint do not
count).
"""

from __future__ import annotations

import os


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may itself hold spaces and parentheses)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie is not alive."""
    try:
        return _stat_fields(pid)[0] != "Z"
    except (OSError, IndexError):
        return False


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the daemon's fusermount helper, for instance)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(_stat_fields(int(entry))[1]) == pid:
                    found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _status_bytes(pid: int, field: str) -> int | None:
    """A ``kB`` field of ``/proc/PID/status`` in bytes, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rss_anon(pid: int) -> int | None:
    """Anonymous resident memory of ``pid`` in bytes, or None if the process is gone."""
    return _status_bytes(pid, "RssAnon")


def peak_rss(pid: int) -> int | None:
    """The most resident memory ``pid`` has had (``VmHWM``) in bytes, or None if the process is gone."""
    return _status_bytes(pid, "VmHWM")


def cores() -> int:
    """The CPUs this process may run on (its affinity; the machine's count where that is unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
