"""Stress: many threads and processes reading random ranges of many .npy files of one mount, small cache.

One daemon, ``--cache-size 2M`` against about 7 MiB of decoded tensors (so groups are evicted and decoded
again all the time), for ``CKPTFS_STRESS_SECONDS`` (default 15): reader threads in this process and reader
processes, each reading random ranges (1 byte to 256 KiB) through O_DIRECT (every request reaches the daemon)
or the page cache, opening and closing the file for every read. Every byte is compared with the reference:
np.save of gguf-py's dequantization. Meanwhile the daemon's anonymous memory (RssAnon) is sampled; it must stay
under the cache size plus a fixed overhead, and the daemon must hold as many descriptors after the run, and
after thousands of extra open/close cycles, as before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from stress_reader import hammer
from conftest import cli_env, mount_stats, pid_alive
from fixtures import Written, quantized, write_gguf

from ckptfs.util.procinfo import rss_anon
from mount_expect import npy_bytes

STRESS_SECONDS = float(os.environ.get("CKPTFS_STRESS_SECONDS", "15"))
CACHE_BYTES = 2 * 1024 * 1024
#: What the daemon may use besides its cache: the interpreter, numpy, libfuse and its worker threads, the
#: decoded group being built for every request in flight, allocator slack. Measured: see docs/performance.md.
OVERHEAD_BYTES = 150 * 1024 * 1024
THREADS = 6
PROCESSES = 3
OPEN_CLOSE_CYCLES = 5000

#: gguf-py decodes every one of these (the reference); block layouts of each family.
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
         "TQ1_0", "TQ2_0", "MXFP4", "BF16", "F16", "F32")


def write_model(path: Path) -> Written:
    rng = np.random.default_rng(33)
    tensors = {}
    for i, storage_type in enumerate(TYPES * 2):
        shape = (int(rng.integers(40, 90)), 1024)
        if storage_type in ("F16", "F32"):
            values = rng.standard_normal(shape).astype(np.float16 if storage_type == "F16" else np.float32)
        elif storage_type in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16", "TQ1_0", "TQ2_0", "MXFP4"):
            values = rng.standard_normal(shape).astype(np.float32)
        else:
            values = quantized(storage_type, shape, rng)
        tensors[f"blk.{i}.{storage_type.lower()}"] = (values, storage_type)
    return write_gguf(path, tensors, {"general.name": "stress"})


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Written, Path]:
    """The checkpoint, and a folder holding the reference bytes of every .npy under the same names."""
    folder = tmp_path_factory.mktemp("stress")
    written = write_model(folder / "model.gguf")
    refs = folder / "reference"
    refs.mkdir()
    for name, ref in written.tensors.items():
        assert ref.array is not None, name
        dtype = "<f2" if ref.storage_type == "F16" else "<f4"
        (refs / f"{name}.npy").write_bytes(npy_bytes(np.asarray(ref.array).astype(dtype)))
    return written, refs


# ---------------------------------------------------------------------------------------------- readers

def start_process(mnt: Path, refs: Path, seconds: float, seed: int) -> subprocess.Popen:
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r}); from stress_reader import hammer; "
            f"print(json.dumps(hammer({str(mnt)!r}, {str(refs)!r}, {seconds!r}, {seed!r})))")
    return subprocess.Popen([sys.executable, "-c", code], env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


class Sampler(threading.Thread):
    """RssAnon of a process, sampled every 0.1 s."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            value = rss_anon(self.pid)
            if value is not None:
                self.samples.append(value)


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# ------------------------------------------------------------------------------------------------ test

@pytest.mark.timeout(STRESS_SECONDS + 300)  # a long CKPTFS_STRESS_SECONDS must not hit the per-test limit
def test_many_readers_small_cache(mounted, model):
    written, refs = model
    mnt = mounted(written.path, "--cache-size", "2M")
    stats = mount_stats(mnt)
    pid = stats["pid"]
    decoded = sum(p.stat().st_size for p in refs.iterdir())
    assert decoded > 3 * CACHE_BYTES
    first = sorted(refs.iterdir())[0].name
    assert (mnt / first).read_bytes() == (refs / first).read_bytes()  # warm: the source is open, threads exist
    fds_before = fd_count(pid)
    baseline = rss_anon(pid)

    sampler = Sampler(pid)
    sampler.start()
    processes = [start_process(mnt, refs, STRESS_SECONDS, 1000 + i) for i in range(PROCESSES)]
    results: list[dict] = []
    threads = [threading.Thread(target=lambda seed=seed: results.append(hammer(str(mnt), str(refs), STRESS_SECONDS,
                                                                               seed))) for seed in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=STRESS_SECONDS + 120)
    for proc in processes:
        out, err = proc.communicate(timeout=STRESS_SECONDS + 120)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out))
    sampler.stop.set()
    sampler.join()

    assert len(results) == THREADS + PROCESSES
    wrong = [w for r in results for w in r["wrong"]]
    assert not wrong, wrong[:10]
    reads = sum(r["reads"] for r in results)
    assert reads > 1000 and all(r["reads"] > 0 for r in results)
    cache = mount_stats(mnt)["cache"]
    assert cache["evictions"] > 0 and cache["bytes"] <= CACHE_BYTES

    peak = max(sampler.samples)
    assert len(sampler.samples) >= STRESS_SECONDS * 5
    assert peak <= CACHE_BYTES + OVERHEAD_BYTES, f"daemon RssAnon peaked at {peak / 2**20:.1f} MiB"

    # thousands of open/close cycles (with a read, to reach the daemon's handles): no descriptor kept
    names = sorted(p.name for p in refs.iterdir())
    for i in range(OPEN_CLOSE_CYCLES):
        fd = os.open(mnt / names[i % len(names)], os.O_RDONLY)
        try:
            assert len(os.pread(fd, 1, 0)) == 1
        finally:
            os.close(fd)
    assert pid_alive(pid)
    final = mount_stats(mnt)
    assert final["open_handles"] == 0
    assert fd_count(pid) == fds_before
    print(f"\n{reads} reads by {THREADS} threads and {PROCESSES} processes in {STRESS_SECONDS:.0f} s, "
          f"{sum(r['bytes'] for r in results) / 2**20:.0f} MiB; daemon RssAnon {baseline / 2**20:.1f} MiB idle, "
          f"peak {peak / 2**20:.1f} MiB (bound {(CACHE_BYTES + OVERHEAD_BYTES) / 2**20:.0f} MiB); "
          f"cache {final['cache']}; daemon descriptors {fds_before} before and after {OPEN_CLOSE_CYCLES} "
          "open/close cycles")
