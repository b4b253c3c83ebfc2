#!/usr/bin/env python3
"""A simulated fleet on one machine (issue 25; results in docs/scale.md): N daemons, one origin, one cluster.

For N = 1, 2, 4 (``--fleet``): N ckptfs daemons, each a separate process with its own empty ``--cache-dir``,
mount the same GGUF from one loopback nginx origin (a real-shaped Q4_K_M, scripts/make_realistic_gguf.py
with the shapes of ``--shapes``) with ``--redis-cluster`` on one 3-node Redis Cluster on loopback
(tests/redis_cluster_server.py), emptied before each N. All start together (one barrier) and stream the same
``.npy`` files in the same order. Per node: origin bytes (the mount's ``source.bytes``), Redis bytes (what
the cluster tier served it), decoded bytes, leases taken, waits, time to the last byte. Fleet-wide: decodes
per group (decoded bytes over one copy's), origin egress, each Redis node's egress (``INFO stats``
``total_net_output_bytes`` before and after). Then one later daemon streams the same files: its decoded
bytes and how many nodes served it.

The origin is uncapped loopback nginx and every process shares this machine's cores: the times say what the
fleet costs this machine, not a network's. Usage:
    python scripts/bench_fleet.py [--fleet 1,2,4] [--files 40] [--dtype float16] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))

from bench_tiers import mount, unmount
from redis_cluster_server import RedisClusterServers
from servers import Nginx

CHUNK = 1 << 20
TIER = "redis-cluster"


def stats(mnt: Path) -> dict:
    return json.loads(os.getxattr(str(mnt), "user.ckptfs.stats"))


def settle(mnt: Path, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = stats(mnt)
        if current["tiers"][TIER]["pending"] == 0:
            return current
        time.sleep(0.1)
    return stats(mnt)


def stream(mnt: Path, names: list[str]) -> int:
    total = 0
    for name in names:
        fd = os.open(mnt / name, os.O_RDONLY)
        try:
            while chunk := os.read(fd, CHUNK):
                total += len(chunk)
        finally:
            os.close(fd)
    return total


def egress(cluster: RedisClusterServers) -> list[int]:
    out = []
    for node in cluster.nodes:
        info = cluster.cli(node.port, "INFO", "stats")
        out.append(int(next(line.split(":")[1] for line in info.splitlines()
                            if line.startswith("total_net_output_bytes:"))))
    return out


def run_fleet(n: int, url: str, cluster: RedisClusterServers, work: Path, names: list[str], dtype: str) -> dict:
    for node in cluster.nodes:
        node.command("FLUSHALL")
    before = egress(cluster)
    args = ["--redis-cluster", cluster.seeds[0], "--dtype", dtype]
    mnts = [mount(url, work / f"n{n}-mnt{i}", *args, "--cache-dir", str(work / f"n{n}-cache{i}")) for i in range(n)]
    barrier = threading.Barrier(n + 1)
    done: dict[int, tuple[float, int]] = {}

    def node(i: int) -> None:
        barrier.wait()
        began = time.monotonic()
        got = stream(mnts[i], names)
        done[i] = (time.monotonic() - began, got)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    barrier.wait()
    for thread in threads:
        thread.join()
    per_node = []
    for i, mnt in enumerate(mnts):
        s = settle(mnt)
        tier = s["tiers"][TIER]
        per_node.append({"ttlb_s": round(done[i][0], 2), "streamed": done[i][1], "origin_bytes": s["source"]["bytes"],
                         "redis_bytes": tier["hit_bytes"], "decoded_bytes": s["decoded_bytes"],
                         "leases": tier["leases"], "waited": tier["waited"], "waited_hits": tier["waited_hits"]})
    after = egress(cluster)
    later_mnt = mount(url, work / f"n{n}-later", *args, "--cache-dir", str(work / f"n{n}-later-cache"))
    began = time.monotonic()
    later_streamed = stream(later_mnt, names)
    later = stats(later_mnt)
    later_row = {"ttlb_s": round(time.monotonic() - began, 2), "streamed": later_streamed,
                 "decoded_bytes": later["decoded_bytes"], "nodes": later["tiers"][TIER]["nodes"],
                 "redis_bytes": later["tiers"][TIER]["hit_bytes"], "origin_bytes": later["source"]["bytes"]}
    for mnt in [*mnts, later_mnt]:
        unmount(mnt)
    return {"n": n, "nodes": per_node, "redis_egress": [a - b for a, b in zip(after, before)], "later": later_row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", default="1,2,4")
    parser.add_argument("--shapes", default=str(REPO / "scripts/real-shapes/gemma3-270m-q4_k_m.json"))
    parser.add_argument("--files", type=int, default=0, help="stream the first FILES .npy files (0: all)")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ckptfs-fleet-"))
    try:
        origin = work / "origin"
        origin.mkdir()
        model = origin / "model.gguf"
        subprocess.run([sys.executable, str(REPO / "scripts/make_realistic_gguf.py"), str(model),
                        "--shapes", opts.shapes], check=True, stdout=subprocess.DEVNULL)
        with Nginx(origin) as server, RedisClusterServers() as cluster:
            url = f"{server.url}/model.gguf"
            probe = mount(url, work / "probe", "--dtype", opts.dtype)
            names = sorted(p.name for p in probe.iterdir() if p.name.endswith(".npy"))
            unmount(probe)
            if opts.files:
                names = names[:opts.files]
            sys.path.insert(0, str(REPO))
            import ckptfs

            with ckptfs.open(model) as ck:  # stored bytes of the tensors streamed (a .npy per tensor)
                stored = sum(ck[name[:-4]].info.stored_nbytes for name in names)
            results = {"machine": f"{os.cpu_count()} cores (shared), loopback nginx and Redis Cluster",
                       "stored_file_bytes": model.stat().st_size, "stored_read_bytes": stored, "files": len(names), "dtype": opts.dtype,
                       "fleets": []}
            for n in (int(x) for x in opts.fleet.split(",")):
                result = run_fleet(n, url, cluster, work, names, opts.dtype)
                results["fleets"].append(result)
                print(json.dumps(result), flush=True)
        one_copy = results["fleets"][0]["nodes"][0]["decoded_bytes"] or 1
        print("\n| N | decodes per group | origin egress / stored bytes read | TTLB per node (s) | Redis egress per node (MB) "
              "| later daemon: decoded / streamed, nodes |")
        print("|---|---|---|---|---|---|")
        for fleet in results["fleets"]:
            decoded = sum(node["decoded_bytes"] for node in fleet["nodes"])
            origin_bytes = sum(node["origin_bytes"] for node in fleet["nodes"])
            ttlb = ", ".join(f"{node['ttlb_s']:.1f}" for node in fleet["nodes"])
            red = ", ".join(f"{b / 1e6:.0f}" for b in fleet["redis_egress"])
            later = fleet["later"]
            print(f"| {fleet['n']} | {decoded / one_copy:.2f} | {origin_bytes / results['stored_read_bytes']:.2f} "
                  f"| {ttlb} | {red} | {later['decoded_bytes'] / max(1, later['streamed']):.4f}, {later['nodes']} |")
        if opts.json:
            Path(opts.json).write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
