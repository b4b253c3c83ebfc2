#!/usr/bin/env python3
"""The ``.npy`` stream of a real-shaped GGUF beside gguf-py's in-process dequantization, quiet and under load.

Issue 18's stream target: every ``.npy`` of a real-shaped Q4_K_M GGUF (default: the Gemma 3 270M skeleton in
scripts/real-shapes/, full size, generated once by make_realistic_gguf.py) read through a fresh ``ckptfs
mount`` with 1 MiB reads (``ckptfs bench``'s scan), at least 2x the MB/s of gguf-py decoding every tensor
in-process (``gguf.quants.dequantize`` of every tensor, decode time only, as ``ckptfs bench`` measures it,
in a fresh process per round that opened the file untimed: what a user's process that decodes the file
once gets; ``--reference-warm`` decodes in this long-lived process instead, whose allocator and mapping
are warm after the first round: gguf-py's best case) — in each of ``--rounds`` interleaved rounds, not only
the best. Then the same rounds with one other busy process on the machine (``yes > /dev/null``, started and
stopped here).

Besides MB/s, each stream records what the daemon did: its CPU seconds (user, system), context switches of
all its threads (voluntary: it waited; involuntary: the scheduler took the CPU away), and its block cache's
hits and misses (a miss is a decode on a FUSE thread, in the reader's way; a hit was decoded ahead by the
read-ahead worker). With ``--profile DIR`` one extra stream per phase runs under py-spy (``pip install
py-spy``), and its samples are summarized per thread kind and per function.

Usage: python scripts/bench_npy_stream.py [CKPT.gguf] [--rounds 5] [--phases quiet,busy] [--profile DIR]
                                          [--reference-warm] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench_ceiling import DEFAULT_CKPT, ensure_fixture  # noqa: E402  (sibling script)

from ckptfs.bench import Progress, bench_mount, make_plan, scan  # noqa: E402
from ckptfs.checkpoint.api import open as open_checkpoint  # noqa: E402

CACHE_SIZE = 512 << 20


def daemon_counters(pid: int) -> dict[str, float]:
    """CPU seconds and context switches of every thread of ``pid`` so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    out = {"user_s": int(fields[11]) / ticks, "system_s": int(fields[12]) / ticks, "voluntary": 0, "involuntary": 0}
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(status) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        out["voluntary"] += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        out["involuntary"] += int(line.split()[1])
        except OSError:  # a thread that ended meanwhile
            pass
    return out


