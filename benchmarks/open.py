"""Open-speed benchmark: a GGUF with a 262,144-token vocabulary, ckptfs vs gguf-py.

Each measurement runs in a fresh Python process (nothing cached in memory between runs; the file itself is
in the page cache after the first run, for both readers alike). Module imports happen before the clock
starts; the timed call is the open itself - ``ckptfs.formats.read_file(path)`` (which includes loading the
codec registry on first use) or ``gguf.GGUFReader(path)``. Two more lines time a second ckptfs open in the
same process (codec modules already imported: the header work alone) and ckptfs decoding the vocabulary on
first access, which ckptfs defers and gguf-py does at open.

Usage: python -m benchmarks open [--runs 3] [--gguf-runs 3] [--file PATH]
The file is written if absent: scripts/make_realistic_gguf.py's 262,144-token vocabulary (word pieces, scores
and token types, as a SentencePiece model's) and three small tensors, with gguf-py's writer.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import REPO

VOCAB = 262_144

CKPTFS_OPEN = """
import sys, time
from ckptfs.formats import read_file
t = time.perf_counter(); read_file(sys.argv[1]); print(time.perf_counter() - t)
"""
CKPTFS_SECOND_OPEN = """
import sys, time
from ckptfs.formats import read_file
read_file(sys.argv[1])
t = time.perf_counter(); read_file(sys.argv[1]); print(time.perf_counter() - t)
"""
CKPTFS_TOKENS = """
import sys, time
from ckptfs.formats import read_file
md = read_file(sys.argv[1]).metadata
t = time.perf_counter(); tokens = md["tokenizer.ggml.tokens"]; print(time.perf_counter() - t)
"""
GGUF_PY_OPEN = """
import sys, time
import gguf
t = time.perf_counter(); gguf.GGUFReader(sys.argv[1]); print(time.perf_counter() - t)
"""


def ensure_file(path: Path) -> Path:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        write_big_vocab(tmp)
        tmp.rename(path)
    return path


def write_big_vocab(path: Path) -> None:
    """A GGUF whose header is a 262,144-token vocabulary and three small tensors (the open-speed case)."""
    import gguf
    import make_realistic_gguf as realistic  # scripts/, on the import path (benchmarks/__init__.py)

    rng = np.random.default_rng(7)
    writer = gguf.GGUFWriter(str(path), "llama")
    tokens, scores, types = realistic.vocabulary(VOCAB, rng)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores.tolist())
    writer.add_token_types(types.tolist())
    realistic.add_random_tensors(writer, [("token_embd.weight", (4, 64), "Q8_0"), ("output_norm.weight", (64,), "F32"),
                                          ("blk.0.attn_q.weight", (2, 256), "Q4_K")], rng)
    realistic.finish(writer, str(path))


def timed(code: str, path: Path, runs: int) -> list[float]:
    """Seconds reported by ``code`` in ``runs`` fresh interpreter processes."""
    out = []
    for _ in range(runs):
        result = subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True,
                                text=True, cwd=REPO)
        out.append(float(result.stdout.strip().splitlines()[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per ckptfs measurement")
    parser.add_argument("--gguf-runs", type=int, default=3, help="fresh processes for gguf-py (slow)")
    parser.add_argument("--file", type=Path, default=Path(tempfile.gettempdir()) / "ckptfs-bench" /
                        "vocab-262144-pieces.gguf")
    args = parser.parse_args(argv)
    path = ensure_file(args.file)
    print(f"file: {path} ({path.stat().st_size / 2**20:.1f} MiB, 262,144-token vocabulary)")
    ours = timed(CKPTFS_OPEN, path, args.runs)
    second = timed(CKPTFS_SECOND_OPEN, path, args.runs)
    tokens = timed(CKPTFS_TOKENS, path, args.runs)
    theirs = timed(GGUF_PY_OPEN, path, args.gguf_runs)
    fmt = lambda xs: f"median {statistics.median(xs):.4f} s  (runs: {', '.join(f'{x:.4f}' for x in xs)})"  # noqa: E731
    print(f"ckptfs read_file open:         {fmt(ours)}")
    print(f"ckptfs second open, same process (codecs loaded): {fmt(second)}")
    print(f"ckptfs first vocabulary access: {fmt(tokens)}")
    print(f"gguf-py GGUFReader open:       {fmt(theirs)}")
    print(f"ratio gguf-py / ckptfs open:   {statistics.median(theirs) / statistics.median(ours):.0f}x")
    return 0
