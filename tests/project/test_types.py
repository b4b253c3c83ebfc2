"""The package type-checks: mypy with the configuration in pyproject.toml ([tool.mypy]) finds no error.

Strict on the layers the rest stands on (core, cache, readahead, engine, sources, formats, quant, checkpoint),
mypy's defaults elsewhere: a caller reaching for an attribute its object's declared type lacks, or a None
where a value is needed, fails here in CI instead of as an AttributeError in whichever read reaches it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_finds_no_error():
    mypy = shutil.which("mypy", path=os.path.dirname(sys.executable)) or shutil.which("mypy")
    assert mypy, "mypy is part of the test extra (pip install -e '.[test]')"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the tree under test, not another install of ckptfs
    done = subprocess.run([mypy, "--no-incremental", "--config-file", str(ROOT / "pyproject.toml")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout
