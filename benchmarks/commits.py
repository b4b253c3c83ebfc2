"""Two checkouts of ckptfs side by side in one run: ``ckptfs bench`` (local) and remote streams, old vs new.

A change to a read path is judged by the ratio new/old of each figure, measured in the same run with the two
commits alternating (which goes first swaps every round), so that the load other processes put on a shared
machine falls on both alike. Each checkout's CLI runs with its own folder first on ``PYTHONPATH`` (the mount
daemons it starts inherit it). Per round and checkout:

1. ``ckptfs bench GGUF --json`` of a local file: the ``.npy`` and ``.raw`` streams' MB/s;
2. an uncapped remote stream: a fresh mount of the same file over http (Debian's nginx on 127.0.0.1, no
   ``--cache-dir``), its largest ``.raw`` read in 1 MiB reads: MB/s, every byte fetched from the origin;
3. a warm remote stream: the same ``.raw`` read again on that mount, its chunks in the daemon's memory.

Prints, per figure, each checkout's median and range over the rounds and the median of the per-round ratios
new/old with their range.

Usage: python -m benchmarks commits OLD_DIR NEW_DIR [--rounds 5] [--layers 4] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import SCRIPTS

from loopback.servers import Nginx

MiB = 1 << 20
FIGURES = ("local_npy_mb_s", "local_raw_mb_s", "remote_cold_mb_s", "remote_warm_mb_s")


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root)}


#: The CLI, run with a checkout first on ``PYTHONPATH`` (``_env``) from that checkout's folder.
CLI = [sys.executable, "-m", "ckptfs.commands.cli"]


def local_bench(root: Path, gguf: Path) -> dict[str, float]:
    """``ckptfs bench`` of the local file with ``root``'s code: the .npy and .raw streams' MB/s."""
    result = subprocess.run([*CLI, "bench", str(gguf), "--json"], env=_env(root), capture_output=True,
                            text=True, timeout=1200, cwd=root)
    if result.returncode != 0:
        raise SystemExit(f"ckptfs bench failed with {root}: {result.stderr.strip()[-400:]}")
    mount = json.loads(result.stdout)["mount"]
    return {"local_npy_mb_s": mount["npy_bytes"] / mount["npy_s"] / 1e6,
            "local_raw_mb_s": mount["raw_bytes"] / mount["raw_s"] / 1e6}


def _read_all(path: Path) -> tuple[int, float]:
    total, start = 0, time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(MiB):
            total += len(chunk)
    return total, time.perf_counter() - start


def remote_streams(root: Path, url: str) -> dict[str, float]:
    """A fresh mount of ``url`` with ``root``'s code: its largest ``.raw`` streamed cold, then warm."""
    mnt = Path(tempfile.mkdtemp(prefix="ckptfs-bench-commits-"))
    result = subprocess.run([*CLI, "mount", url, str(mnt)], env=_env(root), capture_output=True, text=True,
                            timeout=300, cwd=root)
    if result.returncode != 0:
        mnt.rmdir()
        raise SystemExit(f"mount failed with {root}: {result.stderr.strip()[-400:]}")
    try:
        raw = max((p for p in mnt.iterdir() if p.name.endswith(".raw")), key=lambda p: p.stat().st_size)
        cold = _read_all(raw)
        warm = _read_all(raw)
        return {"remote_cold_mb_s": cold[0] / cold[1] / 1e6, "remote_warm_mb_s": warm[0] / warm[1] / 1e6}
    finally:
        subprocess.run([*CLI, "umount", str(mnt)], env=_env(root), capture_output=True, timeout=120,
                       cwd=root)
        mnt.rmdir()


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks commits", description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="checkout of the old commit")
    parser.add_argument("new", type=Path, help="checkout of the new commit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=4, help="layers of the realistic GGUF (make_realistic_gguf)")
    parser.add_argument("--json", type=Path, help="write the rounds and the summary here")
    args = parser.parse_args(argv)
    roots = {"old": args.old.resolve(), "new": args.new.resolve()}
    with tempfile.TemporaryDirectory(prefix="ckptfs-bench-commits-") as tmp:
        www = Path(tmp) / "www"
        www.mkdir()
        gguf = www / "model.gguf"
        subprocess.run([sys.executable, str(SCRIPTS / "make_realistic_gguf.py"), str(gguf), "--layers",
                        str(args.layers), "--no-output"], check=True, capture_output=True, env=_env(roots["new"]))
        rounds: list[dict[str, dict[str, float]]] = []
        with Nginx(www) as server:
            for r in range(args.rounds):
                order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
                row: dict[str, dict[str, float]] = {}
                for which in order:
                    row[which] = {**local_bench(roots[which], gguf),
                                  **remote_streams(roots[which], f"{server.url}/model.gguf")}
                rounds.append(row)
                print(f"round {r + 1}/{args.rounds} ({' then '.join(order)}): " + ", ".join(
                    f"{k} {row['old'][k]:.0f} / {row['new'][k]:.0f}" for k in FIGURES), file=sys.stderr)
    summary = {k: {"old": _spread([row["old"][k] for row in rounds]),
                   "new": _spread([row["new"][k] for row in rounds]),
                   "ratio": _spread([row["new"][k] / row["old"][k] for row in rounds])} for k in FIGURES}
    print(f"{'figure':18} {'old MB/s (min-max)':>22} {'new MB/s (min-max)':>22} {'new/old (min-max)':>20}")
    for k, s in summary.items():
        o, n, q = s["old"], s["new"], s["ratio"]
        print(f"{k:18} {o['median']:8.0f} ({o['min']:.0f}-{o['max']:.0f})"
              f" {n['median']:10.0f} ({n['min']:.0f}-{n['max']:.0f}) {q['median']:9.2f} ({q['min']:.2f}-{q['max']:.2f})")
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "summary": summary, "roots": {k: str(v) for k, v in
                                                                                        roots.items()}}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
