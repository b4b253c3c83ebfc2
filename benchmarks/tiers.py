"""Benchmarks of the shared cache tiers (results in docs/performance.md; method: docs/caches.md).

1. **Second daemon.** For the disk tier (``--cache-dir``) and the Redis tier (``--redis``): a cold daemon
   streams every ``.npy`` of a realistic Q4_K_M-style GGUF (scripts/make_realistic_gguf.py) into an empty
   tier, then a second daemon, mounted beside it, streams the same files, then a daemon without any
   tier does. Per round, side by side: the streams' MB/s, the ratios, and the bytes each decoded (what it
   stored in the tier: every decode is offered to it; plus the mount's ``decoded_bytes``). Medians.
2. **Redis stopped or paused during a stream.** A daemon whose groups are all in Redis streams with
   ``--cache-size 0``; a third of the way in, Redis is killed (SIGKILL) or paused (SIGSTOP: connections hang
   until the 0.5 s timeout). Every read's latency and result are recorded: failures, maximum, p99.
3. **Eight workers, one copy.** Eight spawned processes import ckptfs and open the checkpoint (idle PSS
   measured), then each maps a 640 MiB decoded tensor with ``Tensor.shared()`` and touches every page; the
   sum of their PSS grows by how many copies? For contrast, two workers with ``Tensor.numpy()``.
4. **Per-group costs** (inputs of docs/scale.md): decoding one 256 KiB group of Q4_K, a disk-tier hit,
   a Redis hit (one GET, and per group within an 8-group MGET), reading the stored bytes of a group.

Runs on the machine it is started on (root, FUSE, redis-server). Usage:
    python -m benchmarks tiers [--rounds 3] [--layers 6] [--vocab 65536] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from benchmarks import REPO

CHUNK = 1 << 20
MIB = float(1 << 20)


# ------------------------------------------------------------------------------------------ mounts


def mount(src: Path, mnt: Path, *args: str, tree: Path = REPO) -> Path:
    """Mount ``src`` with the ckptfs of ``tree`` (this checkout unless another is named; run from there:
    ``python -m`` puts the working directory first on the path)."""
    mnt.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", "mount", str(src), str(mnt), *args], check=True,
                   env={**os.environ, "PYTHONPATH": str(tree)}, cwd=str(tree))
    return mnt


def unmount(mnt: Path) -> None:
    subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)


def stats(mnt: Path) -> dict:
    return json.loads(os.getxattr(str(mnt), "user.ckptfs.stats"))


def settle(mnt: Path, tier: str, timeout: float = 300.0) -> dict:
    """The mount's stats once its background writes to ``tier`` are done."""
    deadline = time.monotonic() + timeout
    while True:
        st = stats(mnt)
        if st["tiers"][tier].get("pending", 0) == 0 or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


def npy_files(mnt: Path) -> list[Path]:
    return sorted(p for p in mnt.iterdir() if p.suffix == ".npy")


def stream(mnt: Path, chunk: int = CHUNK, on_read=None) -> tuple[int, float, int]:
    """Read every .npy sequentially (page cache dropped first); (bytes, seconds, crc32 of all)."""
    total, crc = 0, 0
    start = time.perf_counter()
    for path in npy_files(mnt):
        with open(path, "rb") as fh:
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            while True:
                t0 = time.perf_counter()
                data = fh.read(chunk)
                if on_read is not None:
                    on_read(time.perf_counter() - t0, total)
                if not data:
                    break
                crc = zlib.crc32(data, crc)
                total += len(data)
    return total, time.perf_counter() - start, crc


def own_decoded(st: dict, tier: str) -> int:
    """Bytes this daemon decoded: each decode is stored in the lower tier (its ``stored_bytes``); the
    mount's ``decoded_bytes`` counts the same where the codec counter is wired."""
    return max(int(st["tiers"][tier].get("stored_bytes", 0)), int(st.get("decoded_bytes", 0)))


