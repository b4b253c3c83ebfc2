"""Benchmark: a whole real-shaped GGUF into float32 CPU torch tensors, ckptfs.load beside the gguf-py path.

Paths, each timed in a fresh subprocess that has already imported torch, numpy, gguf and ckptfs (so every
one starts from the same baseline), one after the other, ``--rounds`` times interleaved; the best time of each
is reported (best-of ratios), and the median of the ratios within each round (steadier on a loaded machine):

  ckptfs           ckptfs.load(path): open, coalesced reads, decoding on every core into the tensors
  ckptfs-bf16      the same into bfloat16 (no whole-tensor float32 copy)
  ckptfs-kernels   the same with the torch kernels on the CPU (the code path CUDA runs); only on request
  gguf-py          GGUFReader(path), then gguf.quants.dequantize + torch.from_numpy per tensor
  gguf-py-decode   the same with the reader already open: its decoding alone

Targets: ckptfs >= 3x gguf-py and >= 2x gguf-py-decode; ckptfs's peak RSS growth over the
baseline (VmHWM after ``clear_refs``, so import peaks do not count) <= 1.2x the output's size.

The checkpoint: ``--shapes SKELETON.json`` (a real GGUF's header skeleton: tensor names, types, gguf_dims)
with every dim scaled by ``--scale`` and capped at ``--max-dim`` (row lengths stay whole blocks); without it,
scripts/make_realistic_gguf.py's Gemma-3-270M Q4_K_M layout with the vocabulary cut to ``--vocab``. Random
but valid block data, written by gguf-py (that script's skeleton reader and writer; tensors only, no
vocabulary).

Usage: python -m benchmarks torch [--shapes S.json --scale 0.125] [--rounds 3] [--modes ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks import child_env, workload

import make_realistic_gguf  # scripts/, on the import path (benchmarks/__init__.py)

MODES = ("ckptfs", "ckptfs-bf16", "ckptfs-kernels", "gguf-py", "gguf-py-decode")
DEFAULT_MODES = ("ckptfs", "ckptfs-bf16", "gguf-py", "gguf-py-decode")   # ckptfs-kernels is slow on a CPU
DEFAULT_OUT = "/tmp/ckptfs-bench/torch-bench.gguf"


# ------------------------------------------------------------------------------------------ the checkpoint


# ------------------------------------------------------------------------------------------ one measurement


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def child(mode: str, path: str) -> dict:
    """Run one mode in this (fresh) process; its time, output size and peak RSS growth."""
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from ckptfs.torchio import api

    reader = GGUFReader(path) if mode == "gguf-py-decode" else None
    base = _status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                           # reset VmHWM to the current RSS
    except OSError:
        pass
    start = time.perf_counter()
    if mode.startswith("ckptfs"):
        dtype = torch.bfloat16 if mode == "ckptfs-bf16" else None
        out = api.load(path, dtype=dtype, use_kernels=True if mode == "ckptfs-kernels" else None)
    else:
        if reader is None:
            reader = GGUFReader(path)
        out = {t.name: torch.from_numpy(np.asarray(dequantize(t.data, t.tensor_type))) for t in reader.tensors}
    seconds = time.perf_counter() - start
    return {"mode": mode, "seconds": seconds, "tensors": len(out),
            "output_bytes": sum(t.numel() * t.element_size() for t in out.values()),
            "float32_bytes": sum(t.numel() * 4 for t in out.values()),
            "rss_growth": _status("VmHWM") - base}


def measure(mode: str, path: str) -> dict:
    proc = subprocess.run(workload("torch", "--child", mode, path), capture_output=True, text=True,
                          env=child_env())
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------ the run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="where the generated GGUF goes")
    parser.add_argument("--shapes", help="a GGUF header skeleton (JSON: tensors with name, type, gguf_dims)")
    parser.add_argument("--scale", type=float, default=0.125)
    parser.add_argument("--max-dim", type=int, default=16384)
    parser.add_argument("--vocab", type=int, default=16384, help="without --shapes: vocabulary rows")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, of {','.join(MODES)}")
    parser.add_argument("--json", help="write the summary here too")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0

    start = time.perf_counter()
    if args.shapes:
        make_realistic_gguf.write_skeleton(args.out, args.shapes, args.scale, args.max_dim, with_metadata=False)
        what = f"{os.path.basename(args.shapes)} dims x{args.scale} (max {args.max_dim})"
    else:
        make_realistic_gguf.write(args.out, 26, args.vocab, False, 0)
        what = f"Gemma-3-270M Q4_K_M layout, vocabulary {args.vocab}"
    print(f"{args.out}: {what}, {os.path.getsize(args.out) / 2**20:.0f} MiB, "
          f"written in {time.perf_counter() - start:.1f} s", file=sys.stderr)

    modes = args.modes.split(",")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes:
            runs[mode].append(measure(mode, args.out))
            print(f"round {r + 1} {mode:15s} {runs[mode][-1]['seconds']:7.2f} s", file=sys.stderr)
    best = {m: min(rs, key=lambda x: x["seconds"]) for m, rs in runs.items()}
    summary = {"file": what, "file_bytes": os.path.getsize(args.out), "cpus": len(os.sched_getaffinity(0)),
               "rounds": args.rounds, "best": best}
    if "ckptfs" in best:
        ours = best["ckptfs"]
        summary["output_bytes"] = ours["output_bytes"]
        summary["rss_growth_over_output"] = ours["rss_growth"] / ours["output_bytes"]
        for other in ("gguf-py", "gguf-py-decode"):
            if other in best:
                summary[f"speedup_vs_{other}"] = best[other]["seconds"] / ours["seconds"]
                # a loaded machine slows whole rounds: the ratio within each round is the steadier figure
                per_round = [b["seconds"] / a["seconds"] for a, b in zip(runs["ckptfs"], runs[other])]
                summary[f"round_speedups_vs_{other}"] = per_round
                summary[f"median_round_speedup_vs_{other}"] = float(np.median(per_round))
    print(f"\n{'mode':15s} {'best s':>8s} {'MB/s out':>9s} {'RSS growth':>11s}")
    for mode, m in best.items():
        print(f"{mode:15s} {m['seconds']:8.2f} {m['float32_bytes'] / 1e6 / m['seconds']:9.0f} "
              f"{m['rss_growth'] / 2**20:8.0f} MiB")
    for key in ("speedup_vs_gguf-py", "median_round_speedup_vs_gguf-py", "speedup_vs_gguf-py-decode",
                "median_round_speedup_vs_gguf-py-decode", "rss_growth_over_output"):
        if key in summary:
            print(f"{key}: {summary[key]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0
