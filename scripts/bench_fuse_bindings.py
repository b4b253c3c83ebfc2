"""Sequential 1 MiB reads of a large NAME.raw through the mount, per binding and libfuse version.

Measures what the binding and libfuse cost on top of the data path (a .raw is a plain pread of the source,
already in the page cache after the first run): MB/s of
  - buffered reads of a freshly mounted file (the kernel turns them into readahead-sized FUSE requests),
  - O_DIRECT reads (every 1 MiB read goes to the daemon; libfuse 2 splits it into 128 KiB requests).
Configurations: mfusepy on libfuse3, mfusepy on libfuse2, fusepy (libfuse2). Besides wall-clock MB/s it
reports the daemon's CPU time per GiB, which is less disturbed by other load on a shared machine; rounds
visit the configurations in rotating order so that drifting background load is spread over all of them.
Results: docs/mount.md ("Bindings").

    python scripts/bench_fuse_bindings.py [--size-mib 256] [--repeat 3]
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

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {
    "mfusepy+libfuse3": {"CKPTFS_FUSE_BINDING": "mfusepy"},
    "mfusepy+libfuse2": {"CKPTFS_FUSE_BINDING": "mfusepy", "FUSE_LIBRARY_NAME": "fuse"},
    "fusepy+libfuse2": {"CKPTFS_FUSE_BINDING": "fusepy"},
}
CHUNK = 1 << 20


def write_safetensors(path: Path, nbytes: int) -> None:
    """One F32 tensor of ``nbytes`` (safetensors layout by hand: 8-byte length, JSON header, data)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [nbytes // 4], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    block = os.urandom(CHUNK)
    with open(path, "wb") as fh:
        fh.write(len(header).to_bytes(8, "little") + header)
        for _ in range(nbytes // CHUNK):
            fh.write(block)


def read_all(path: Path, direct: bool) -> float:
    """Seconds to read the whole file in 1 MiB reads."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        start = time.perf_counter()
        offset = 0
        while True:
            chunk = os.pread(fd, CHUNK, offset)
            if not chunk:
                break
            offset += len(chunk)
        return time.perf_counter() - start
    finally:
        os.close(fd)


def cli(*args: str, env: dict[str, str]) -> None:
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", *args], env=full, check=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(src: Path, workdir: str, env: dict[str, str]) -> dict[str, tuple[float, float]]:
    """kind -> (wall seconds, daemon CPU seconds) for one fresh mount."""
    mnt = Path(tempfile.mkdtemp(dir=workdir))
    cli("mount", str(src), str(mnt), env=env)
    try:
        pid = json.loads(os.getxattr(mnt, "user.ckptfs.stats"))["pid"]
        out = {}
        for kind, direct in (("buffered", False), ("direct", True)):
            cpu = cpu_seconds(pid)
            wall = read_all(mnt / "w.raw", direct=direct)
            out[kind] = (wall, cpu_seconds(pid) - cpu)
        return out
    finally:
        cli("umount", str(mnt), env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    nbytes = args.size_mib * CHUNK
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {
        name: {"buffered": [], "direct": []} for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="ckptfs-bench-") as tmp:
        src = Path(tmp) / "big.safetensors"
        write_safetensors(src, nbytes)
        read_all(src, direct=False)  # the source in the page cache: measure FUSE, not the disk
        names = list(CONFIGS)
        for round_ in range(args.repeat):
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                for kind, sample in measure(src, tmp, CONFIGS[name]).items():
                    samples[name][kind].append(sample)
    results = {}
    for name, kinds in samples.items():
        results[name] = {}
        for kind, values in kinds.items():
            walls = [v[0] for v in values]
            cpu = statistics.median(v[1] for v in values)
            # best: the least disturbed run (the machine's own cost); median: what a user may see
            results[name][kind] = {"MB_per_s_best": round(nbytes / min(walls) / 1e6),
                                   "MB_per_s_median": round(nbytes / statistics.median(walls) / 1e6),
                                   "daemon_cpu_s_per_GiB": round(cpu * (1 << 30) / nbytes, 3)}
        print(f"{name:18s} " + "   ".join(
            f"{kind}: best {r['MB_per_s_best']:5d} median {r['MB_per_s_median']:5d} MB/s, "
            f"daemon CPU {r['daemon_cpu_s_per_GiB']:.2f} s/GiB" for kind, r in results[name].items()), flush=True)
    print(json.dumps({"size_mib": args.size_mib, "repeat": args.repeat, "results": results}))


if __name__ == "__main__":
    main()
