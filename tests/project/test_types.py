"""The package type-checks: mypy with the configuration in pyproject.toml ([tool.mypy]) finds no error.

Strict on the layers the rest stands on (util, core, workers, ahead, cache, engine, sources, formats, quant,
checkpoint), mypy's defaults elsewhere: a caller reaching for an attribute its object's declared type lacks, or
a None where a value is needed, fails here in CI instead of as an AttributeError in whichever read reaches it.
It passes twice: in the test venv, where every optional extra is installed and its types are read, and in
``.venv-core`` (scripts/setup.sh), which holds the core dependencies alone, as ``pip install ckptfs`` does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / ".venv-core" / "bin"  # numpy, click, mfusepy and mypy: no optional extra
#: An import name of each optional extra's packages that ckptfs imports (pyproject.toml's extras).
EXTRAS = ("boto3", "urllib3", "huggingface_hub", "redis", "prometheus_client", "torch", "transformers",
          "tokenizers", "sentencepiece", "gguf", "safetensors", "isal")


def _mypy(*args: str, mypy: str | None = None) -> subprocess.CompletedProcess:
    mypy = mypy or shutil.which("mypy", path=os.path.dirname(sys.executable)) or shutil.which("mypy")
    assert mypy, "mypy is part of the test extra (pip install -e '.[test]')"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the tree under test, not another install of ckptfs
    return subprocess.run([mypy, "--no-incremental", "--config-file", str(ROOT / "pyproject.toml"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_mypy_finds_no_error():
    done = _mypy()
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


def test_mypy_finds_no_error_without_the_extras():
    """The same check where no optional extra is installed: their modules are Any, nothing else changes."""
    if not (CORE / "mypy").exists():
        skip_or_fail("no .venv-core (scripts/setup.sh makes it): mypy cannot run without the extras")
    found = subprocess.run([str(CORE / "python"), "-c", "import importlib.util, sys; "
                            "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m)))", *EXTRAS],
                           capture_output=True, text=True, timeout=60)
    assert found.returncode == 0 and found.stdout.strip() == "", f".venv-core holds extras: {found.stdout}"
    done = _mypy(mypy=str(CORE / "mypy"))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


@pytest.mark.parametrize("module", ["ckptfs/util/runs.py", "ckptfs/fuse/mountinfo.py", "ckptfs/service/options.py"])
def test_strict_modules_are_checked_strictly(tmp_path, module):
    """ckptfs/util/ (and the FUSE adapter's and daemon side's annotated modules) under mypy's strict
    options: an unannotated function there is an error."""
    planted = tmp_path / "planted.py"
    planted.write_text("def runs(indexes):\n    return [(i, i + 1) for i in indexes]\n")
    done = _mypy("--shadow-file", module, str(planted), module)
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"{module}:1: error: Function is missing a type annotation" in done.stdout


def test_the_configuration_finds_a_planted_error(tmp_path):
    """The same configuration on a file that reaches for what a declared interface lacks: mypy says so."""
    planted = tmp_path / "planted.py"
    planted.write_text("from ckptfs.engine.values import TensorValues\n\n\n"
                       "def f(values: TensorValues) -> int:\n"
                       "    return values.pread_into(0)\n")
    done = _mypy(str(planted))
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    assert '"TensorValues" has no attribute "pread_into"' in done.stdout
