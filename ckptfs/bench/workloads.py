"""What users do to a mount, timed: stat + open + read, random 4 KiB reads, mmap rows, sequential scans."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ckptfs.util.sizes import format_size
from ckptfs.bench.plan import NpyFile
from ckptfs.bench.progress import Progress

SCAN_READ = 1 << 20


PAGE = 4096


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def stat_open_read(path: str, offset: int) -> float:
    """What a tool pays for its first bytes of a file: stat, open, one 4 KiB read."""
    start = time.perf_counter()
    os.stat(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, PAGE, offset)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - start
    if len(data) != PAGE:
        raise OSError(f"{path}: short read of {len(data)} bytes at {offset}")
    return elapsed


def random_reads(path: str, offsets: np.ndarray) -> np.ndarray:
    """Seconds per 4 KiB pread at each offset, on one open descriptor."""
    times = np.empty(len(offsets))
    fd = os.open(path, os.O_RDONLY)
    try:
        for i, offset in enumerate(offsets):
            start = time.perf_counter()
            data = os.pread(fd, PAGE, int(offset))
            times[i] = time.perf_counter() - start
            if len(data) != PAGE:
                raise OSError(f"{path}: short read at {offset}")
    finally:
        os.close(fd)
    return times


def mmap_rows(path: str, rows: np.ndarray) -> tuple[float, np.ndarray]:
    """``np.load(mmap_mode="r")`` time, then seconds per copied-out row (each a page-fault path)."""
    open_s, array = _timed(lambda: np.load(path, mmap_mode="r"))
    times = np.empty(len(rows))
    try:
        for i, row in enumerate(rows):
            start = time.perf_counter()
            np.array(array[int(row)])
            times[i] = time.perf_counter() - start
    finally:
        del array  # unmapped now, or the unmount would find the file busy
    return open_s, times


def scan(paths: list[str], progress: Progress,
         per_file: list[tuple[int, float]] | None = None) -> tuple[int, float]:
    """Read every file start to end with 1 MiB reads into one buffer (as ``cat`` does): bytes, seconds.
    ``per_file`` gets (bytes, seconds) of each file in order, open to close (for the per-group figures)."""
    buffer = bytearray(SCAN_READ)
    view = memoryview(buffer)
    total = 0
    start = time.perf_counter()
    for i, path in enumerate(paths):
        file_start, file_total = time.perf_counter(), total
        try:
            with open(path, "rb", buffering=0) as f:
                while True:
                    n = f.readinto(view)
                    if not n:
                        break
                    total += n
        except OSError as exc:  # a read error carries no file name: add it, for the one-line report
            raise OSError(exc.errno, exc.strerror, path) from None
        if per_file is not None:
            per_file.append((total - file_total, time.perf_counter() - file_start))
        if i % 16 == 0:
            progress.detail(f"{i + 1}/{len(paths)} files, {format_size(total)}")
    return total, time.perf_counter() - start


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _random_offsets(f: NpyFile, n: int, rng: np.random.Generator) -> np.ndarray:
    """Page-aligned offsets of 4 KiB reads inside the file (the data, past the header)."""
    first = -(-f.data_offset // PAGE)
    last = (f.data_offset + f.nbytes) // PAGE - 1
    return rng.integers(first, max(first, last) + 1, n) * PAGE
