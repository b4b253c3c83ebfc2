"""The package's layering holds: import-linter's contracts in pyproject.toml (layers, no cycles, the FUSE
adapter and the daemon side importing no feature) are kept.

A cycle or an import that points up a layer fails here, in CI, instead of being found by the next reader.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_linter_contracts_are_kept():
    lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    assert lint, "import-linter is part of the test extra (pip install -e '.[test]')"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the tree under test, not another install of ckptfs
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in done.stdout