# ------------------------------------------------------------------------------ 1: second daemon


def second_daemon(model: Path, work: Path, tier: str, rounds: int, server) -> dict:
    rows = []
    for r in range(rounds):
        cache_dir = work / f"cache-{tier}-{r}"
        if tier == "disk":
            args = ["--cache-dir", str(cache_dir)]
        else:
            server.command("FLUSHALL")
            args = ["--redis", server.url]
        a = mount(model, work / f"a-{tier}-{r}", *args, "--cache-size", "64M")
        b = None
        try:
            cold_bytes, cold_s, cold_crc = stream(a)
            cold_decoded = own_decoded(settle(a, tier), tier)
            b = mount(model, work / f"b-{tier}-{r}", *args, "--cache-size", "64M")
            warm_bytes, warm_s, warm_crc = stream(b)
            st = stats(b)
            warm_decoded = own_decoded(st, tier)
        finally:
            unmount(a)
            if b is not None:
                unmount(b)
            shutil.rmtree(cache_dir, ignore_errors=True)
        plain = mount(model, work / f"plain-{tier}-{r}", "--cache-size", "64M")
        try:
            plain_bytes, plain_s, plain_crc = stream(plain)
        finally:
            unmount(plain)
        assert cold_crc == warm_crc == plain_crc and cold_bytes == warm_bytes, "the daemons served different bytes"
        rows.append({"streamed": warm_bytes, "cold_mb_s": cold_bytes / cold_s / 1e6,
                     "plain_mb_s": plain_bytes / plain_s / 1e6, "ratio_plain": plain_s / warm_s,
                     "warm_mb_s": warm_bytes / warm_s / 1e6, "ratio": cold_s / warm_s,
                     "cold_decoded": cold_decoded, "warm_decoded": warm_decoded,
                     "warm_decoded_share": warm_decoded / warm_bytes,
                     "warm_tier_hits": st["tiers"][tier]["hits"], "warm_tier_misses": st["tiers"][tier]["misses"]})
        print(f"  {tier} round {r + 1}: cold {rows[-1]['cold_mb_s']:.0f} MB/s (no tier: "
              f"{rows[-1]['plain_mb_s']:.0f}), second daemon {rows[-1]['warm_mb_s']:.0f} MB/s "
              f"(x{rows[-1]['ratio']:.2f}; x{rows[-1]['ratio_plain']:.2f} over no tier); decoded: cold "
              f"{cold_decoded / MIB:.1f} MiB, second {warm_decoded / MIB:.2f} MiB of {warm_bytes / MIB:.0f} MiB",
              flush=True)
    return {"rounds": rows, "median_ratio": statistics.median(r["ratio"] for r in rows),
            "median_ratio_plain": statistics.median(r["ratio_plain"] for r in rows),
            "max_warm_decoded_share": max(r["warm_decoded_share"] for r in rows)}


# ------------------------------------------------------------------------- 2: Redis outage mid-stream


def redis_outage(model: Path, work: Path, how: str) -> dict:
    from loopback.redis_server import RedisServer

    server = RedisServer().start()
    warm = mount(model, work / f"warm-{how}", "--redis", server.url, "--cache-size", "0")
    try:
        total_bytes, _, reference_crc = stream(warm)
        settle(warm, "redis")
    finally:
        unmount(warm)
    mnt = mount(model, work / f"outage-{how}", "--redis", server.url, "--cache-size", "0")
    latencies: list[float] = []
    cut = total_bytes // 3
    state = {"done": False}

    def on_read(seconds: float, offset: int) -> None:
        latencies.append(seconds)
        if not state["done"] and offset >= cut:
            state["done"] = True
            if how == "kill":
                server.kill()
            else:
                os.kill(server.proc.pid, signal.SIGSTOP)

    try:
        got_bytes, seconds, crc = stream(mnt, chunk=128 * 1024, on_read=on_read)
        st = stats(mnt)
    finally:
        unmount(mnt)
        if how == "pause" and server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
    lat = sorted(latencies)
    result = {"how": how, "reads": len(lat), "failed": 0, "correct": crc == reference_crc and got_bytes == total_bytes,
              "max_ms": lat[-1] * 1e3, "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1e3,
              "median_ms": statistics.median(lat) * 1e3, "redis": st["tiers"]["redis"], "seconds": seconds}
    print(f"  redis {how} at 1/3: {result['reads']} reads, all answered and correct={result['correct']}, "
          f"max {result['max_ms']:.0f} ms, p99 {result['p99_ms']:.1f} ms, median {result['median_ms']:.2f} ms",
          flush=True)
    return result


