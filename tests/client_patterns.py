"""How serving engines and model loaders read a checkpoint file, as functions that check every byte.

Each pattern reads one file (through a mount) and compares every byte with the original file, counts short
reads (fewer bytes than requested before EOF) and records each read's latency. They run in worker processes
started by :func:`run_workers` (python -c, so that a worker that hangs in the kernel can be killed and one
that dies of SIGBUS shows as such) — tests/clients/test_clients_patterns.py uses them:

- :func:`mmap_faults`: vLLM / SGLang, one process per tensor-parallel rank, mmap the safetensors file and
  fault random pages in at once. After each round the worker drops its pages (madvise MADV_DONTNEED, then
  posix_fadvise DONTNEED) so that the next round's faults reach the filesystem again.
- :func:`direct_chunks`: llama.cpp's DirectIO loader: O_DIRECT, st_blksize-aligned offsets, 64 MiB reads
  into an aligned buffer, the last one running past EOF.
- :func:`threaded_preads`: Run:ai-style streamers: a pool of 16 threads, each pread-ing 2 MiB ranges.

A result is a dict: ``reads``, ``bytes``, ``seconds``, ``wrong`` (the first few wrong or short reads, as
text), ``short``, ``lat_ms`` (sorted latencies, milliseconds, at most :data:`MAX_LATENCIES` of them).
"""

from __future__ import annotations

import json
import mmap
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PAGE = mmap.PAGESIZE
MAX_WRONG = 10
MAX_LATENCIES = 20000
TESTS = str(Path(__file__).resolve().parent)


def _result(reads: int, nbytes: int, seconds: float, wrong: list[str], short: int, lat: list[float]) -> dict:
    lat = sorted(lat)
    if len(lat) > MAX_LATENCIES:  # keep the distribution's shape: every k-th, and the maximum
        step = len(lat) / MAX_LATENCIES
        lat = [lat[int(i * step)] for i in range(MAX_LATENCIES)] + [lat[-1]]
    return {"reads": reads, "bytes": nbytes, "seconds": seconds, "wrong": wrong[:MAX_WRONG], "short": short,
            "lat_ms": [round(x * 1000, 4) for x in lat]}


def mmap_faults(path: str, ref: str, seconds: float, seed: int, max_rounds: int = 100000) -> dict:
    """Random page runs (1 to 64 pages) of a read-only shared mapping, 64 per round, for ``seconds``."""
    rng = random.Random(seed)
    wrong: list[str] = []
    lat: list[float] = []
    reads = nbytes = 0
    start = time.monotonic()
    with open(path, "rb") as f, open(ref, "rb") as r:
        size, ref_size = os.fstat(f.fileno()).st_size, os.fstat(r.fileno()).st_size
        if size != ref_size:
            return _result(0, 0, 0.0, [f"size {size}, the original's {ref_size}"], 0, [])
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        original = mmap.mmap(r.fileno(), 0, access=mmap.ACCESS_READ)
        pages = (size + PAGE - 1) // PAGE
        for _ in range(max_rounds):
            if time.monotonic() - start > seconds:
                break
            for _ in range(64):
                offset = rng.randrange(pages) * PAGE
                end = min(size, offset + rng.choice((1, 1, 4, 16, 64)) * PAGE)
                t0 = time.perf_counter()
                got = mapped[offset:end]
                lat.append(time.perf_counter() - t0)
                reads += 1
                nbytes += len(got)
                if got != original[offset:end]:
                    wrong.append(f"mmap [{offset}:{end}]: not the original's bytes")
            mapped.madvise(mmap.MADV_DONTNEED)
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        mapped.close()
        original.close()
    return _result(reads, nbytes, time.monotonic() - start, wrong, 0, lat)


def _check(got: memoryview, original: mmap.mmap, offset: int, want: int, what: str,
           wrong: list[str]) -> int:
    """Compare one read with the original; returns 1 for a short read (recorded in ``wrong`` too)."""
    if len(got) != want:
        wrong.append(f"{what} [{offset}:+{want}]: {len(got)} bytes (short read)")
        return 1
    if got != original[offset:offset + want]:
        wrong.append(f"{what} [{offset}:+{want}]: not the original's bytes")
    return 0


def direct_chunks(path: str, ref: str, chunk: int = 64 << 20, shift_blocks: int = 0,
                  passes: int = 1) -> dict:
    """The whole file in ``chunk``-byte O_DIRECT reads, llama.cpp's way: offsets on st_blksize, the grid
    shifted by ``shift_blocks`` blocks (so that two workers' reads straddle each other's), the last read
    asking for a whole chunk past EOF (it must return exactly the bytes up to EOF)."""
    wrong: list[str] = []
    lat: list[float] = []
    reads = nbytes = short = 0
    start = time.monotonic()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        st = os.fstat(fd)
        size, align = st.st_size, max(st.st_blksize, PAGE)
        buf = mmap.mmap(-1, chunk)  # anonymous: page-aligned, as O_DIRECT wants
        with open(ref, "rb") as r:
            original = mmap.mmap(r.fileno(), 0, access=mmap.ACCESS_READ)
            first = shift_blocks * align
            plan = ([(0, first)] if first else []) + [(o, chunk) for o in range(first, size, chunk)]
            for _ in range(passes):
                for offset, length in plan:
                    want = min(length, size - offset)
                    t0 = time.perf_counter()
                    n = os.preadv(fd, [memoryview(buf)[:length]], offset)
                    lat.append(time.perf_counter() - t0)
                    reads += 1
                    nbytes += n
                    short += _check(memoryview(buf)[:n], original, offset, want, "O_DIRECT", wrong)
            original.close()
        buf.close()
    finally:
        os.close(fd)
    return _result(reads, nbytes, time.monotonic() - start, wrong, short, lat)


