"""Run llama.cpp (the probe scripts/build_llama_cpp.sh builds) on a GGUF: greedy tokens and timings, or a
sentence embedding.

The one place that knows how to find and call ``ckptfs-llama-probe``: tests/clients/test_clients_llamacpp.py and
benchmarks/clients.py import it. The probe loads the model with libllama in one of its load modes —
``mmap`` (its default), ``none`` (buffered reads into its own buffers, ``--no-mmap``) or ``dio`` (O_DIRECT
reads aligned to st_blksize; llama.cpp falls back to buffered reads with only a warning when O_DIRECT
fails, which the probe reports as ``dio_fallback``) — and prints one JSON line: ``tokens`` (greedy ids),
``text``, ``load_ms``, ``ttft_ms`` (process start to the first generated token: loading, context, prompt),
``tok_s`` (generation after the first token), ``dio_fallback``, ``warnings``. With ``run_embedding`` it
computes the embedding of a text the way llama.cpp's embedding example does (the model's pooling, one
decode of the whole prompt) and prints ``tokens`` (the prompt's), ``pooling``, ``n_embd``, ``embedding``
(each float with 9 significant digits, so it reads back as the same float32), ``load_ms``,
``dio_fallback``, ``warnings``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("mmap", "none", "dio")
PROMPT = "Hello my name is"


def probe_path() -> Path:
    """Where build_llama_cpp.sh puts (or would put) the probe on this machine; CKPTFS_LLAMA_PROBE wins."""
    if os.environ.get("CKPTFS_LLAMA_PROBE"):
        return Path(os.environ["CKPTFS_LLAMA_PROBE"])
    out = subprocess.run(["bash", str(HERE / "build_llama_cpp.sh"), "--path"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return Path(out.strip().splitlines()[-1])


def run(model: str | os.PathLike, mode: str = "mmap", n_predict: int = 24, threads: int = 2,
        prompt: str = PROMPT, timeout: float = 300.0, probe: Path | None = None) -> dict:
    """One greedy run; raises RuntimeError with llama.cpp's stderr when it cannot load or generate."""
    return _probe(model, mode, ["-n", str(n_predict), "-t", str(threads), "-p", prompt], timeout, probe)


def run_embedding(model: str | os.PathLike, text: str = PROMPT, mode: str = "mmap", normalize: int = 2,
                  threads: int = 2, timeout: float = 300.0, probe: Path | None = None) -> dict:
    """The embedding of ``text`` (pooled as the GGUF says; one vector per token when it says none) after
    loading in ``mode``; ``normalize`` is llama.cpp's --embd-normalize (-1 none, 0 max absolute, 2
    euclidean, p p-norm). A float llama.cpp computed as NaN or infinite comes back as None."""
    return _probe(model, mode, ["-t", str(threads), "--embed", text, "--embd-normalize", str(normalize)], timeout,
                  probe)


def _probe(model: str | os.PathLike, mode: str, args: list[str], timeout: float, probe: Path | None) -> dict:
    """Both runs load the model the same way and print one JSON line; only what follows the load differs."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    command = [str(probe or probe_path()), "-m", str(model), "--mode", mode, *args]
    # errors=surrogateescape: greedy text may end inside a UTF-8 sequence (byte tokens); kept byte for byte
    done = subprocess.run(command, capture_output=True, text=True, errors="surrogateescape", timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp probe failed ({done.returncode}) on {model}: {done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])
