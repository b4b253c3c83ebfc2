"""llama.cpp as the client in the llama.cpp tests: the probe binary (``probe`` fixture, built by
scripts/build_llama_cpp.sh), the real-shaped model maker (scripts/make_realistic_gguf.py), and the oracle: the probe's
output on the original file in every load mode (``direct``, which takes the requesting module's ``model``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import llama_client
import pytest

from conftest import REPO, skip_or_fail

N_PREDICT = 24


@pytest.fixture(scope="module")
def probe() -> Path:
    path = llama_client.probe_path()
    if not path.exists():
        skip_or_fail(f"llama.cpp is not built ({path} is missing): run bash scripts/build_llama_cpp.sh")
    return path


def make_model(out: Path, *extra: str) -> None:
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_realistic_gguf.py"), str(out), "--layers", "4",
                    "--vocab", "4096", *extra], check=True, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def direct(probe, model) -> dict[str, dict]:
    """The probe on the original file, in every mode: the oracle."""
    out = {mode: llama_client.run(model["one"], mode, N_PREDICT, probe=probe) for mode in llama_client.MODES}
    tokens = out["mmap"]["tokens"]
    assert len(tokens) == N_PREDICT and len(set(tokens)) >= 8, "the model's output is too uniform to compare"
    for mode, result in out.items():  # llama.cpp itself: the load mode does not change the arithmetic
        assert result["tokens"] == tokens, mode
    assert not out["dio"]["dio_fallback"], out["dio"]["warnings"]
    return out


def check_same(result: dict, expected: dict, mode: str) -> None:
    assert result["tokens"] == expected["tokens"]
    assert result["text"] == expected["text"]
    if mode == "dio":
        assert not result["dio_fallback"], f"llama.cpp fell back to buffered reads: {result['warnings']}"