def threaded_preads(path: str, ref: str, threads: int = 16, size: int = 2 << 20, direct: bool = False,
                    seed: int = 0) -> dict:
    """Every ``size``-byte range of the file once, in random order, by a pool of ``threads`` threads on one
    descriptor (page cache dropped first; with ``direct`` O_DIRECT into a per-thread aligned buffer)."""
    wrong: list[str] = []
    lat: list[float] = []
    counts = {"reads": 0, "bytes": 0, "short": 0}
    lock = threading.Lock()
    local = threading.local()
    start = time.monotonic()
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    r = open(ref, "rb")
    original = mmap.mmap(r.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        file_size = os.fstat(fd).st_size
        if not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        offsets = list(range(0, file_size, size))
        random.Random(seed).shuffle(offsets)

        def one(offset: int) -> None:
            want = min(size, file_size - offset)
            t0 = time.perf_counter()
            if direct:
                if not hasattr(local, "buf"):
                    local.buf = mmap.mmap(-1, size)
                n = os.preadv(fd, [local.buf], offset)
                got = memoryview(local.buf)[:n]
            else:
                got = memoryview(os.pread(fd, size, offset))
            elapsed = time.perf_counter() - t0
            problems: list[str] = []
            is_short = _check(got, original, offset, want, "pread O_DIRECT" if direct else "pread", problems)
            with lock:
                lat.append(elapsed)
                counts["reads"] += 1
                counts["bytes"] += len(got)
                counts["short"] += is_short
                wrong.extend(problems)

        with ThreadPoolExecutor(threads) as pool:
            for future in [pool.submit(one, offset) for offset in offsets]:
                future.result()
    finally:
        original.close()
        r.close()
        os.close(fd)
    return _result(counts["reads"], counts["bytes"], time.monotonic() - start, wrong, counts["short"], lat)


# ---------------------------------------------------------------------------------------------- workers


def run_workers(calls: list[tuple[str, dict]], timeout: float) -> list[dict]:
    """Run each ``(function name, kwargs)`` in a process of its own, all at once; their results in order.
    A worker still running after ``timeout`` seconds is killed and reported as hung; one that dies (SIGBUS
    from a failed page fault, an exception) is reported with its exit status and stderr's last line."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import client_patterns as p; "
            "print(json.dumps(getattr(p, sys.argv[2])(**json.loads(sys.argv[3]))))")
    procs = [subprocess.Popen([sys.executable, "-c", code, TESTS, name, json.dumps(kwargs)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, kwargs in calls]
    deadline = time.monotonic() + timeout
    results = []
    for (name, _), proc in zip(calls, procs):
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            results.append({"failed": f"{name}: hung (still running after {timeout:.0f} s, killed)"})
            continue
        if proc.returncode != 0:
            how = (f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
                   else f"exit status {proc.returncode}")
            last = (err.strip().splitlines() or [""])[-1]
            results.append({"failed": f"{name}: {how} {last}".strip()})
            continue
        results.append(json.loads(out))
    return results


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted ``values`` (nearest rank); 0.0 for none."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, round(q * len(values) + 0.5) - 1))]


def summary(results: list[dict]) -> dict:
    """Totals of several workers' results: reads, bytes, MB/s over the longest worker, p50/p99/max ms."""
    lat = sorted(x for r in results for x in r.get("lat_ms", []))
    seconds = max((r.get("seconds", 0.0) for r in results), default=0.0)
    nbytes = sum(r.get("bytes", 0) for r in results)
    return {"reads": sum(r.get("reads", 0) for r in results), "bytes": nbytes,
            "mb_s": nbytes / seconds / 1e6 if seconds else 0.0, "p50_ms": percentile(lat, 0.5),
            "p99_ms": percentile(lat, 0.99), "max_ms": lat[-1] if lat else 0.0}


class RssSampler:
    """Samples a process's anonymous memory (RssAnon, from /proc) every ``interval`` seconds in a thread."""

    def __init__(self, pid: int, interval: float = 0.05):
        from ckptfs.util.procinfo import rss_anon
        self._rss_anon = rss_anon
        self.pid = pid
        self.interval = interval
        self.first = rss_anon(pid) or 0
        self.peak = self.first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            value = self._rss_anon(self.pid)
            if value is not None:
                self.peak = max(self.peak, value)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
