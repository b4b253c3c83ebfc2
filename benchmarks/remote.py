"""Remote checkpoints over loopback http beside the same file mounted locally: the figures of docs/remote.md.

``ckptfs bench URL``'s workloads plus the server's own counts: requests, bytes, header bytes, cold
first-read latency and stream throughput.

Serves the files with Debian's nginx on 127.0.0.1 (``loopback/servers.py``, as the tests do), mounts each
through the real CLI, and counts requests and bytes from nginx's own access log (what the server saw, not
what ckptfs says it asked for). Workloads, each remote beside local in the same run:

1. mount + listing of a Gemma-3-shaped GGUF (a 262,144-token vocabulary, a 6.2 MiB header; made by
   scripts/make_realistic_gguf.py) and of a 70B-shaped header (80 layers, a 128,256-token vocabulary and
   280,000 BPE merges: an 8.4 MiB header; the tensor data is left out, only the header is read);
2. one random 4 KiB read of the largest .npy on a fresh mount: bytes fetched for it;
3. cold first-read latency: open + first 4 KiB of a .npy on a fresh mount;
4. streaming every .npy (1 MiB reads), remote and local alternated, MB/s of .npy bytes;
5. a remount with the --cache-dir of an earlier mount: data requests for bytes fetched before.

Usage: python -m benchmarks remote [--dir DIR] [--layers 6] [--rounds 3] [--json]

``--capped`` runs the cold starts behind a capped origin instead (``benchmarks/remote_cold_start.py``: a fresh
mount against hf_transfer and aria2c behind nginx's ``limit_rate``, then uncapped against the local file):
  python -m benchmarks remote --capped [--rounds 3] [--rate 20m] [--latency-ms 30] [--latency-by nginx|proxy]
      [--s3] [--out FILE]
  python -m benchmarks remote --capped --sections warm --rounds 5   # the warm mount against the local file
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import SCRIPTS
from ckptfs.bench.remote import BenchMount, header_bytes, stream, timed_read
from ckptfs.core.options import OpenOptions

from loopback.servers import Nginx

MiB = 1 << 20
_LOG = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) [^"]*" (?P<status>\d+) (?P<bytes>\d+)')


def log_since(server: Nginx, before: int) -> list[tuple[int, int]]:
    out = []
    for line in server.access_log()[before:]:
        m = _LOG.search(line)
        if m:
            out.append((int(m["status"]), int(m["bytes"])))
    return out


def write_70b_header(path: Path) -> None:
    """The header of a Llama-3-70B-shaped GGUF (80 layers, 128,256 tokens, 280,000 merges), no tensor data."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(80)
    w.add_context_length(131072)
    w.add_embedding_length(8192)
    w.add_feed_forward_length(28672)
    w.add_head_count(64)
    w.add_head_count_kv(8)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}" for i in range(128256)])
    w.add_token_types([1] * 128256)
    w.add_token_merges([f"m{i} x{i}" for i in range(280_000)])
    q4k = gguf.GGMLQuantizationType.Q4_K
    shapes = {"attn_q": (8192, 8192), "attn_k": (1024, 8192), "attn_v": (1024, 8192), "attn_output": (8192, 8192),
              "ffn_gate": (28672, 8192), "ffn_up": (28672, 8192), "ffn_down": (8192, 28672)}
    def add_q4k(name: str, rows: int, cols: int) -> None:  # gguf-py takes a quantized shape in bytes per row
        w.add_tensor_info(name, (rows, cols // 256 * 144), np.dtype(np.uint8), rows * cols // 256 * 144, q4k)

    add_q4k("token_embd.weight", 128256, 8192)
    for i in range(80):
        for name, (rows, cols) in shapes.items():
            add_q4k(f"blk.{i}.{name}.weight", rows, cols)
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor_info(f"blk.{i}.{name}.weight", (8192,), np.dtype(np.float32), 8192 * 4,
                              gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def measure_header(server: Nginx, root: Path, name: str) -> dict:
    url = f"{server.url}/{name}"
    before = len(server.access_log())
    remote = BenchMount(url, OpenOptions(timeout=30))
    seen = log_since(server, before)
    remote.close()
    local = BenchMount(str(root / name))
    local.close()
    header = header_bytes(str(root / name))
    return {"file": name, "header_bytes": header, "requests": len(seen), "bytes": sum(n for _, n in seen),
            "bytes_limit": 2 * header + 2 * MiB, "mount_list_s": round(remote.seconds, 3),
            "local_mount_list_s": round(local.seconds, 3), "ratio": round(remote.seconds / local.seconds, 2)}


def npy_files(mount: BenchMount) -> list[str]:
    return [n for n in mount.names if n.endswith(".npy")]


def first_read(mnt: Path, name: str, offset: int = 0) -> float:
    return timed_read(mnt / name, offset)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/ckptfs-bench-remote")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    capped = parser.add_argument_group("--capped: cold starts behind a capped origin (benchmarks/remote_cold_start.py)")
    capped.add_argument("--capped", action="store_true")
    capped.add_argument("--rate", default="20m", help="nginx limit_rate per request [20m]")
    capped.add_argument("--latency-ms", type=float, default=30.0, help="added before each request's first byte [30]")
    capped.add_argument("--latency-by", choices=("nginx", "proxy"), default="nginx",
                        help="who adds the latency: nginx's echo_sleep, or the Python delay proxy in front of "
                             "it (the older method, for comparison) [nginx]")
    capped.add_argument("--hf-tuned", default="64,4", help="hf_transfer's tuned variant: FILES,CHUNK_MiB [64,4]")
    capped.add_argument("--shapes", default="gemma3-270m-q4_k_m",
                        choices=("gemma3-270m-q4_k_m", "qwen2-7b-q4_k_m"),
                        help="the real file whose shapes the fixture has: Gemma 3 270M (242 MiB) or Qwen2 7B "
                             "(4.4 GiB) [gemma3-270m-q4_k_m]")
    capped.add_argument("--prefetch-rounds", type=int, default=None,
                        help="rounds that also run ckptfs prefetch [all]")
    capped.add_argument("--s3", action="store_true", help="also through moto's S3 server")
    capped.add_argument("--s3-rounds", type=int, default=1)
    capped.add_argument("--out", default=None, help="JSON results [DIR/cold-start.json]")
    capped.add_argument("--sections", default=None,
                        help="comma-separated, of capped,uncapped,warm,s3: run only these [all]")
    args = parser.parse_args(argv)
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    if args.capped:
        return capped_main(root, args)
    model = root / "realistic.gguf"
    if not model.exists():
        subprocess.run([sys.executable, str(SCRIPTS / "make_realistic_gguf.py"), str(model),
                        "--layers", str(args.layers)], check=True)
    if not (root / "header70b.gguf").exists():
        write_70b_header(root / "header70b.gguf")
    results: dict = {"machine": f"{os.cpu_count()} cores, loopback nginx", "file_bytes": model.stat().st_size}
    with Nginx(root) as server:
        url = f"{server.url}/{model.name}"
        results["headers"] = [measure_header(server, root, model.name), measure_header(server, root, "header70b.gguf")]

        remote = BenchMount(url, OpenOptions(timeout=30))
        local = BenchMount(str(model))
        try:
            names = npy_files(local)
            sizes = {n: os.path.getsize(local.mnt / n) for n in names}
            largest = max(names, key=sizes.get)
            before = len(server.access_log())
            remote_random = first_read(remote.mnt, largest, sizes[largest] // 2 // 4096 * 4096)
            seen = log_since(server, before)
            local_random = first_read(local.mnt, largest, sizes[largest] // 2 // 4096 * 4096)
            results["random_4k"] = {"file": largest, "requests": len(seen), "bytes": sum(n for _, n in seen),
                                    "remote_s": round(remote_random, 4), "local_s": round(local_random, 4)}
            other = sorted(names, key=sizes.get)[len(names) // 2]
            results["cold_first_read"] = {"file": other, "remote_s": round(first_read(remote.mnt, other), 4),
                                          "local_s": round(first_read(local.mnt, other), 4)}
        finally:
            remote.close()
            local.close()

        rows = []
        for _ in range(args.rounds):  # alternate, so load on the shared machine hits both alike
            for kind, src in (("local", str(model)), ("remote", url)):
                m = BenchMount(src, OpenOptions(timeout=30) if kind == "remote" else OpenOptions())
                try:
                    before = len(server.access_log())
                    n, secs = stream(m.mnt, npy_files(m))
                    seen = log_since(server, before)
                finally:
                    m.close()
                rows.append({"kind": kind, "npy_bytes": n, "seconds": round(secs, 3),
                             "MBps": round(n / secs / 1e6, 1), "requests": len(seen),
                             "fetched": sum(b for _, b in seen)})
        best = {k: max(r["MBps"] for r in rows if r["kind"] == k) for k in ("local", "remote")}
        pairs = sorted(rows[i + 1]["MBps"] / rows[i]["MBps"] for i in range(0, len(rows), 2))
        results["stream"] = {"rounds": rows, "best_MBps": best, "ratio_of_best": round(best["remote"] / best["local"], 3),
                             "median_round_ratio": round(pairs[len(pairs) // 2], 3)}

        cache = Path(tempfile.mkdtemp(prefix="ckptfs-bench-remote-cache-"))
        try:
            first = BenchMount(url, OpenOptions.build(cache_dir=str(cache)))
            try:
                some = npy_files(first)[:8]
                stream(first.mnt, some)
            finally:
                first.close()
            before = len(server.access_log())
            second = BenchMount(url, OpenOptions.build(cache_dir=str(cache)))
            try:
                stream(second.mnt, some)
            finally:
                second.close()
            seen = log_since(server, before)
            results["warm_cache_dir"] = {"requests": len(seen), "data_requests": sum(1 for _, n in seen if n > 1)}
        finally:
            subprocess.run(["rm", "-rf", str(cache)], check=False)

    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"machine: {results['machine']}; model file {results['file_bytes'] / MiB:.0f} MiB")
    for h in results["headers"]:
        print(f"mount+list {h['file']}: header {h['header_bytes'] / MiB:.2f} MiB, {h['requests']} requests, "
              f"{h['bytes'] / MiB:.2f} MiB fetched (limit {h['bytes_limit'] / MiB:.2f}), "
              f"{h['mount_list_s']:.2f} s vs local {h['local_mount_list_s']:.2f} s ({h['ratio']}x)")
    r = results["random_4k"]
    print(f"random 4 KiB of {r['file']}: {r['requests']} request(s), {r['bytes'] / 1024:.0f} KiB fetched, "
          f"{r['remote_s'] * 1e3:.1f} ms vs local {r['local_s'] * 1e3:.1f} ms")
    c = results["cold_first_read"]
    print(f"cold first read: {c['remote_s'] * 1e3:.1f} ms vs local {c['local_s'] * 1e3:.1f} ms")
    s = results["stream"]
    print(f"stream every .npy: best remote {s['best_MBps']['remote']} MB/s, best local {s['best_MBps']['local']} MB/s "
          f"(ratio {s['ratio_of_best']}; median of the rounds' remote/local ratios {s['median_round_ratio']})")
    for row in s["rounds"]:
        print(f"  {row['kind']:6} {row['MBps']:8.1f} MB/s  {row['requests']} requests, "
              f"{row['fetched'] / MiB:.0f} MiB fetched")
    w = results["warm_cache_dir"]
    print(f"remount with a warm --cache-dir: {w['requests']} requests, {w['data_requests']} for data")
    return 0


def capped_main(root: Path, args) -> int:
    from benchmarks import remote_cold_start

    results = remote_cold_start.run(root, args)
    out = Path(args.out or root / "cold-start.json")
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2) if args.json else remote_cold_start.render(results))
    print(f"(JSON: {out})", file=sys.stderr)
    return 0
