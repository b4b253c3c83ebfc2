"""Installing the mount(8) helper ``/sbin/mount.fuse.ckptfs``: a two-line script that runs this interpreter on
:mod:`ckptfs.commands.fstab` (the helper's entry point, which turns mount(8)'s call into ``ckptfs mount``)."""

from __future__ import annotations

import os
import shlex
import stat
import sys

HELPER_PATH = "/sbin/mount.fuse.ckptfs"
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HELPER_MARK = "# mount(8) helper for fuse.ckptfs, written by `ckptfs install-mount-helper`"


def helper_script(python: str | None = None) -> str:
    """The helper's text: this interpreter (the one ckptfs is installed for), by absolute path. An interpreter
    that is gone since (its virtual environment removed or moved) is one line naming it and the fix, exit 1,
    instead of the shell's "exec: not found" and 127 at boot."""
    python = os.path.abspath(python or sys.executable)
    return (f"#!/bin/sh\n{HELPER_MARK}\nPATH={SAFE_PATH}\nexport PATH\n"
            f"PY={shlex.quote(python)}\n"
            f"if [ ! -x \"$PY\" ]; then\n"
            f"  echo \"mount.fuse.ckptfs: error: $PY, the Python ckptfs was installed with, is gone: run "
            f"'ckptfs install-mount-helper' with the ckptfs to use\" >&2\n"
            f"  exit 1\n"
            f"fi\n"
            f"exec \"$PY\" -I -m ckptfs.commands.fstab \"$@\"\n")


def install_helper(target: str = HELPER_PATH, python: str | None = None) -> str:
    """Write the helper to ``target`` (mode 0755, atomically); refuse to replace a file ckptfs did not write."""
    if os.path.lexists(target):
        try:
            with open(target, encoding="utf-8", errors="replace") as f:
                ours = HELPER_MARK in f.read(4096)
        except OSError:
            ours = False
        if not ours:
            raise OSError(f"{target} exists and was not written by ckptfs; remove it first")
    tmp = f"{target}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(helper_script(python))
    os.chmod(tmp, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    os.replace(tmp, target)
    return target
