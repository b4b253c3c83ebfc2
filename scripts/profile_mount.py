#!/usr/bin/env python3
"""Stream files through a fresh ckptfs mount under several daemon settings, interleaved, and optionally
profile the daemon with py-spy: how docs/performance.md separates the effect of each read-path change.

Each configuration is a set of environment variables for the daemon (``CKPTFS_PREFETCH=0``,
``CKPTFS_READAHEAD_KB=0``, ``CKPTFS_NO_NATIVE=1``, ``MALLOC_ARENA_MAX=8``, ...). For every round, every
configuration gets a fresh daemon (``ckptfs mount`` by the real CLI, as ``ckptfs bench`` does) that
streams the chosen files with 1 MiB reads while its RssAnon is sampled; rounds interleave the
configurations so that the load of a shared machine drifts over all of them alike. Reported per
configuration: the median MB/s over rounds, the peak RssAnon, and the daemon's cache counters.

With ``--py-spy OUT`` (``pip install py-spy``) the daemon of the first configuration in the first round is
sampled while streaming (all threads, 250 Hz); the raw profile is written to OUT and the frames with the
most samples (self and inclusive, idle waits excluded) are printed.

Usage: python scripts/profile_mount.py CKPT [--config NAME:K=V,K=V ...] [--match .npy] [--rounds 3]
                                       [--cache-size 64M] [--py-spy OUT]
Example: --config default: --config no-prefetch:CKPTFS_PREFETCH=0 --config ra128:CKPTFS_READAHEAD_KB=0
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_npy_stream import daemon_counters  # noqa: E402  (sibling script)

import ckptfs  # noqa: E402
from ckptfs.bench import AnonMemorySampler, Progress, bench_mount, make_plan, scan
from ckptfs.util.sizes import format_size, parse_size


def parse_config(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition(":")
    env = dict(item.split("=", 1) for item in assignments.split(",") if item)
    return name or "default", env


def stream_once(src: str, files: list[str], workdir: str, label: str, cache_size: int, env: dict[str, str],
                profile_out: str | None) -> dict:
    with bench_mount(src, workdir, label, cache_size, env) as mount:
        spy = None
        if profile_out:
            spy = subprocess.Popen(["py-spy", "record", "-p", str(mount.pid), "-o", profile_out, "--format", "raw",
                                    "-r", "250", "--nonblocking"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        sampler = AnonMemorySampler(mount.pid)
        cpu_before = daemon_cpu(mount.pid)
        try:
            nbytes, seconds = scan([mount.file(f) for f in files], Progress(1, False))
        finally:
            peak = sampler.stop()
            if spy is not None:
                spy.send_signal(2)  # py-spy writes its profile on SIGINT
                spy.wait(timeout=60)
        return {"mbs": nbytes / seconds / 1e6, "peak": peak, "cache": mount.stats()["cache"],
                "cpu_s_per_gib": (daemon_cpu(mount.pid) - cpu_before) / (nbytes / (1 << 30))}


def daemon_cpu(pid: int) -> float:
    """CPU seconds (user + system) of every thread of ``pid`` so far."""
    counters = daemon_counters(pid)
    return counters["user_s"] + counters["system_s"]


def top_frames(path: str, n: int = 15) -> str:
    """The busiest frames of a py-spy raw profile (idle FUSE loop and thread waits left out)."""
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rpartition(" ")
            frames = [frame for frame in stack.split(";") if frame]
            if not frames or any("FUSE.__init__" in frame for frame in frames) or "wait (threading" in frames[-1]:
                continue
            total += int(count)
            own[frames[-1]] += int(count)
            for frame in set(frames):
                inclusive[frame] += int(count)
    lines = [f"busy samples: {total}", "self:"]
    lines += [f"  {100 * c / total:5.1f}%  {frame}" for frame, c in own.most_common(n)]
    lines += ["inclusive:"] + [f"  {100 * c / total:5.1f}%  {frame}" for frame, c in inclusive.most_common(n)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("--config", action="append", default=[], help="NAME:K=V,K=V (repeatable)")
    parser.add_argument("--match", default=".npy", help="stream the files whose name contains this")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache-size", default="64M")
    parser.add_argument("--py-spy", dest="py_spy", default=None, metavar="OUT")
    args = parser.parse_args(argv)
    args.src = os.path.abspath(args.src)
    args.py_spy = args.py_spy and os.path.abspath(args.py_spy)
    configs = [parse_config(c) for c in args.config] or [("default", {})]
    cache_size = parse_size(args.cache_size)
    with ckptfs.open(args.src) as ck:
        plan = make_plan(ck, args.src)
    files = [f for f in [*(f.file for f in plan.npy), *plan.raw] if args.match in f]
    if args.py_spy and shutil.which("py-spy") is None:
        parser.error("py-spy is not installed (pip install py-spy)")
    results: dict[str, list[dict]] = {name: [] for name, _ in configs}
    workdir = tempfile.mkdtemp(prefix="ckptfs-profile-")
    # `python -m ckptfs...` puts the working directory before PYTHONPATH: a --config PYTHONPATH=TREE would
    # otherwise run the code of the directory this was started in
    os.chdir(workdir)
    try:
        for round_ in range(args.rounds):
            for i, (name, env) in enumerate(configs):
                profile = args.py_spy if (args.py_spy and round_ == 0 and i == 0) else None
                results[name].append(stream_once(args.src, files, workdir, f"{name}-{round_}", cache_size, env,
                                                 profile))
                print(f"round {round_ + 1} {name}: {results[name][-1]['mbs']:.0f} MB/s", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{len(files)} files matching {args.match!r}, cache {format_size(cache_size)}, load {os.getloadavg()[0]:.1f}")
    for name, env in configs:
        runs = results[name]
        mbs = statistics.median(r["mbs"] for r in runs)
        peak = max(r["peak"] for r in runs)
        cache = runs[-1]["cache"]
        each = ", ".join(f"{r['mbs']:.0f}" for r in runs)
        cpu = statistics.median(r["cpu_s_per_gib"] for r in runs)
        print(f"{name:<16} {mbs:7.0f} MB/s  (runs: {each})  daemon CPU {cpu:.2f} s/GiB  "
              f"peak RssAnon {format_size(peak)}  hits {cache['hits']} misses {cache['misses']}  env {env}")
    if args.py_spy:
        print(top_frames(args.py_spy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