def ckptfs_stream(src: str, plan, workdir: str, label: str, profile_to: str | None = None) -> dict:
    """Every .npy through a fresh mount: MB/s and what the daemon did meanwhile."""
    with bench_mount(src, workdir, label, CACHE_SIZE) as mount:
        spy = None
        if profile_to:
            spy = subprocess.Popen(["py-spy", "record", "-p", str(mount.pid), "-r", "500", "-f", "raw", "--threads",
                                    "-o", profile_to], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attached
        before = daemon_counters(mount.pid)
        nbytes, seconds = scan([mount.file(f.file) for f in plan.npy], Progress(1, enabled=False))
        after = daemon_counters(mount.pid)
        cache = mount.stats()["cache"]
        if spy is not None:
            spy.send_signal(2)  # SIGINT: py-spy writes its file and exits
            spy.wait(timeout=60)
    return {"mbs": nbytes / seconds / 1e6, "seconds": seconds, "bytes": nbytes, "load": os.getloadavg()[0],
            "cache_hits": cache.get("hits"), "cache_misses": cache.get("misses"),
            **{k: after[k] - before[k] for k in before}}


def gguf_py_decode(reader, dequantize) -> dict:
    """gguf-py decoding every tensor in-process: decode seconds summed (``ckptfs bench``'s definition)."""
    total, seconds = 0, 0.0
    for t in reader.tensors:
        start = time.perf_counter()
        values = dequantize(t.data, t.tensor_type)
        seconds += time.perf_counter() - start
        total += values.nbytes
        del values
    return {"mbs": total / seconds / 1e6, "seconds": seconds, "bytes": total, "load": os.getloadavg()[0]}


def gguf_py_fresh(src: str) -> dict:
    """:func:`gguf_py_decode` in a new process (the reader opened there, untimed)."""
    proc = subprocess.run([sys.executable, __file__, src, "--child-decode"], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"gguf-py in a fresh process failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


IDLE_LEAVES = ("sigwait", "FUSE.__init__", "_worker")  # the signal thread, libfuse's main loop, an idle worker


def summarize_profile(path: str) -> dict:
    """py-spy's raw (collapsed) samples: those of threads at work (idle leaves left out: the signal thread,
    libfuse's main loop, an idle worker), per thread kind and per function where the sample was taken (self
    time; ``Condition.wait`` in a FUSE read is waiting for a group that the read-ahead worker is decoding;
    "libfuse" is a libfuse thread outside our callbacks: reading requests, writing replies)."""
    threads, leaves, busy, total = collections.Counter(), collections.Counter(), 0, 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            frames, n = stack.split(";"), int(count)
            total += n
            leaf = frames[-1].split(" (")[0]
            leaf = "libfuse" if leaf == "thread" else leaf
            if leaf.startswith(IDLE_LEAVES):
                continue
            busy += n
            kind = ("prefetch worker" if "Prefetcher._run" in stack else "FUSE read" if "FUSE" in stack and
                    ".read" in stack else "FUSE other" if "FUSE._wrapper" in stack else
                    "libfuse" if leaf == "libfuse" else "other")
            threads[kind] += n
            leaves[leaf] += n
    return {"samples": total, "busy_samples": busy, "threads": dict(threads.most_common()),
            "self": dict(leaves.most_common(15))}


def run_phase(phase: str, src: str, plan, reference, rounds: int, workdir: str, profile_dir: str | None) -> dict:
    burner = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) if phase == "busy" else None
    try:
        time.sleep(0.5 if burner else 0)
        ours, theirs = [], []
        for r in range(rounds):
            order = ("ckptfs", "gguf-py") if r % 2 == 0 else ("gguf-py", "ckptfs")
            for who in order:
                if who == "ckptfs":
                    ours.append(ckptfs_stream(src, plan, workdir, f"{phase}-{r}"))
                else:
                    theirs.append(reference())
            print(f"{phase} round {r + 1}: .npy stream {ours[-1]['mbs']:6.0f} MB/s, gguf-py {theirs[-1]['mbs']:6.0f} "
                  f"MB/s, ratio {ours[-1]['mbs'] / theirs[-1]['mbs']:.2f}; daemon CPU "
                  f"{ours[-1]['user_s'] + ours[-1]['system_s']:.2f} s, ctx switches {ours[-1]['voluntary']} vol / "
                  f"{ours[-1]['involuntary']} invol, cache misses {ours[-1]['cache_misses']} hits "
                  f"{ours[-1]['cache_hits']}; load {ours[-1]['load']:.2f}", file=sys.stderr, flush=True)
        result = {"ckptfs": ours, "gguf_py": theirs, "ratios": [a["mbs"] / b["mbs"] for a, b in zip(ours, theirs)]}
        if profile_dir:
            out = os.path.join(profile_dir, f"daemon-{phase}.txt")
            result["profiled_stream"] = ckptfs_stream(src, plan, workdir, f"{phase}-profile", out)
            result["profile"] = summarize_profile(out)
        return result
    finally:
        if burner is not None:
            burner.terminate()
            burner.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", nargs="?", default=DEFAULT_CKPT)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--phases", default="quiet,busy")
    parser.add_argument("--profile", metavar="DIR", help="profile one extra stream per phase with py-spy")
    parser.add_argument("--reference-warm", action="store_true",
                        help="decode with gguf-py in this process, warm after the first round (its best case)")
    parser.add_argument("--child-decode", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    import gguf
    from gguf.quants import dequantize

    if args.child_decode:
        print(json.dumps(gguf_py_decode(gguf.GGUFReader(args.ckpt), dequantize)))
        return 0

    ensure_fixture(args.ckpt)
    if args.profile:
        if shutil.which("py-spy") is None:
            raise SystemExit("--profile needs py-spy on PATH: pip install py-spy")
        os.makedirs(args.profile, exist_ok=True)
    with open_checkpoint(args.ckpt) as ck:
        plan = make_plan(ck, args.ckpt)
    if args.reference_warm:
        start = time.perf_counter()
        reader = gguf.GGUFReader(args.ckpt)
        print(f"GGUFReader open {time.perf_counter() - start:.1f} s", file=sys.stderr)

        def reference() -> dict:
            return gguf_py_decode(reader, dequantize)
    else:
        def reference() -> dict:
            return gguf_py_fresh(args.ckpt)
    print(f"{args.ckpt}: {plan.tensors} tensors; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}",
          file=sys.stderr, flush=True)
    results = {"checkpoint": args.ckpt, "tensors": plan.tensors, "cpus": os.cpu_count(),
               "reference": "warm" if args.reference_warm else "fresh process per round", "phases": {}}
    with tempfile.TemporaryDirectory(prefix="ckptfs-npy-stream-") as workdir:
        for phase in args.phases.split(","):
            results["phases"][phase] = run_phase(phase, args.ckpt, plan, reference, args.rounds, workdir,
                                                 args.profile)
    for phase, r in results["phases"].items():
        ratios = r["ratios"]
        print(f"{phase}: ratios {' '.join(f'{x:.2f}' for x in ratios)} (min {min(ratios):.2f}, median "
              f"{statistics.median(ratios):.2f}); .npy median {statistics.median(x['mbs'] for x in r['ckptfs']):.0f} "
              f"MB/s, gguf-py median {statistics.median(x['mbs'] for x in r['gguf_py']):.0f} MB/s; "
              f"2x in every round: {'met' if min(ratios) >= 2 else 'NOT MET'}")
        if "profile" in r:
            p = r["profile"]
            print(f"  profile ({p['busy_samples']} of {p['samples']} samples at work, 500 Hz): {p['threads']}\n"
                  f"  self: {p['self']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
