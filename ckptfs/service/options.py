"""FUSE mount options: ours, fixed for immutable data, plus what the user passes with ``-o``.

Ours: ``ro`` and ``auto_unmount`` always (a killed daemon leaves no dead mount); ``kernel_cache`` and long
entry/negative timeouts, because the data never changes while mounted — without ``kernel_cache`` every
open() drops the file's cached pages (np.load opens a file three times); ``default_permissions`` so the kernel
checks the modes getattr reports itself (with ``allow_other``, every user may read what those allow). The
attribute timeout is long for a remote source (0444/0555: nothing changes) and ``ATTR_TIMEOUT_S`` for a local
one, whose owners and modes follow the files' (tree.ownership): a ``chmod`` after the mount is honoured within
it plus ``MODES_TTL_S``. Never ``direct_io``: it makes a
shared mmap of the file fail (np.load with mmap_mode) and bypasses the page cache.

``nonempty`` is ours to handle (libfuse 3 dropped it): it only relaxes our own mountpoint check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ckptfs.fuse.errors import MountError

CACHE_TIMEOUT = "86400"  # seconds; the tree never changes during a mount
ATTR_TIMEOUT_S = 1  # seconds; a local mount's owners and modes are those of its files now

REFUSED = {
    "rw": "ckptfs mounts are read-only (checkpoint data cannot be written through the mount)",
    "direct_io": "direct_io breaks mmap (np.load(..., mmap_mode='r')) and the page cache",
    # options libfuse accepts but that leave no working mount
    "max_read": "libfuse 3 stops the mount right after it starts when max_read is set (its init and the "
                "session disagree on the read size)",
    "modules": "FUSE modules (subdir, iconv) rewrite the paths ckptfs serves: the mount's root answers nothing",
    "subdir": "subdir is an option of the subdir module, which is refused (see -o modules)",
    "subtype": "ckptfs umount and the tests recognise ckptfs mounts by their type fuse.ckptfs",
}


@dataclass(frozen=True)
class MountOptions:
    """The user's ``-o`` options, checked: ``extra`` goes to libfuse, ``nonempty`` is ours."""

    extra: dict[str, str | bool] = field(default_factory=dict)
    nonempty: bool = False

    def for_libfuse(self, src: str, libfuse_major: int) -> dict[str, str | bool]:
        """Ours, then the user's (which win: libfuse takes the last value of an option)."""
        return {**fixed_options(src, libfuse_major), **self.extra}


def _escape(value: str) -> str:
    """libfuse splits -o on commas; a backslash escapes one inside a value (a path with a comma)."""
    return value.replace("\\", "\\\\").replace(",", "\\,")


def fixed_options(src: str, libfuse_major: int) -> dict[str, str | bool]:
    options: dict[str, str | bool] = {
        "ro": True,
        "auto_unmount": True,
        "default_permissions": True,
        "kernel_cache": True,
        "entry_timeout": CACHE_TIMEOUT,
        "attr_timeout": CACHE_TIMEOUT if "://" in src else str(ATTR_TIMEOUT_S),
        "negative_timeout": CACHE_TIMEOUT,
        "fsname": _escape(f"ckptfs:{src}"),
        "subtype": "ckptfs",
    }
    if libfuse_major >= 3:
        # libfuse 3.14's fuse_main passes its "unset" idle-thread limit (UINT_MAX) to a range check that
        # prints "Ignoring invalid max threads value" on every mount. 10 is also the default max_threads,
        # so no idle worker is ever destroyed, as libfuse's own default intends.
        options["max_idle_threads"] = "10"
    return options


def parse_options(text: str) -> MountOptions:
    """The comma-joined ``-o`` values, checked; MountError (a usage error) for a refused one."""
    options: dict[str, str | bool] = {}
    nonempty = False
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if key in REFUSED:
            raise MountError(f"-o {key} refused: {REFUSED[key]}", exit_code=2)
        if key == "nonempty":
            nonempty = True
        elif key == "ro":
            continue
        else:
            options[key] = value if eq else True
    return MountOptions(options, nonempty)


#: libfuse's own words for an option it does not know (3: "fuse: unknown option(s): `-o bogus=1'"; 2:
#: "fuse: unknown option `bogus=1'"). Which options libfuse takes is libfuse's to say (they differ between
#: versions and builds), so ckptfs passes unknown ones on and reads the refusal.
_UNKNOWN = re.compile(r"fuse: unknown option(?:\(s\))?:? `(?:-o )?([^']*)'")


def as_usage_error(error: MountError) -> MountError:
    """``error`` as the usage error it is (exit 2, naming the option) when libfuse refused an option it does
    not know; otherwise ``error`` itself."""
    found = _UNKNOWN.search(str(error))
    if found is None or error.exit_code == 2:
        return error
    return MountError(f"-o {found.group(1)}: not an option of ckptfs mount or of libfuse "
                      f"(see 'ckptfs mount --help')", exit_code=2)
