"""The Vagrantfile (a Debian 12 VM that installs FUSE and runs the suite) is valid Vagrant configuration.

Runs where vagrant is installed (Debian: apt-get install --no-install-recommends vagrant; .ci/run installs
it); elsewhere it skips, and under CI=true it fails. No provider (VirtualBox, libvirt) is needed for
validation, so provider blocks are left out of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from conftest import skip_or_fail

REPO = Path(__file__).resolve().parents[2]


def test_vagrantfile_validates(tmp_path):
    if shutil.which("vagrant") is None:
        skip_or_fail("vagrant is not installed (Debian: apt-get install --no-install-recommends vagrant)")
    shutil.copy(REPO / "Vagrantfile", tmp_path / "Vagrantfile")
    env = {**os.environ, "VAGRANT_CWD": str(tmp_path), "VAGRANT_HOME": str(tmp_path / "home"),
           "VAGRANT_CHECKPOINT_DISABLE": "1"}
    result = subprocess.run(["vagrant", "validate", "--ignore-provider"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "validated successfully" in result.stdout
