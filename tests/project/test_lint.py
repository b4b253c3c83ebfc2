"""The repository lints clean: ``ruff check`` with the configuration in pyproject.toml ([tool.ruff]) finds nothing.

Every Python file of the repository (the package, its tests, benchmarks and scripts) is checked, so CI fails on
an unused import, a name used before it is bound, a bare ``except:`` or a ``# noqa`` that silences nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    assert ruff, "ruff is part of the test extra (pip install -e '.[test]')"
    return subprocess.run([ruff, "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    done = _ruff(str(ROOT))
    hint = "\n(`ruff check --fix` mends the findings marked [*])"
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:] + hint
    assert "All checks passed!" in done.stdout


def test_the_configuration_finds_planted_findings(tmp_path):
    """The same configuration on a file with an unused import and a ``# noqa`` that silences nothing."""
    planted = tmp_path / "planted.py"
    planted.write_text("import os\n\n\nx = 1  # noqa: E731\n")
    done = _ruff("--output-format", "concise", str(planted))
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    assert "F401" in done.stdout and "RUF100" in done.stdout
