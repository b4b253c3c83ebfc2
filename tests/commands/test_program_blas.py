"""The ``ckptfs`` program holds numpy's OpenBLAS to one thread (``cli.BLAS_THREADS_VARIABLE``): ckptfs calls no
BLAS, and the pool OpenBLAS starts at numpy's import spins on the CPU a prefetch's first transfers need. A
value the user set is kept."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ckptfs.commands.cli import BLAS_THREADS_VARIABLE

CHILD = textwrap.dedent("""
    import atexit, os, sys
    def report():
        import numpy  # what a command's decoders import, after the program started
        print(os.environ.get(variable), len(os.listdir("/proc/self/task")), flush=True)
    atexit.register(report)
    variable = sys.argv[1]
    sys.argv = ["ckptfs", "--help"]
    from ckptfs.commands.cli import program
    program()
""")


@pytest.mark.parametrize("preset", [None, "2"])
def test_the_program_holds_blas_to_one_thread_unless_told(preset):
    env = {k: v for k, v in os.environ.items() if k != BLAS_THREADS_VARIABLE}
    if preset is not None:
        env[BLAS_THREADS_VARIABLE] = preset
    result = subprocess.run([sys.executable, "-c", CHILD, BLAS_THREADS_VARIABLE], capture_output=True, text=True,
                            env=env, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    value, threads = result.stdout.splitlines()[-1].split()
    if preset is None:
        assert (value, threads) == ("1", "1")  # numpy imported, no thread beside the main one
    else:
        assert value == preset
