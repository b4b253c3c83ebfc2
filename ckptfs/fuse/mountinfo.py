"""The kernel's table of mounts (``/proc/self/mountinfo``), read by the adapter (``kernel.py``: the backing
device of this mount, whose readahead it raises) and by the service (``service/mountpoint.py``: the checks
before mounting, and which mounts an unmount may remove)."""

from __future__ import annotations

from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"
FSTYPE = "fuse.ckptfs"             # what the kernel records for our mounts (subtype=ckptfs)
FSNAME_PREFIX = "ckptfs:"          # our mounts' source field (fsname=ckptfs:SRC)


def unescape(field: str) -> str:
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


@dataclass(frozen=True)
class MountEntry:
    """One line of mountinfo: where, what filesystem type, and its source field."""

    path: str
    fstype: str
    source: str
    device: str = ""  # major:minor

    @property
    def is_ckptfs(self) -> bool:
        return self.fstype == FSTYPE or (self.fstype.startswith("fuse") and self.source.startswith(FSNAME_PREFIX))


def mount_entries() -> list[MountEntry]:
    """The mounts of this process's mount namespace, in mount order (empty where /proc is missing)."""
    entries = []
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                fields = line.split()
                if " - " not in line or len(fields) < 5:
                    continue
                after = line.split(" - ", 1)[1].split()
                fstype, source = (after + ["", ""])[:2]
                entries.append(MountEntry(unescape(fields[4]), unescape(fstype), unescape(source), fields[2]))
    except OSError:
        pass
    return entries
