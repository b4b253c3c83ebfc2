"""ckptfs's benchmark suite: the commands behind docs/performance.md's figures, one module per workload.

``python -m benchmarks`` lists the workloads and the figure each produces; ``python -m benchmarks NAME
[ARGS...]`` runs one (``--help`` shows its arguments). Run it from the repository root. Every workload
module has ``main(argv) -> int``; ``make_bench_safetensors``, ``make_scale_safetensors`` and
``fleet_model`` write or compute what the workloads need, ``remote_cold_start`` is the capped half of
``remote``.

The workloads start the servers of the repository's ``loopback`` package (nginx, moto's S3, Redis, the fault
proxy), which the tests start too, and use the writers and clients in scripts/ (make_realistic_gguf.py,
llama_client.py, llama_convert.py), which the documentation and users call from there too: that folder goes
on the import path here, once, after the installed packages, so that a module of the suite imports them by
name. Nothing of the test suite is imported: the benchmarks run without it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
SKELETONS = SCRIPTS / "real-shapes"

if str(SCRIPTS) not in sys.path:
    sys.path.append(str(SCRIPTS))


def workload(name: str, *args: str) -> list[str]:
    """The command line of one workload run as a child process (``python -m benchmarks NAME ARGS...``)."""
    return [sys.executable, "-m", "benchmarks", name, *args]


def child_env() -> dict[str, str]:
    """``os.environ`` with this repository first on PYTHONPATH: a child started by :func:`workload`, from
    whatever folder, imports this suite."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
