"""Scale benchmark: a ~94,000-tensor safetensors file, ckptfs beside safetensors' own ``safe_open``.

The file is ``make_scale_safetensors``'s; both sides are measured side by side in one run.

Figures (each in a fresh process, imports before the clock; medians of --runs):
- ``safe_open``: safetensors opening the file and listing its keys (the floor);
- ``ckptfs.open``: the library API opening the file (header parsed, descriptors built);
- mount + first listing: ``ckptfs mount`` (daemon ready) then ``os.listdir`` of the mount;
- repeated listing: another ``os.listdir`` of the same mount (the kernel's readdir cache, or the daemon);
- the daemon's RssAnon after the listings.

Usage: python -m benchmarks scale [FILE] [--runs 3] [--json OUT]
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

from benchmarks import REPO as ROOT
from benchmarks import make_scale_safetensors

SAFE_OPEN = """
import sys, time
from safetensors import safe_open
t = time.perf_counter()
with safe_open(sys.argv[1], "np") as f:
    n = len(list(f.keys()))
print(time.perf_counter() - t)
"""

CKPTFS_OPEN = """
import sys, time
import ckptfs
t = time.perf_counter()
ck = ckptfs.open(sys.argv[1]); n = len(ck.tensors)
print(time.perf_counter() - t)
"""


def _timed(code: str, path: str) -> float:
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return float(out.stdout.strip().splitlines()[-1])


def _mount_and_list(path: str) -> dict:
    from ckptfs.util.procinfo import rss_anon

    mnt = tempfile.mkdtemp(prefix="ckptfs-scale-")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", "mount", path, mnt], check=True, env=env,
                   stdin=subprocess.DEVNULL)
    names = os.listdir(mnt)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    again = len(os.listdir(mnt))
    repeat = time.perf_counter() - t1
    stats = json.loads(os.getxattr(mnt, "user.ckptfs.stats"))
    rss = rss_anon(stats["pid"])
    subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", "umount", mnt], check=True, env=env)
    os.rmdir(mnt)
    assert again == len(names)
    return {"mount_and_first_listing_s": first, "repeated_listing_s": repeat, "names": len(names),
            "daemon_rss_anon_mib": rss / 2**20 if rss else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", default="/tmp/ckptfs-bench/scale.safetensors")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if not os.path.exists(args.file):
        make_scale_safetensors.write(args.file, make_scale_safetensors.model_tensors())
    safe = [_timed(SAFE_OPEN, args.file) for _ in range(args.runs)]
    api = [_timed(CKPTFS_OPEN, args.file) for _ in range(args.runs)]
    mounts = [_mount_and_list(args.file) for _ in range(args.runs)]
    med = statistics.median
    result = {
        "safe_open_s": med(safe), "ckptfs_open_s": med(api),
        "mount_and_first_listing_s": med(m["mount_and_first_listing_s"] for m in mounts),
        "repeated_listing_s": med(m["repeated_listing_s"] for m in mounts),
        "daemon_rss_anon_mib": med(m["daemon_rss_anon_mib"] or 0 for m in mounts),
        "names": mounts[0]["names"],
    }
    result["open_vs_safe_open"] = result["ckptfs_open_s"] / result["safe_open_s"]
    result["mount_listing_vs_safe_open"] = result["mount_and_first_listing_s"] / result["safe_open_s"]
    result["repeat_listing_vs_safe_open"] = result["repeated_listing_s"] / result["safe_open_s"]
    targets = {"open_vs_safe_open": 2.0, "mount_listing_vs_safe_open": 5.0, "repeat_listing_vs_safe_open": 1.0}
    for key, value in result.items():
        mark = ""
        if key in targets:
            mark = f"   (target <= {targets[key]}x: {'met' if value <= targets[key] else 'NOT MET'})"
        if key == "daemon_rss_anon_mib":
            mark = f"   (target <= 150 MiB: {'met' if value <= 150 else 'NOT MET'})"
        print(f"{key:32s} {value:10.3f}{mark}" if isinstance(value, float) else f"{key:32s} {value:>10}{mark}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0
