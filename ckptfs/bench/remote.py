"""``ckptfs bench URL``: what reading a remote checkpoint through a mount costs, beside the same file local.

The URL (and, with ``--local PATH``, a local copy of the same checkpoint) is mounted by the real CLI on a
temporary mountpoint that is always unmounted; the workloads run from this process, as a user's tools would:

- mount + listing (``ckptfs mount`` until ready, then ``os.listdir``): seconds, and the requests and bytes
  the daemon's ``source`` counters (``user.ckptfs.stats``) show afterwards — the header fetch;
- the header's size (the first tensor's offset), for comparing bytes fetched with it;
- the cold first read: open + the first 4 KiB of a middle-sized ``.npy`` on the fresh mount;
- one random 4 KiB read in the middle of the largest ``.npy``: seconds, requests, bytes fetched for it;
- streaming every ``.npy`` with 1 MiB reads: MB/s of ``.npy`` bytes, requests, bytes fetched.

The remote and local mounts run one after the other in the same run, so the ratios are what matters on a
shared machine. ``python -m benchmarks remote`` runs this against a loopback nginx and adds the server's own
counts from its access log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ckptfs.core.options import OpenOptions
from ckptfs.util.redact import public_name

MiB = 1 << 20
READ = MiB
STATS_XATTR = "user.ckptfs.stats"  # as ckptfs.fuse.operations serves it (not imported: it pulls in the mount)


class BenchMount:
    """One mount through the CLI, timed from the command to a listing; unmounted by ``close``."""

    def __init__(self, src: str, options: OpenOptions = OpenOptions()):
        self.mnt = Path(tempfile.mkdtemp(prefix="ckptfs-bench-remote-"))
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", "mount", src, str(self.mnt),
                                 *options.as_flags()],
                                capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            os.rmdir(self.mnt)
            raise OSError(f"mount of {public_name(src)} failed: {result.stderr.strip()}")
        self.names = sorted(os.listdir(self.mnt))
        self.seconds = time.perf_counter() - start

    def source_counters(self) -> dict:
        return json.loads(os.getxattr(str(self.mnt), STATS_XATTR)).get("source", {})

    def npy_sizes(self) -> dict[str, int]:
        return {n: os.path.getsize(self.mnt / n) for n in self.names if n.endswith(".npy")}

    def close(self) -> None:
        subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", "umount", str(self.mnt)], capture_output=True,
                       timeout=120)
        shutil.rmtree(self.mnt, ignore_errors=True)

    def __enter__(self) -> BenchMount:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def timed_read(path: Path, offset: int, size: int = 4096) -> float:
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        fh.seek(offset)
        fh.read(size)
    return time.perf_counter() - start


def stream(mnt: Path, names: list[str]) -> tuple[int, float]:
    total, start = 0, time.perf_counter()
    for name in names:
        with open(mnt / name, "rb", buffering=0) as fh:
            while chunk := fh.read(READ):
                total += len(chunk)
    return total, time.perf_counter() - start


def header_bytes(src: str) -> int | None:
    from ckptfs import open as open_checkpoint

    with open_checkpoint(src) as ck:
        offsets = [t.info.offset for t in ck.tensors if t.info.source == ck.files[0]]
        return min(offsets) if offsets else None


def _delta(after: dict, before: dict) -> dict:
    return {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in ("requests", "bytes", "retries")}


def measure(src: str, options: OpenOptions = OpenOptions()) -> dict:
    """Every workload on one mount of ``src`` (see the module docstring)."""
    out: dict = {"src": public_name(src)}  # the output is shared: no URL credentials
    with BenchMount(src, options) as m:
        counters = m.source_counters()
        out["mount_list_s"] = round(m.seconds, 4)
        out["mount_list"] = _delta(counters, {})
        sizes = m.npy_sizes()
        if not sizes:
            return out
        by_size = sorted(sizes, key=sizes.__getitem__)
        other, largest = by_size[len(by_size) // 2], by_size[-1]
        before = m.source_counters()
        out["cold_first_read"] = {"file": other, "seconds": round(timed_read(m.mnt / other, 0), 4)}
        middle = sizes[largest] // 2 // 4096 * 4096
        before = m.source_counters()
        seconds = timed_read(m.mnt / largest, middle)
        out["random_4k"] = {"file": largest, "seconds": round(seconds, 4), **_delta(m.source_counters(), before)}
        before = m.source_counters()
        nbytes, seconds = stream(m.mnt, by_size)
        out["stream"] = {"npy_bytes": nbytes, "seconds": round(seconds, 3), "MBps": round(nbytes / seconds / 1e6, 1),
                         **_delta(m.source_counters(), before)}
    return out


def run_remote_bench(src: str, local: str | None = None, as_json: bool = False,
                     options: OpenOptions = OpenOptions()) -> int:
    results: dict = {"checkpoint": public_name(src), "machine": f"{os.cpu_count()} cores", "header_bytes": header_bytes(src),
                     "remote": measure(src, options)}
    if local is not None:
        results["local"] = measure(local)
        r, loc = results["remote"], results["local"]
        if "stream" in r and "stream" in loc:
            results["stream_ratio"] = round(r["stream"]["MBps"] / loc["stream"]["MBps"], 3)
        results["mount_ratio"] = round(r["mount_list_s"] / loc["mount_list_s"], 2)
    if as_json:
        print(json.dumps(results, indent=2))
    else:
        print(render(results))
    return 0


def render(results: dict) -> str:
    def side(fmt) -> str:
        remote = fmt(results["remote"])
        local = fmt(results["local"]) if "local" in results else None
        return remote + (f"   (local: {local})" if local is not None else "")

    header = results.get("header_bytes")
    lines = [f"checkpoint: {results['checkpoint']}  ({results['machine']})",
             f"header: {header / MiB:.2f} MiB" if header else "header: -",
             "mount + listing: " + side(lambda r: f"{r['mount_list_s']:.2f} s, {r['mount_list']['requests']} "
                                                          f"requests, {r['mount_list']['bytes'] / MiB:.2f} MiB fetched")]
    if "cold_first_read" in results["remote"]:
        lines += [
            "cold first read (open + 4 KiB): " + side(lambda r: f"{r['cold_first_read']['seconds'] * 1e3:.1f} ms"),
            "random 4 KiB of the largest .npy: " + side(lambda r: f"{r['random_4k']['seconds'] * 1e3:.1f} ms, "
                                                                          f"{r['random_4k']['requests']} requests, "
                                                                          f"{r['random_4k']['bytes'] / 1024:.0f} KiB"),
            "stream every .npy: " + side(lambda r: f"{r['stream']['MBps']} MB/s, {r['stream']['requests']} "
                                                            f"requests, {r['stream']['bytes'] / MiB:.0f} MiB fetched"),
        ]
    if "stream_ratio" in results:
        lines.append(f"remote/local: stream {results['stream_ratio']}, mount + listing {results['mount_ratio']}x")
    return "\n".join(lines)
