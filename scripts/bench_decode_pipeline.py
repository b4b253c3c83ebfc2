#!/usr/bin/env python3
"""Issue 24's figures: decoded streams against the stored bytes of the same tensors, first touch, random reads.

Each round mounts the checkpoint fresh (``ckptfs mount`` by the real CLI, ``--cache-size``; the daemon runs the
code of ``--tree``, default this repository, so two trees can be compared in one run, rounds interleaved) and
measures, from this process:

- **first touch**: stat + open + one 4 KiB read of the data of files not touched before in that mount (the
  ``.npy`` of every tensor of the sample, big and small: the F32 norms are 1-2.5 KiB), p50 and p99;
- **random 4 KiB reads** of ``token_embd.weight.npy`` (``--random`` page-aligned ``pread``s), p50 and p99;
- **mmap random rows**: ``np.load(mmap_mode="r")`` of the same file, then ``--random`` random rows copied out (each
  a page fault and the kernel's read-around), p50 and p99, as ``ckptfs bench`` does;
- **streams** with 1 MiB reads (``ckptfs bench``'s scan): ``token_embd.weight`` (``.npy`` and ``.raw``), the
  Q5_0/Q4_K/Q6_K tensors of 256 KiB or more stored (``.npy`` and ``.raw``), and every ``.npy`` (against
  gguf-py decoding every tensor in a fresh process, as bench_npy_stream.py does), in alternating order;
- with ``--hf``, a second fresh mount with ``--hf``: ``hf/model.safetensors`` (bfloat16) against the ``.raw``
  of every tensor;
- the daemon's peak RssAnon (itself and its children) over the round.

Usage: python scripts/bench_decode_pipeline.py [CKPT.gguf] [--tree DIR[?K=V,...] ...] [--rounds 5] [--hf]
                                              [--no-reference] [--touch-only] [--json OUT]

``--touch-only`` runs the first mount's figures alone (first read, first touch, random reads, mmap rows).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench_ceiling import DEFAULT_CKPT, ensure_fixture  # noqa: E402  (sibling script)
from bench_npy_stream import gguf_py_fresh  # noqa: E402
from profile_mount import daemon_cpu  # noqa: E402

from ckptfs.bench import Progress, make_plan, scan  # noqa: E402
from ckptfs.bench.harness import AnonMemorySampler, BenchMount  # noqa: E402
from ckptfs.core.options import OpenOptions  # noqa: E402
from ckptfs.util.sizes import parse_size  # noqa: E402
from ckptfs.bench.workloads import PAGE, mmap_rows, random_reads, stat_open_read  # noqa: E402
from ckptfs.checkpoint.api import open as open_checkpoint  # noqa: E402

EMBEDDING = "token_embd.weight"
K_TYPES = ("Q5_0", "Q4_K", "Q6_K")
MIN_STORED = 256 << 10


def mbs(paths: list[str], pid: int | None = None, cpu: dict | None = None, name: str = "") -> float:
    """MB/s of reading ``paths`` with 1 MiB reads; with ``pid``, the daemon's CPU seconds per GiB into
    ``cpu[name]``."""
    before = daemon_cpu(pid) if pid else 0.0
    nbytes, seconds = scan(paths, Progress(1, enabled=False))
    if pid and cpu is not None:
        cpu[name] = (daemon_cpu(pid) - before) / (nbytes / (1 << 30))
    return nbytes / seconds / 1e6


def first_touch(path: str) -> float:
    """stat + open + the first 4 KiB (or the whole file when smaller) + close, in seconds."""
    start = time.perf_counter()
    size = os.stat(path).st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, PAGE, 0)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - start
    if len(data) != min(PAGE, size):
        raise OSError(f"{path}: short read of {len(data)} bytes")
    return elapsed


def pct(values, q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q))


def cli_module(tree: str) -> str:
    """The CLI's module in ``tree``: ``ckptfs.commands.cli`` since the data-plane redesign, ``ckptfs.cli`` before
    (so trees from before it can be compared too)."""
    return "ckptfs.commands.cli" if os.path.exists(os.path.join(tree, "ckptfs", "commands", "cli.py")) else "ckptfs.cli"


@contextmanager
def fresh(src: str, workdir: str, label: str, cache: str, env: dict, extra: list[str] = ()):
    mount = BenchMount(src, workdir, label, OpenOptions(cache_size=parse_size(cache)), env)
    mount._command[2] = cli_module(env["PYTHONPATH"])
    mount._command += list(extra)
    try:
        mount.start()
        yield mount
    finally:
        mount.close()


def one_round(src: str, plan, sizes: dict, tree: str, workdir: str, label: str, cache: str, n_random: int,
              hf: bool, flip: bool, touch_only: bool = False) -> dict:
    path, _, extra = tree.partition("?")  # TREE?K=V,K=V: the daemon's environment gets these too
    env = {"PYTHONPATH": path, **dict(kv.split("=", 1) for kv in extra.split(",") if kv)}
    out: dict = {"load": os.getloadavg()[0]}
    emb = next(f for f in plan.npy if f.tensor == EMBEDDING)
    rng = np.random.default_rng(7)
    with fresh(src, workdir, label + "-touch", cache, env) as mount:
        # as ckptfs bench: listing, then stat + open + a 4 KiB read of the largest .npy (the daemon's first)
        os.listdir(mount.path)
        offset = int(rng.integers(0, emb.nbytes // PAGE)) * PAGE + -(-emb.data_offset // PAGE) * PAGE
        out["first_read_ms"] = stat_open_read(mount.file(emb.file), offset) * 1e3
        # first touch of every other .npy, shuffled (lookup + open + its first 4 KiB)
        files = [f for f in plan.npy if f is not emb]
        rng.shuffle(files)
        touch = {"small": [], "large": []}
        for f in files[:120]:
            touch["small" if f.nbytes < 64 << 10 else "large"].append(first_touch(mount.file(f.file)))
        everything = touch["small"] + touch["large"]
        out["first_touch_ms"] = {"p50": pct(everything, 50), "p99": pct(everything, 99),
                                 "small_p50": pct(touch["small"], 50), "large_p50": pct(touch["large"], 50),
                                 "n": len(everything)}
        offsets = rng.integers(0, emb.nbytes // PAGE - 1, n_random) * PAGE + -(-emb.data_offset // PAGE) * PAGE
        times = random_reads(mount.file(emb.file), offsets)
        out["random_ms"] = {"p50": pct(times, 50), "p99": pct(times, 99)}
        rows = rng.integers(0, emb.shape[0], n_random)
        _, times = mmap_rows(mount.file(emb.file), rows)
        out["mmap_row_ms"] = {"p50": pct(times, 50), "p99": pct(times, 99)}
    if touch_only:
        return out
    k_files = [f for f in plan.npy if f.storage_type in K_TYPES and sizes[f.tensor] >= MIN_STORED]
    out["k_tensors"] = len(k_files)
    with fresh(src, workdir, label + "-streams", cache, env) as mount:
        sampler = AnonMemorySampler(mount.pid)
        streams = [("embedding_npy", [mount.file(emb.file)]),
                   ("embedding_raw", [mount.file(EMBEDDING + ".raw")]),
                   ("k_npy", [mount.file(f.file) for f in k_files]),
                   ("k_raw", [mount.file(f.tensor + ".raw") for f in k_files])]
        if flip:
            streams = [streams[1], streams[0], streams[3], streams[2]]
        out["cpu_s_per_gib"] = {}
        for name, paths in streams:
            out[name] = mbs(paths, mount.pid, out["cpu_s_per_gib"], name)
        out["rss_anon_mib"] = sampler.stop() / (1 << 20)
    with fresh(src, workdir, label + "-all", cache, env) as mount:
        sampler = AnonMemorySampler(mount.pid)
        out["all_npy"] = mbs([mount.file(f.file) for f in plan.npy])
        out["rss_anon_mib"] = max(out["rss_anon_mib"], sampler.stop() / (1 << 20))
        out["cache"] = mount.stats()["cache"]
    if hf:
        with fresh(src, workdir, label + "-hf", cache, env, ["--hf"]) as mount:
            sampler = AnonMemorySampler(mount.pid)
            pair = [("hf_bf16", [mount.file("hf/model.safetensors")]),
                    ("hf_raw", [mount.file(t + ".raw") for t in sizes])]
            for name, paths in (pair[::-1] if flip else pair):
                out[name] = mbs(paths, mount.pid, out["cpu_s_per_gib"], name)
            out["hf_rss_anon_mib"] = sampler.stop() / (1 << 20)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", nargs="?", default=DEFAULT_CKPT)
    parser.add_argument("--tree", action="append",
                        help="a ckptfs source tree for the daemon, TREE or TREE?K=V,K=V with environment "
                             "variables for it (repeatable: the trees' rounds are interleaved)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cache-size", default="64M")
    parser.add_argument("--random", type=int, default=200)
    parser.add_argument("--hf", action="store_true", help="also hf/model.safetensors (needs transformers)")
    parser.add_argument("--no-reference", action="store_true", help="skip gguf-py")
    parser.add_argument("--touch-only", action="store_true",
                        help="only the first mount's figures (first read and touch, random reads, mmap rows)")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    args.ckpt = os.path.abspath(args.ckpt)
    args.json = args.json and os.path.abspath(args.json)
    ensure_fixture(args.ckpt)
    trees = [os.path.abspath(t.partition("?")[0]) + ("?" + t.partition("?")[2] if "?" in t else "")
             for t in (args.tree or [str(REPO)])]
    with open_checkpoint(args.ckpt) as ck:
        plan = make_plan(ck, args.ckpt)
        sizes = {t.name: t.info.stored_nbytes for t in ck.tensors}
    print(f"{args.ckpt}: {plan.tensors} tensors; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}",
          file=sys.stderr, flush=True)
    results: dict = {"checkpoint": args.ckpt, "trees": trees, "rounds": {t: [] for t in trees}, "gguf_py": []}
    with tempfile.TemporaryDirectory(prefix="ckptfs-decode-pipeline-") as workdir:
        # `python -m ckptfs...` puts the working directory before PYTHONPATH: run the daemons from one that
        # holds no ckptfs, or every --tree would run the code of the directory this was started in
        os.chdir(workdir)
        for r in range(args.rounds):
            order = trees if r % 2 == 0 else trees[::-1]
            for i, tree in enumerate(order):
                res = one_round(args.ckpt, plan, sizes, tree, workdir, f"r{r}-{i}", args.cache_size,
                                args.random, args.hf, flip=bool(r % 2), touch_only=args.touch_only)
                results["rounds"][tree].append(res)
                line = (f"round {r + 1} {tree}: first read {res['first_read_ms']:.2f} ms, first touch p50 "
                        f"{res['first_touch_ms']['p50']:.2f} ms (small {res['first_touch_ms']['small_p50']:.2f}, large "
                        f"{res['first_touch_ms']['large_p50']:.2f}), random p50/p99 {res['random_ms']['p50']:.2f}/"
                        f"{res['random_ms']['p99']:.2f} ms, mmap rows p50/p99 {res['mmap_row_ms']['p50']:.2f}/"
                        f"{res['mmap_row_ms']['p99']:.2f} ms; load {res['load']:.2f}")
                if not args.touch_only:
                    line += (f"; emb .npy/.raw {res['embedding_npy']:.0f}/{res['embedding_raw']:.0f} "
                             f"({res['embedding_npy'] / res['embedding_raw']:.2f}x), K {res['k_npy']:.0f}/"
                             f"{res['k_raw']:.0f} ({res['k_npy'] / res['k_raw']:.2f}x), all .npy {res['all_npy']:.0f}; "
                             f"RssAnon {res['rss_anon_mib']:.1f} MiB")
                if args.hf:
                    line += (f"; hf bf16/.raw {res['hf_bf16']:.0f}/{res['hf_raw']:.0f} "
                             f"({res['hf_bf16'] / res['hf_raw']:.2f}x)")
                print(line, file=sys.stderr, flush=True)
            if not args.no_reference and not args.touch_only:
                ref = gguf_py_fresh(args.ckpt)
                results["gguf_py"].append(ref)
                print(f"round {r + 1} gguf-py {ref['mbs']:.0f} MB/s; ratios "
                      + ", ".join(f"{results['rounds'][t][-1]['all_npy'] / ref['mbs']:.2f}" for t in trees),
                      file=sys.stderr, flush=True)
    for tree in trees:
        rs = results["rounds"][tree]

        def rng(key, fmt="{:.2f}", rs=rs):
            vals = [key(x) for x in rs]
            return f"{fmt.format(min(vals))}-{fmt.format(max(vals))} (median {fmt.format(statistics.median(vals))})"

        print(f"{tree}:\n  first read in a fresh daemon ms {rng(lambda x: x['first_read_ms'])}\n"
              f"  first touch p50 ms {rng(lambda x: x['first_touch_ms']['p50'])}, small {rng(lambda x: x['first_touch_ms']['small_p50'])}; "
              f"random p50 {rng(lambda x: x['random_ms']['p50'])}, p99 {rng(lambda x: x['random_ms']['p99'])}\n"
              f"  mmap rows p50 {rng(lambda x: x['mmap_row_ms']['p50'])}, p99 {rng(lambda x: x['mmap_row_ms']['p99'])}",
              file=sys.stderr)
        if not args.touch_only:
            print(f"  emb .npy/.raw {rng(lambda x: x['embedding_npy'] / x['embedding_raw'])}; "
                  f"K .npy/.raw {rng(lambda x: x['k_npy'] / x['k_raw'])}\n"
                  f"  emb .npy MB/s {rng(lambda x: x['embedding_npy'], '{:.0f}')}, .raw {rng(lambda x: x['embedding_raw'], '{:.0f}')}; "
                  f"K .npy {rng(lambda x: x['k_npy'], '{:.0f}')}, .raw {rng(lambda x: x['k_raw'], '{:.0f}')}\n"
                  f"  daemon CPU s/GiB: emb .npy {rng(lambda x: x['cpu_s_per_gib']['embedding_npy'])}, .raw "
                  f"{rng(lambda x: x['cpu_s_per_gib']['embedding_raw'])}; K .npy {rng(lambda x: x['cpu_s_per_gib']['k_npy'])}\n"
                  f"  RssAnon MiB {rng(lambda x: x['rss_anon_mib'], '{:.1f}')}", file=sys.stderr)
        if results["gguf_py"]:
            ratios = [x["all_npy"] / g["mbs"] for x, g in zip(rs, results["gguf_py"])]
            print(f"  .npy stream / gguf-py: {' '.join(f'{v:.2f}' for v in ratios)}", file=sys.stderr)
        if args.hf:
            print(f"  hf bf16/.raw {rng(lambda x: x['hf_bf16'] / x['hf_raw'])}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
