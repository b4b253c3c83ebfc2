"""The benchmark suite's one runner: ``python -m benchmarks`` lists every workload module of ``benchmarks/``
(each file with a ``main``), without importing them, and ``python -m benchmarks NAME --help`` starts each one."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "benchmarks"


def _has_main(path: Path) -> bool:
    return any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in ast.parse(path.read_text()).body)


WORKLOADS = sorted(p.stem for p in SUITE.glob("*.py") if not p.stem.startswith("_") and _has_main(p))


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_the_listing_names_every_workload_of_the_folder_with_its_summary_and_figure():
    assert len(WORKLOADS) >= 16, WORKLOADS
    done = _run("-m", "benchmarks")
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines()[2:] if line and not line[0].isspace()]
    assert sorted(listed) == WORKLOADS  # a workload left out of the runner, or one without a file, fails here
    lines = done.stdout.splitlines()
    for name in WORKLOADS:
        first = ast.get_docstring(ast.parse((SUITE / f"{name}.py").read_text())).splitlines()[0]
        at = next(i for i, line in enumerate(lines) if line.split()[:1] == [name])
        assert lines[at].split(None, 1)[1] == first
        figure = lines[at + 1].strip()
        assert figure.startswith("figure: ") and len(figure) > len("figure: ") + 10, figure


def test_listing_imports_no_workload():
    code = ("import sys; from benchmarks.__main__ import listing; listing(); "
            "print(sorted(m for m in sys.modules if m.startswith('benchmarks.') or m in ('torch', 'numpy', 'ckptfs')))")
    done = _run("-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['benchmarks.__main__']"


def test_a_server_that_cannot_run_is_one_line():
    """A workload whose server's program is not installed (``loopback.servers.MissingTool``) ends with one line
    naming it and exit status 1, not a traceback."""
    code = ("import sys, types\n"
            "from loopback.servers import MissingTool\n"
            "def main(argv):\n"
            "    raise MissingTool('nginx is not installed (/usr/sbin/nginx; Debian: apt-get install nginx-light)')\n"
            "sys.modules['benchmarks.remote'] = types.SimpleNamespace(main=main)\n"
            "from benchmarks.__main__ import main as run\n"
            "sys.exit(run(['remote']))\n")
    done = _run("-c", code)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip() == "benchmarks remote: nginx is not installed (/usr/sbin/nginx; Debian: apt-get install nginx-light)"


def test_an_unknown_workload_is_an_error():
    done = _run("-m", "benchmarks", "no_such_workload")
    assert done.returncode == 2
    assert "no workload 'no_such_workload'" in done.stderr


@pytest.mark.parametrize("name", WORKLOADS)
def test_each_workload_starts(name):
    done = _run("-m", "benchmarks", name, "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"usage: python -m benchmarks {name} "), done.stdout[:300]


def test_the_suite_stands_without_the_test_suite():
    """Every workload module imports with nothing of tests/ on the import path or among the loaded modules: the
    servers both start come from the ``loopback`` package, the writers from scripts/."""
    code = ("import importlib, json, sys\n"
            f"for name in {WORKLOADS!r}:\n"
            "    importlib.import_module('benchmarks.' + name)\n"
            "print(json.dumps({'path': sys.path, 'files': [getattr(m, '__file__', None) or '' for m in "
            "list(sys.modules.values())]}))\n")
    done = _run("-c", code, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    tests = str(REPO / "tests")
    assert not [p for p in seen["path"] if p.rstrip("/") == tests]
    assert not [f for f in seen["files"] if f.startswith(tests + "/")]
    assert any(f.startswith(str(REPO / "loopback") + "/") for f in seen["files"])  # what they share is there