# -------------------------------------------------------------------------------- 3: eight workers


def pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def _worker(path: str, cache_dir: str, name: str, mode: str, opened, go, done, out) -> None:
    import ckptfs

    ck = ckptfs.open(path, cache_dir=cache_dir)
    opened.wait()
    go.wait()
    values = ck[name].shared() if mode == "shared" else ck[name].numpy()
    out.put(float(values.sum(dtype=np.float64)))  # touches every page
    done.wait()


def workers_pss(path: Path, cache_dir: Path, name: str, nbytes: int, n: int, mode: str) -> dict:
    ctx = multiprocessing.get_context("spawn")
    opened, go, done = ctx.Barrier(n + 1), ctx.Barrier(n + 1), ctx.Event()
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(path), str(cache_dir), name, mode, opened, go, done, out))
             for _ in range(n)]
    for p in procs:
        p.start()
    try:
        opened.wait(timeout=300)
        time.sleep(0.5)
        idle = sum(pss_kib(p.pid) for p in procs)
        start = time.perf_counter()
        go.wait(timeout=300)
        sums = [out.get(timeout=600) for _ in procs]
        seconds = time.perf_counter() - start
        busy = sum(pss_kib(p.pid) for p in procs)
    finally:
        done.set()
        for p in procs:
            p.join(60)
    growth = (busy - idle) * 1024 / nbytes
    assert len(set(sums)) == 1, "workers saw different values"
    print(f"  {n} workers, {mode}: PSS idle {idle / 1024:.0f} MiB, after {busy / 1024:.0f} MiB: grew by "
          f"{growth:.2f} copies of {nbytes / MIB:.0f} MiB ({seconds:.1f} s)", flush=True)
    return {"workers": n, "mode": mode, "idle_pss_mib": idle / 1024, "pss_mib": busy / 1024,
            "growth_copies": growth, "seconds": seconds}


