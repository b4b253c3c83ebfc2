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


def _mypy(*args: str) -> subprocess.CompletedProcess:
    mypy = shutil.which("mypy", path=os.path.dirname(sys.executable)) or shutil.which("mypy")
    assert mypy, "mypy is part of the test extra (pip install -e '.[test]')"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the tree under test, not another install of ckptfs
    return subprocess.run([mypy, "--no-incremental", "--config-file", str(ROOT / "pyproject.toml"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_mypy_finds_no_error():
    done = _mypy()
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


def test_the_configuration_finds_a_planted_error(tmp_path):
    """The same configuration on a file that reaches for what a declared interface lacks: mypy says so."""
    planted = tmp_path / "planted.py"
    planted.write_text("from ckptfs.engine.values import TensorValues\n\n\n"
                       "def f(values: TensorValues) -> int:\n"
                       "    return values.pread_into(0)\n")
    done = _mypy(str(planted))
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    assert '"TensorValues" has no attribute "pread_into"' in done.stdout
