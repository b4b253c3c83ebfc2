"""The serving engines' read patterns against one file of a real mount: every byte checked, no short read,
no hang, the daemon's memory bounded.

Reported failures of other FUSE checkpoint mounts under exactly these patterns: short reads that concurrent
readers took for EOF, a FUSE queue deadlocked by mmap plus parallel loading. The patterns (tests/
client_patterns.py, each in worker processes so that a hang is killed and reported, never waited on):
8 processes mmap-faulting random page runs of one file (vLLM/SGLang tensor-parallel ranks), llama.cpp's
O_DIRECT 64 MiB aligned reads, 16 threads of 2 MiB preads (Run:ai-style streamers), then all of them at once.

Files: the merged ``model.gguf`` of a split GGUF set (ckptfs builds it from the shards; the reference is the
unsplit file written with the same seed, byte-identical), local and served by nginx on loopback (http://,
fetched per range), and a safetensors folder's own
``model.safetensors`` (passed through). The mount's decoded cache is 16 MiB; the daemon's RssAnon is sampled
throughout and must stay within the cache plus :data:`DAEMON_SLACK` of its value before the run — the local
files are several times that, so a daemon that kept what it served would fail. A remote mount also keeps
fetched bytes in the process's chunk LRU and has read-ahead in flight, each bounded by its own constant
(sources/remote/store/chunks.py, workers/scheduler.py); its bound adds those (larger than this file, so there it
checks that the daemon stays within its documented bounds, not that it keeps nothing).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from client_patterns import RssSampler, run_workers, summary
from conftest import REPO, mount_stats, require_nginx

from ckptfs.sources.remote.store.chunks import DEFAULT_MEMORY_BYTES as REMOTE_CHUNKS
from ckptfs.workers.scheduler import DEFAULT_BUDGET as READ_AHEAD_BUDGET
from loopback.servers import Nginx

CACHE = 16 << 20
#: RssAnon growth allowed besides the cache: libfuse's request buffers (max_read per worker thread), the
#: bytes of the requests in flight, allocator slack. A daemon holding a file of these sizes breaks it.
DAEMON_SLACK = 64 << 20
WORKER_TIMEOUT = 180.0
SECONDS = 5.0


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Name -> original: a split GGUF set (plus its unsplit twin) and a safetensors folder, ~100 MB each."""
    root = tmp_path_factory.mktemp("patterns")
    make = [sys.executable, str(REPO / "scripts" / "make_realistic_gguf.py"), "--layers", "4", "--vocab", "65536"]
    subprocess.run([*make, str(root / "one.gguf")], check=True, capture_output=True, timeout=300)
    subprocess.run([*make, str(root / "split" / "m.gguf"), "--split-max-tensors", "16"], check=True,
                   capture_output=True, timeout=300)
    from safetensors.numpy import save_file
    rng = np.random.default_rng(5)
    folder = root / "st"
    folder.mkdir()
    tensors = {f"layer.{i}.weight": rng.standard_normal((1000 + 37 * i, 4099), dtype=np.float32)
               for i in range(5)}
    tensors["odd"] = rng.integers(0, 255, 12345, dtype=np.uint8)  # the file's size: no multiple of a page
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    return {"split": root / "split", "one": root / "one.gguf", "st": folder}


@pytest.fixture(scope="module")
def http_url(files):
    """nginx on loopback serving the files' folder."""
    require_nginx()
    with Nginx(files["split"].parent) as server:
        yield server.url


