"""Acting as another user in the permission tests: ``AS_NOBODY`` (a command prefix that runs as nobody,
through setpriv) and the ``public_dir`` fixture, a folder other users can traverse (pytest's own are 0700)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import (
    force_unmount,
    skip_or_fail,
)

NOBODY = 65534


AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A temporary directory other users can traverse (pytest's own are 0700)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        skip_or_fail("needs root and setpriv to act as another user")
    path = Path(tempfile.mkdtemp(prefix="ckptfs-perm-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for sub in path.iterdir():
            force_unmount(sub)
        shutil.rmtree(path, ignore_errors=True)
