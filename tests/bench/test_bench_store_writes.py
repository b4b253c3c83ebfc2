"""``python -m benchmarks store_writes`` runs its three cases, and its store case writes chunks that read back, sealed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_store_write_bench_times_each_case(tmp_path):
    out = subprocess.run([sys.executable, "-m", "benchmarks", "store_writes", "--dir", str(tmp_path / "w"), "--mib", "8",
                          "--rounds", "1", "--deleted", "20"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    cases = re.findall(r"^round 1 (store|entry files|one file)\s+(\d+) MB/s", out.stdout, re.M)
    assert sorted(name for name, _ in cases) == ["entry files", "one file", "store"], out.stdout
    assert all(int(rate) > 0 for _, rate in cases)
    assert not (tmp_path / "w").exists()  # it cleans up after itself
