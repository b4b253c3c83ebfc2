"""Coverage-guided fuzzing (atheris / libFuzzer) of the GGUF and safetensors readers, for a bounded time.

Each target runs in its own process (see atheris_target.py: every ckptfs module instrumented, address space
capped with RLIMIT_AS, each input under a CPU alarm, libFuzzer's ``-timeout`` as the wall-clock backstop),
seeded with valid files written by the references, for ``CKPTFS_FUZZ_SECONDS`` seconds (default 20). Any
finding - an exception other than CheckpointError, the readers' catch-all reached, a hang, memory beyond the
cap - fails the test with libFuzzer's report and the input, which libFuzzer wrote to a file (path printed).
Under ``CI=true`` a missing atheris fails instead of skipping.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env, skip_or_fail
from seeds import gguf_seeds, safetensors_seeds

HERE = Path(__file__).resolve().parent
FUZZ_SECONDS = int(os.environ.get("CKPTFS_FUZZ_SECONDS", "20"))
ADDRESS_SPACE_MB = 1024
WALL_TIMEOUT_SECONDS = 30
TARGETS = {"atheris_gguf.py": lambda folder: [p for p, _ in gguf_seeds(folder)],
           "atheris_safetensors.py": safetensors_seeds}


def _vm_peak_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _report(target: str, code: int, output: str, findings: list[Path]) -> str:
    lines = [f"{target} exited with {code}; libFuzzer's output ends:", *output.splitlines()[-60:]]
    for path in findings:
        data = path.read_bytes()
        lines.append(f"input written to {path} ({len(data)} bytes): {data[:1024].hex()}")
    return "\n".join(lines)


@pytest.mark.timeout(FUZZ_SECONDS + 300)  # a long CKPTFS_FUZZ_SECONDS must not hit the suite's per-test limit
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_coverage_guided_fuzzing(tmp_path, target):
    if importlib.util.find_spec("atheris") is None:
        skip_or_fail("atheris is not installed (pip install atheris; Linux, CPython <= 3.12)")
    seeds, corpus, artifacts = tmp_path / "seeds", tmp_path / "corpus", tmp_path / "findings"
    corpus.mkdir()
    artifacts.mkdir()
    assert TARGETS[target](seeds)
    command = [sys.executable, str(HERE / target), f"-max_total_time={FUZZ_SECONDS}",
               f"-artifact_prefix={artifacts}/", f"-timeout={WALL_TIMEOUT_SECONDS}",
               # the memory cap is the target's RLIMIT_AS; libFuzzer's own RSS check is off: it reads the peak RSS
               # of getrusage, which a child inherits from its parent's address space at fork/exec (1.3 GB seen
               # from a pytest process late in the suite, an "out-of-memory" before the first input ran).
               # malloc_limit_mb still reports one allocation beyond the cap by its stack.
               "-rss_limit_mb=0", f"-malloc_limit_mb={ADDRESS_SPACE_MB}", "-max_len=65536", "-print_final_stats=1",
               str(corpus), str(seeds)]
    env = cli_env(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", CKPTFS_FUZZ_AS_MB=str(ADDRESS_SPACE_MB))
    log = tmp_path / "libfuzzer.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
    deadline = time.monotonic() + FUZZ_SECONDS + 120
    vm_peak = 0
    while proc.poll() is None:
        vm_peak = max(vm_peak, _vm_peak_kib(proc.pid))
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(_report(target, -9, log.read_text(errors="replace") + "\n(killed: ran far too long)", []))
        time.sleep(0.5)
    output = log.read_text(errors="replace")
    findings = sorted(artifacts.iterdir())
    if proc.returncode != 0 or findings:
        pytest.fail(_report(target, proc.returncode, output, findings))
    runs = int(re.search(r"stat::number_of_executed_units:\s*(\d+)", output).group(1))
    print(f"{target}: {runs} inputs in {FUZZ_SECONDS} s, peak address space "
          f"{vm_peak // 1024} MiB (cap {ADDRESS_SPACE_MB} MiB), corpus {len(list(corpus.iterdir()))} files")
    assert runs >= 100, output[-2000:]