@pytest.fixture(scope="module", params=["gguf-merged", "gguf-merged-http", "gguf-single", "gguf-single-http", "safetensors"])
def target(request, files, module_mounted) -> tuple[str, str, int, int]:
    """(mounted file, original file, daemon pid, RssAnon growth allowed) — one mount per kind."""
    if request.param.startswith("gguf-merged"):
        shard = sorted(files["split"].glob("m-*-of-*.gguf"))[0]
        src = (f"{request.getfixturevalue('http_url')}/split/{shard.name}" if request.param.endswith("http")
               else str(shard))
        mnt = module_mounted(src, "--cache-size", str(CACHE))
        path, ref = mnt / "model.gguf", files["one"]
    elif request.param.startswith("gguf-single"):
        src = (f"{request.getfixturevalue('http_url')}/one.gguf" if request.param.endswith("http")
               else str(files["one"]))
        mnt = module_mounted(src, "--cache-size", str(CACHE))
        path, ref = mnt / "one.gguf", files["one"]
    else:
        mnt = module_mounted(str(files["st"]), "--cache-size", str(CACHE))
        path, ref = mnt / "model.safetensors", files["st"] / "model.safetensors"
    assert path.stat().st_size == ref.stat().st_size
    bound = CACHE + DAEMON_SLACK + (REMOTE_CHUNKS + READ_AHEAD_BUDGET if request.param.endswith("http") else 0)
    return str(path), str(ref), mount_stats(mnt)["pid"], bound


def run_checked(calls: list[tuple[str, dict]], pid: int, bound: int) -> dict:
    """Run the workers while sampling the daemon's RssAnon; fail on a hang, a crash, a wrong or short read,
    or memory growth past the bound. Returns the summary (throughput, p99) for the report."""
    with RssSampler(pid) as rss:
        results = run_workers(calls, WORKER_TIMEOUT)
    failed = [r["failed"] for r in results if "failed" in r]
    assert not failed, failed
    wrong = [w for r in results for w in r["wrong"]]
    assert not wrong, wrong
    assert sum(r["short"] for r in results) == 0
    assert all(r["reads"] > 0 for r in results)
    growth = rss.peak - rss.first
    assert growth <= bound, f"daemon RssAnon grew by {growth >> 20} MiB (bound {bound >> 20} MiB)"
    stats = summary(results)
    print(f"{len(calls)} workers: {stats['reads']} reads, {stats['mb_s']:.0f} MB/s, p99 {stats['p99_ms']:.1f} ms, "
          f"daemon RssAnon +{growth >> 20} MiB")
    return stats


def test_eight_processes_mmap_fault_random_pages(target):
    path, ref, pid, bound = target
    stats = run_checked([("mmap_faults", {"path": path, "ref": ref, "seconds": SECONDS, "seed": i})
                         for i in range(8)], pid, bound)
    assert stats["bytes"] > 0


def test_o_direct_64mib_aligned_reads(target):
    """llama.cpp --load-mode dio: 64 MiB + 2 blocks (its buffer), and 64 MiB on a grid shifted by 3 blocks."""
    path, ref, pid, bound = target
    run_checked([("direct_chunks", {"path": path, "ref": ref, "chunk": (64 << 20) + 2 * 4096}),
                 ("direct_chunks", {"path": path, "ref": ref, "chunk": 64 << 20, "shift_blocks": 3})],
                pid, bound)


def test_sixteen_threads_of_2mib_preads(target):
    path, ref, pid, bound = target
    run_checked([("threaded_preads", {"path": path, "ref": ref, "threads": 16, "direct": False, "seed": 1}),
                 ("threaded_preads", {"path": path, "ref": ref, "threads": 16, "direct": True, "seed": 2})],
                pid, bound)


def test_all_patterns_at_once(target):
    """mmap faults from 8 processes while O_DIRECT chunks and 16 pread threads stream the same file."""
    path, ref, pid, bound = target
    run_checked([*[("mmap_faults", {"path": path, "ref": ref, "seconds": SECONDS, "seed": 10 + i})
                   for i in range(8)],
                 ("direct_chunks", {"path": path, "ref": ref, "chunk": 64 << 20, "shift_blocks": 1}),
                 ("threaded_preads", {"path": path, "ref": ref, "threads": 16, "seed": 3})], pid, bound)
