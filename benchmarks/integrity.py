"""Manifest and verify throughput against plain ``hashlib.sha256`` over the same bytes, side by side.

    python -m benchmarks integrity [FILE] [--size-mib 384] [--rounds 3] [--json]

Without FILE, a safetensors file of ``--size-mib`` MiB is generated (a mix like a real model's: large
matrices, middle-sized ones and many small norm vectors, random bytes) in a temporary folder. The file is
read once to warm the page cache; then, in rounds, interleaved in one process:

- ``sha256``: ``hashlib.sha256`` over the file read in 8 MiB pieces (the baseline: one hash, one thread);
- ``manifest``: what ``ckptfs manifest`` runs: open the checkpoint and build the manifest (file sha256,
  every tensor's sha256, crc32 and 1 MiB chunk crc32s);
- ``verify``: what ``ckptfs verify --manifest`` runs: the same hashing plus the comparison;
- checked reads: every tensor's stored bytes read through the API (``Tensor.raw()``) without a manifest,
  with one on a fresh open (every chunk checked on first access), and again on the same open (chunks known
  good: no checking).

Each is reported as MB/s (median of the rounds); the hashing ones also as a ratio of the baseline measured in
the same round.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time

import numpy as np

import ckptfs
from ckptfs.integrity.manifest import build_manifest
from ckptfs.integrity.verify import verify

PIECE = 8 << 20


def make_file(path: str, size_mib: int) -> None:
    """A safetensors file of about ``size_mib`` MiB: per 'layer' 4 big, 2 middle and 2 small tensors."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    tensors: dict[str, np.ndarray] = {}
    total, layer = 0, 0
    while total < size_mib << 20:
        for name, nbytes in (("q", 6 << 20), ("k", 6 << 20), ("v", 6 << 20), ("o", 6 << 20),
                             ("up", 5 << 20 | 12345), ("down", 3 << 20 | 999), ("norm1", 8192), ("norm2", 8192)):
            tensors[f"layers.{layer}.{name}"] = rng.integers(0, 256, nbytes, dtype=np.uint8)
            total += nbytes
        layer += 1
    save_file(tensors, path)


def sha256_file(path: str) -> str:
    sha = hashlib.sha256()
    buffer = bytearray(PIECE)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            sha.update(view[:n])
    return sha.hexdigest()


CPU_SECONDS: dict[str, list[float]] = {}


def timed(fn, label: str) -> tuple[float, object]:
    """Wall seconds of ``fn()`` and its result; the process CPU seconds it used go to CPU_SECONDS[label]."""
    cpu = time.process_time()
    start = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - start
    CPU_SECONDS.setdefault(label, []).append(time.process_time() - cpu)
    return wall, result


def manifest_of(path: str):
    with ckptfs.open(path) as ck:
        return build_manifest(ck)


def verify_against(path: str, manifest) -> list:
    with ckptfs.open(path) as ck:
        return verify(ck, manifest)


def read_all(ck) -> int:
    return sum(len(t.raw()) for t in ck.tensors)


def checked_reads(path: str, manifest) -> dict[str, float]:
    """Seconds to read every tensor's bytes: unchecked, checked on a fresh open, checked again."""
    seconds = {}
    with ckptfs.open(path) as ck:
        seconds["unchecked"], _ = timed(lambda: read_all(ck), "unchecked")
    with ckptfs.open(path, manifest=manifest) as ck:
        seconds["checked, first"], _ = timed(lambda: read_all(ck), "checked, first")
        seconds["checked, again"], _ = timed(lambda: read_all(ck), "checked, again")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?")
    parser.add_argument("--size-mib", type=int, default=384)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.file or os.path.join(tmp, "bench.safetensors")
        if not args.file:
            make_file(path, args.size_mib)
        size = os.path.getsize(path)
        expected = sha256_file(path)  # also warms the page cache
        rows: dict[str, list[float]] = {"sha256": [], "manifest": [], "verify": []}
        read_rows: dict[str, list[float]] = {}
        ratios: dict[str, list[float]] = {"manifest": [], "verify": []}
        manifest = None
        for _ in range(args.rounds):
            base, digest = timed(lambda: sha256_file(path), "sha256")
            built, manifest = timed(lambda: manifest_of(path), "manifest")
            checked, mismatches = timed(lambda: verify_against(path, manifest), "verify")
            assert digest == expected and manifest.files[0].sha256 == expected and mismatches == []
            for key, seconds in (("sha256", base), ("manifest", built), ("verify", checked)):
                rows[key].append(size / seconds / 1e6)
            ratios["manifest"].append(base / built)
            ratios["verify"].append(base / checked)
            tensor_bytes = sum(t.stored_nbytes for t in manifest.tensors)
            for key, seconds in checked_reads(path, manifest).items():
                read_rows.setdefault(key, []).append(tensor_bytes / seconds / 1e6)
    result = {
        "file_bytes": size, "tensors": len(manifest.tensors), "rounds": args.rounds, "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "mb_per_s": {k: round(statistics.median(v), 1) for k, v in rows.items()},
        "ratio_to_sha256": {k: round(statistics.median(v), 3) for k, v in ratios.items()},
        "ratio_range": {k: [round(min(v), 3), round(max(v), 3)] for k, v in ratios.items()},
        # CPU seconds per byte relative to the baseline's: the work done, whatever the cores available
        "tensor_reads_mb_per_s": {k: round(statistics.median(v), 1) for k, v in read_rows.items()},
        "cpu_work_vs_sha256": {k: round(statistics.median(CPU_SECONDS[k]) / statistics.median(CPU_SECONDS["sha256"]), 2)
                               for k in ("manifest", "verify")},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{size / 2**20:.0f} MiB, {result['tensors']} tensors, {args.rounds} rounds, "
              f"{result['cpus']} CPUs, load {result['load_average']:.2f}")
        for key, value in result["mb_per_s"].items():
            ratio = result["ratio_to_sha256"].get(key)
            work = result["cpu_work_vs_sha256"].get(key)
            spread = result["ratio_range"].get(key)
            print(f"  {key:9s} {value:8.1f} MB/s" + (f"   {ratio:.0%} of sha256 (rounds {spread[0]:.0%}-{spread[1]:.0%}), "
                                                      f"{work:.2f}x its CPU time" if ratio else ""))
        print("  reads of every tensor (Tensor.raw()):")
        for key, value in result["tensor_reads_mb_per_s"].items():
            print(f"    {key:15s} {value:8.1f} MB/s")
    return 0
