"""What ``--metrics`` costs on the stream benchmark: interleaved pairs of fresh mounts with and without it.

After one warm-up run (the checkpoint into the page cache), each round mounts the checkpoint twice with the
real CLI (``ckptfs mount``, a daemon), once plain and once
with ``--metrics 127.0.0.1:0`` (the order alternates by round, so a drifting machine load hits both alike),
and streams every ``.npy`` with 1 MiB reads, as ``ckptfs bench``'s stream does; while the metrics mount
streams, a scraper thread fetches ``/metrics`` every ``--scrape-interval`` seconds (Prometheus' usual
15 s is far sparser; the default 1 s is a harsher load). Reported: the median MB/s of each configuration,
the median of the per-round ratios, and the cost (1 - ratio); and the daemon's CPU time per GB streamed
(/proc/PID/stat, all threads), a second view of the same cost. Exit 1 if the
throughput cost exceeds ``--max-cost``. ``--scrape-interval 0``: no scraping (the exporter idle).

Usage: python -m benchmarks metrics CKPT [--rounds 5] [--cache-size 64M] [--scrape-interval 1]
       (CKPT: e.g. python scripts/make_realistic_gguf.py /tmp/r.gguf --layers 8)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import ckptfs
from ckptfs.bench import Progress, make_plan, scan
from ckptfs.service.mountpoint import unmount
from ckptfs.fuse.operations import STATS_XATTR
from ckptfs.util.sizes import parse_size


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stream(src: str, mountpoint: str, cache_size: int, metrics: bool, files: list[str],
           scrape_interval: float) -> tuple[float, float, int]:
    """One fresh mount, every file streamed: (MB/s, daemon CPU seconds per GB, scrapes made)."""
    command = [sys.executable, "-m", "ckptfs.commands.cli", "mount", src, mountpoint, "--cache-size", str(cache_size)]
    if metrics:
        command += ["--metrics", "127.0.0.1:0"]
    subprocess.run(command, check=True, stdin=subprocess.DEVNULL, timeout=120)
    stop = threading.Event()
    scrapes = [0]
    try:
        stats = json.loads(os.getxattr(mountpoint, STATS_XATTR))
        scraper = None
        cpu_before = cpu_seconds(stats["pid"])
        if metrics and scrape_interval > 0:
            url = f"http://{stats['metrics']}/metrics"

            def scrape() -> None:
                while not stop.wait(scrape_interval):
                    with urllib.request.urlopen(url, timeout=10) as response:
                        response.read()
                    scrapes[0] += 1

            scraper = threading.Thread(target=scrape, daemon=True)
            scraper.start()
        nbytes, seconds = scan([os.path.join(mountpoint, f) for f in files], Progress(1, False))
        stop.set()
        if scraper is not None:
            scraper.join()
        cpu = cpu_seconds(stats["pid"]) - cpu_before
        return nbytes / seconds / 1e6, cpu / (nbytes / 1e9), scrapes[0]
    finally:
        stop.set()
        unmount(mountpoint)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.ismount(mountpoint):
            time.sleep(0.05)


def per_request_overhead(src: str, repeats: int = 15, calls: int = 5000) -> dict[str, tuple[float, float]]:
    """In-process, no FUSE: microseconds a --metrics daemon adds to one request (``getattr``, and a 128 KiB
    ``read`` of a cached .npy): the fastest of interleaved timings of the same callbacks with and without
    (on a loaded machine the fastest run is the one least disturbed). Read-ahead is off, so no background
    decoding runs during the timings."""
    import time

    from ckptfs.fuse.counters import MountCounters
    from ckptfs.fuse.operations import CkptOperations
    from ckptfs.tree.mount_tree import MountTree

    saved = os.environ.get("CKPTFS_DECODE_AHEAD")
    os.environ["CKPTFS_DECODE_AHEAD"] = "0"
    try:
        with ckptfs.open(src) as ck:
            path = "/" + make_plan(ck, src).largest.file
            tree = MountTree(ck)
            both = {timed: CkptOperations(tree, counters=MountCounters(timed=timed)) for timed in (False, True)}
            handles = {timed: ops.open(path, os.O_RDONLY) for timed, ops in both.items()}
            for timed, ops in both.items():
                ops.read(path, 1 << 17, 0, handles[timed])  # the group is cached from here on
            times: dict[tuple[str, bool], list[float]] = {}
            for r in range(repeats):
                for timed in ((False, True) if r % 2 == 0 else (True, False)):
                    ops = both[timed]
                    start = time.perf_counter()
                    for _ in range(calls):
                        ops.getattr(path)
                    times.setdefault(("getattr", timed), []).append((time.perf_counter() - start) / calls)
                    start = time.perf_counter()
                    for _ in range(calls // 10):
                        ops.read(path, 1 << 17, 0, handles[timed])
                    times.setdefault(("read", timed), []).append((time.perf_counter() - start) / (calls // 10))
            for timed, ops in both.items():
                ops.release(path, handles[timed])
    finally:
        if saved is None:
            os.environ.pop("CKPTFS_DECODE_AHEAD", None)
        else:
            os.environ["CKPTFS_DECODE_AHEAD"] = saved
    out = {}
    for op in ("getattr", "read"):
        plain, timed = min(times[(op, False)]), min(times[(op, True)])
        out[op] = (plain * 1e6, (timed - plain) * 1e6)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cache-size", default="64M")
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--max-cost", type=float, default=0.05)
    args = parser.parse_args(argv)
    with ckptfs.open(args.src) as ck:
        plan = make_plan(ck, args.src)
    files = [f.file for f in plan.npy]
    cache_size = parse_size(args.cache_size)
    workdir = tempfile.mkdtemp(prefix="ckptfs-bench-metrics-")
    mountpoint = os.path.join(workdir, "mnt")
    os.mkdir(mountpoint)
    plain, with_metrics, ratios, cpu_ratios, scrapes = [], [], [], [], 0
    try:
        stream(args.src, mountpoint, cache_size, False, files, args.scrape_interval)  # warm-up: page cache
        for round_ in range(args.rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            result, cpu = {}, {}
            for metrics in order:
                result[metrics], cpu[metrics], n = stream(args.src, mountpoint, cache_size, metrics, files,
                                                          args.scrape_interval)
                scrapes += n
            plain.append(result[False])
            with_metrics.append(result[True])
            ratios.append(result[True] / result[False])
            cpu_ratios.append(cpu[True] / cpu[False])
            print(f"round {round_ + 1}: plain {result[False]:.0f} MB/s {cpu[False]:.2f} CPU s/GB, --metrics "
                  f"{result[True]:.0f} MB/s {cpu[True]:.2f} CPU s/GB; ratio {ratios[-1]:.3f}, CPU ratio "
                  f"{cpu_ratios[-1]:.3f}", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    cost = 1 - statistics.median(ratios)
    print(f"{len(files)} .npy files ({plan.format}), cache {args.cache_size}, {args.rounds} interleaved pairs, "
          f"{scrapes} scrapes at {args.scrape_interval:g} s, load {os.getloadavg()[0]:.1f}")
    print(f"plain     median {statistics.median(plain):7.0f} MB/s  (runs: {', '.join(f'{v:.0f}' for v in plain)})")
    print(f"--metrics median {statistics.median(with_metrics):7.0f} MB/s  "
          f"(runs: {', '.join(f'{v:.0f}' for v in with_metrics)})")
    print(f"median per-pair ratio {statistics.median(ratios):.3f}  (ratios: {', '.join(f'{r:.3f}' for r in ratios)}); "
          f"cost {100 * cost:+.1f}% (target <= {100 * args.max_cost:.0f}%)")
    for op, (plain_us, added_us) in per_request_overhead(args.src).items():
        print(f"in-process {op}: {plain_us:.1f} us per call (fastest run), --metrics adds {added_us:+.2f} us")
    print(f"daemon CPU per GB, median per-pair ratio --metrics/plain {statistics.median(cpu_ratios):.3f}  "
          f"(ratios: {', '.join(f'{r:.3f}' for r in cpu_ratios)})")
    return 0 if cost <= args.max_cost else 1
