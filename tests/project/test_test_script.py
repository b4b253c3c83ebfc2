"""``scripts/test.sh``, the README's test command: every phase runs whatever an earlier one did, the end is one
summary (per phase passed, failed, skipped and how it ended; the skip reasons; the failed tests) whose last
line is the totals alone, and the exit status says whether a phase failed.

The script runs for real, on a generated folder of tiny test modules named like the suite's own
(``CKPTFS_TEST_DIR``), so each of its four phases (numpy 2 without the two own-process modules, each of
those, the dequantization tests on numpy 1.26) has tests of its own to run.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import REPO, skip_or_fail

PASSES = "def test_passes():\n    assert 1 + 1 == 2\n"
FAILS = "def test_fails():\n    assert 1 + 1 == 3\n"
BROKEN = "import no_such_module_anywhere\n"
SKIPS = "import pytest\n\n\ndef test_skips():\n    pytest.skip('no frobnicator here')\n"
NO_TESTS = "VALUE = 1\n"
ROW = re.compile(r"^.*?\s+(?P<passed>\d+)\s+(?P<failed>\d+)\s+(?P<skipped>\d+)  (?P<result>.*)$")


def run_script(folder: Path, modules: dict[str, str]) -> subprocess.CompletedProcess:
    if not (REPO / ".venv-np1" / "bin" / "python").exists():
        skip_or_fail("no .venv-np1 (scripts/setup.sh makes it): the numpy 1.26 phase cannot run")
    folder.mkdir()
    for name, text in modules.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return subprocess.run(["bash", str(REPO / "scripts" / "test.sh")], env={
        "PATH": "/usr/local/bin:/usr/bin:/bin", "CKPTFS_TEST_DIR": str(folder), "HOME": str(folder)},
        cwd=folder, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


def summary_row(out: str, phase: str) -> list[str]:
    """The summary's row of the phase whose name starts with ``phase``: [passed, failed, skipped, result]."""
    summary = out.split("\n== summary\n", 1)[1]
    rows = [ROW.match(line) for line in summary.splitlines() if line.startswith(phase)]
    assert len(rows) == 1 and rows[0], (phase, summary)
    return list(rows[0].group("passed", "failed", "skipped", "result"))


def test_a_failing_phase_fails_the_run_and_the_later_phases_still_run(tmp_path):
    result = run_script(tmp_path / "tests", {
        "test_broken.py": BROKEN,  # the first phase cannot collect a module (pytest's exit 2, as for Ctrl-C) ...
        "clients/test_clients_transformers.py": FAILS,  # ... the second fails ...
        "cache/test_tiers_redis_cluster.py": NO_TESTS,  # ... the third collects nothing (pytest's exit 5) ...
        "quant/test_quant_basic.py": PASSES + "\n\n" + SKIPS,  # ... and the fourth still runs, on numpy 1.26
    })
    out = result.stdout
    assert result.returncode == 1, (out, result.stderr)
    assert out.rstrip("\n").splitlines()[-1] == "1 passed, 2 failed, 1 skipped", out
    assert summary_row(out, "numpy 2 (all but") == \
        ["0", "1", "0", "FAILED: interrupted, or errors while collecting (pytest exit 2)"], out
    assert summary_row(out, "numpy 2, test_clients_transformers.py") == ["0", "1", "0", "FAILED"], out
    assert summary_row(out, "numpy 2, test_tiers_redis_cluster.py") == \
        ["0", "0", "0", "no tests collected (pytest exit 5)"], out
    assert summary_row(out, "numpy 1.26.") == ["1", "0", "1", "ok"], out  # (the name holds the version)
    assert "     1 x no frobnicator here" in out  # the skip reasons, counted over the phases
    failed = out.split("failed:\n", 1)[1]
    assert "test_broken" in failed and "test_clients_transformers::test_fails" in failed, out
    assert "SKIPPED [1]" in out  # -rs: each phase's own skip lines, with where


def test_a_run_without_failures_exits_0_even_with_a_phase_of_no_tests(tmp_path):
    result = run_script(tmp_path / "tests", {
        "clients/test_clients_transformers.py": PASSES,
        "cache/test_tiers_redis_cluster.py": NO_TESTS,
        "quant/test_quant_basic.py": PASSES,
    })
    out = result.stdout
    assert result.returncode == 0, (out, result.stderr)
    assert out.rstrip("\n").splitlines()[-1] == "3 passed, 0 failed, 0 skipped", out
    assert summary_row(out, "numpy 2, test_tiers_redis_cluster.py")[3] == "no tests collected (pytest exit 5)"
