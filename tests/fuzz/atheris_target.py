"""The body of the coverage-guided targets (atheris_gguf.py, atheris_safetensors.py): one process fuzzing
``fuzz_harness.exercise`` on files of one suffix.

The process instruments every ckptfs module for coverage, then caps its own address space (RLIMIT_AS,
``CKPTFS_FUZZ_AS_MB``, default 1024 MiB: the interpreter, numpy and libFuzzer take about 120 MiB here, and a
reader that allocates by what a header claims rather than by what the file holds hits the cap at once, as a
MemoryError that the property reports). Each input runs under ``cpu_alarm``; libFuzzer's ``-timeout`` is
the wall-clock backstop. A finding is an uncaught exception: libFuzzer prints it and writes the input to
``-artifact_prefix``, and test_atheris.py reports both.
"""

from __future__ import annotations

import os
import pkgutil
import resource
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Modules that need FUSE or serve the command line: not reachable from a reader.
SKIPPED = ("ckptfs.fuse", "ckptfs.service", "ckptfs.commands.cli", "ckptfs.bench")


def _import_instrumented() -> Callable[[str], str]:
    with atheris.instrument_imports(include=["ckptfs"]):
        import ckptfs
        for module in pkgutil.walk_packages(ckptfs.__path__, "ckptfs."):
            if not module.name.startswith(SKIPPED):
                __import__(module.name)
        from fuzz_harness import exercise
    return exercise


def _limit_address_space() -> None:
    limit = int(os.environ.get("CKPTFS_FUZZ_AS_MB", "1024")) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run(suffix: str, argv: list[str]) -> None:
    exercise = _import_instrumented()
    from fuzz_harness import cpu_alarm

    path = Path(tempfile.mkdtemp(prefix="ckptfs-fuzz-")) / f"input{suffix}"

    def test_one_input(data: bytes) -> None:
        path.write_bytes(data)
        with cpu_alarm():
            exercise(path)

    _limit_address_space()
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()
