"""What every quantized-view benchmark (``fp8``, ``fp4``, ``bnb``) measures in a round, in one place.

A round times random 4 KiB reads of the view's ``.npy`` on a fresh mount, streams the view's ``.npy`` and its
codes' ``.raw`` (which one first alternates from round to round), and states both against the reference:
the random read's p50 against the reference decoding the whole layer, the ``.npy`` stream's MB/s against
the ``.raw`` stream's, each file's own bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np

from benchmarks.packed import READ, stream
from ckptfs.bench import bench_mount, random_reads
from ckptfs.core.options import OpenOptions


def random_read_times(folder: str, work: str, tag: str, options: OpenOptions, npy: str, rng: np.random.Generator,
                      reads: int, check: Callable[[str], None] | None = None) -> np.ndarray:
    """Seconds of each of ``reads`` random 4 KiB reads of ``npy`` on a fresh mount; ``check(path)`` runs on the
    mounted file afterwards (the first round compares the served values with the reference's)."""
    with bench_mount(folder, work, tag, options) as mount:
        path = mount.file(npy)
        size = os.path.getsize(path)
        offsets = rng.integers(0, (size - READ) // READ, reads) * READ
        times = random_reads(path, offsets)
        if check is not None:
            check(path)
    return times


def stream_mb_s(folder: str, work: str, tag: str, options: OpenOptions, names: Sequence[str],
                env: dict[str, str] | None = None) -> dict[str, float]:
    """MB/s of each file of ``names`` streamed whole in 1 MiB reads, in that order, each on a fresh mount of its
    own: a file streamed second on a shared mount would find the source's chunks already checked and its
    cache warm from the first (a round's ratio then depended on which file went first)."""
    speeds = {}
    for i, name in enumerate(names):
        with bench_mount(folder, work, f"{tag}-{i}", options, env) as mount:
            speeds[name] = os.path.getsize(mount.file(name)) / stream(mount.file(name)) / 1e6
    return speeds


def in_turn(r: int, npy: str, raw: str) -> tuple[str, str]:
    """The order round ``r`` streams the two files in: ``.npy`` first in even rounds."""
    return (npy, raw) if r % 2 == 0 else (raw, npy)


def view_row(reference_s: float, times: np.ndarray, npy_mb_s: float, raw_mb_s: float) -> dict[str, float]:
    """A round's figures: the random read's p50 and p90, its speed-up over the reference's whole-layer decode,
    both streams and their ratio, and the load average."""
    p50 = float(np.percentile(times, 50))
    return dict(reference_s=reference_s, read_p50_s=p50, read_p90_s=float(np.percentile(times, 90)),
                p50_speedup=reference_s / p50, npy_mb_s=npy_mb_s, raw_mb_s=raw_mb_s, npy_vs_raw=npy_mb_s / raw_mb_s,
                load1=os.getloadavg()[0])