def write_big_tensor_gguf(path: Path, elements: int) -> None:
    import gguf
    from make_realistic_gguf import random_blocks

    rng = np.random.default_rng(5)
    writer = gguf.GGUFWriter(str(path), "llama")
    rows = 8192
    blocks = random_blocks("Q4_K", elements, rng).reshape(rows, -1)
    writer.add_tensor("big.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---------------------------------------------------------------------------------- 4: group costs


def group_costs(model: Path, work: Path, redis_url: str) -> dict:
    import ckptfs
    from ckptfs.cache.disk import DiskTier
    from ckptfs.cache.redis_tier import RedisTier

    ck = ckptfs.open(model, cache_size=0)
    tensor = max((t for t in ck.tensors if t.storage_type == "Q4_K"), key=lambda t: t.size)
    data = tensor.data
    groups = min(64, -(-data.available_blocks() // data.group_blocks))
    disk = DiskTier(work / "costs-cache", 1 << 34, background=False)  # writes timed where they happen
    redis = RedisTier(redis_url)

    def timed(fn) -> float:
        """Seconds per group: the median of three passes over the groups (the machine is shared)."""
        passes = []
        for _ in range(3):
            start = time.perf_counter()
            for g in range(groups):
                fn(g)
            passes.append((time.perf_counter() - start) / groups)
        return statistics.median(passes)

    def key(g):
        return data._key(g)
    stored_s = timed(lambda g: data._pread_blocks(g * data.group_blocks,
                                                  min((g + 1) * data.group_blocks, data.available_blocks())))
    decode_s = timed(lambda g: data._decode_group(g))
    values = {g: data._decode_group(g) for g in range(groups)}
    disk_put_s = timed(lambda g: disk.put(key(g), values[g]))
    disk_hit_s = timed(lambda g: disk.get(key(g)))
    redis_put_s = timed(lambda g: redis._put_now(key(g), values[g]))
    redis_hit_s = timed(lambda g: redis.get_many([key(g)]))
    redis_batched_s = timed(lambda g: g % 8 == 0 and redis.get_many([key(b) for b in range(g, min(g + 8, groups))]))
    group_bytes = values[0].nbytes
    result = {"storage_type": "Q4_K", "group_out_bytes": group_bytes,
              "group_stored_bytes": data.group_blocks * data.info.block_bytes,
              "stored_read_ms": stored_s * 1e3, "decode_ms": decode_s * 1e3,
              "disk_put_ms": disk_put_s * 1e3, "disk_hit_ms": disk_hit_s * 1e3,
              "redis_put_ms": redis_put_s * 1e3, "redis_hit_ms": redis_hit_s * 1e3,
              "redis_hit_batched_ms": redis_batched_s * 1e3}
    redis.close()
    ck.close()
    print("  per 256 KiB group of Q4_K output: " + ", ".join(
        f"{k[:-3]} {v:.3f} ms" for k, v in result.items() if k.endswith("_ms")), flush=True)
    return result


# ------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=65536)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--big-mib", type=int, default=640, help="decoded size of the workers' tensor")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: stream (or its disk, redis halves), outage, pss, costs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))

    from make_realistic_gguf import write
    from loopback.redis_server import RedisServer

    work = Path(tempfile.mkdtemp(prefix="ckptfs-bench-tiers-"))
    results: dict = {"machine": f"{os.cpu_count()} CPUs, loaded by other work; loopback Redis "
                                f"{subprocess.run(['redis-server', '--version'], capture_output=True, text=True).stdout.split()[2]}"}
    server = RedisServer().start()
    try:
        model = work / "model.gguf"
        size = write(str(model), args.layers, args.vocab, True, 0)
        print(f"model: {size / MIB:.0f} MiB stored, {args.layers} layers, vocab {args.vocab}", flush=True)
        results["model_stored_mib"] = size / MIB
        if "stream" not in skip:
            print("1. a second daemon on a shared tier", flush=True)
            if "disk" not in skip:
                results["disk"] = second_daemon(model, work, "disk", args.rounds, None)
            if "redis" not in skip:
                results["redis"] = second_daemon(model, work, "redis", args.rounds, server)
        if "outage" not in skip:
            print("2. Redis gone during a stream", flush=True)
            results["outage"] = [redis_outage(model, work, "kill"), redis_outage(model, work, "pause")]
        if "costs" not in skip:
            print("4. per-group costs", flush=True)
            results["costs"] = group_costs(model, work, server.url)
        if "pss" not in skip:
            print("3. worker processes reading one big tensor", flush=True)
            big = work / "big.gguf"
            elements = args.big_mib * (1 << 20) // 4
            elements -= elements % (8192 * 256)
            write_big_tensor_gguf(big, elements)
            nbytes = elements * 4
            results["pss"] = [workers_pss(big, work / "pss-cache", "big.weight", nbytes, args.workers, "shared"),
                              workers_pss(big, work / "pss-cache", "big.weight", nbytes, 2, "numpy")]
    finally:
        server.stop()
        for mnt in work.glob("*"):
            if mnt.is_dir():
                unmount(mnt)
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0
