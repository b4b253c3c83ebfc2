"""A simulated fleet on one machine (results in docs/performance.md and docs/scale.md): N daemons, one origin, one cluster.

For N = 1, 2, 4, 8 (``--fleet``): N ckptfs daemons, each a separate process with its own empty ``--cache-dir``,
mount the same GGUF from one loopback nginx origin (a real-shaped Q4_K_M, scripts/make_realistic_gguf.py
with the shapes of ``--shapes``), capped per request at ``--rate`` (nginx's ``limit_rate``, as an object
store or CDN caps a connection; uncapped without it), with ``--redis-cluster`` on one 3-node Redis Cluster on
loopback (loopback/redis_cluster_server.py), emptied before each N. All start together (one barrier) and stream
the same ``.npy`` files in the same order. Per node: origin bytes (the mount's ``source.bytes``), chunk bytes
the cluster served it instead (``source.shared_bytes``), decoded-group bytes it served (``hit_bytes``),
decoded bytes, leases taken and waits (groups, then chunks), time to the last byte. Fleet-wide: decodes per
group (decoded bytes over one copy's), origin egress over the stored bytes of the tensors read (nginx's own
count of body bytes, the mounts' header reads included), the slowest node's time to last byte over N = 1's,
each Redis node's egress (``INFO stats`` ``total_net_output_bytes`` before and after). Then one later daemon
streams the same files: its decoded and origin bytes and how many nodes served it.

The daemons run the ckptfs of ``$PYTHONPATH``'s first entry when set (another checkout: before/after),
else this one's. Every process shares this machine's cores: the times say what the fleet costs this
machine, not a network's. Usage:
    python -m benchmarks fleet [--fleet 1,2,4,8] [--rate 20m] [--files 40] [--dtype float16] [--json OUT]
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

from benchmarks import REPO, SCRIPTS, SKELETONS, tiers
from benchmarks.tiers import unmount

from loopback.redis_cluster_server import RedisClusterServers
from loopback.servers import Nginx

#: The ckptfs the daemons run: $PYTHONPATH's first entry (another checkout) or this one.
TREE = Path(os.environ["PYTHONPATH"].split(os.pathsep)[0]) if os.environ.get("PYTHONPATH") else REPO


def mount(src, mnt: Path, *args: str) -> Path:
    return tiers.mount(src, mnt, *args, tree=TREE)

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


def origin_sent(server: Nginx, before: int) -> int:
    """Body bytes nginx sent after the first ``before`` lines of its access log."""
    return sum(nbytes for _, _, nbytes in server.request_spans(before))


def run_fleet(n: int, url: str, server: Nginx, cluster: RedisClusterServers, work: Path, names: list[str],
              dtype: str) -> dict:
    for node in cluster.nodes:
        node.command("FLUSHALL")
    before = egress(cluster)
    logged = len(server.access_log())
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
                         "chunk_bytes_from_redis": s["source"].get("shared_bytes", 0),
                         "group_bytes_from_redis": tier["hit_bytes"], "decoded_bytes": s["decoded_bytes"],
                         "leases": tier["leases"], "waited": tier["waited"], "waited_hits": tier["waited_hits"],
                         "chunk_tier": {k[6:]: v for k, v in tier.items() if k.startswith("chunk_")}})
    fleet_origin = origin_sent(server, logged)
    after = egress(cluster)
    logged = len(server.access_log())
    later_mnt = mount(url, work / f"n{n}-later", *args, "--cache-dir", str(work / f"n{n}-later-cache"))
    began = time.monotonic()
    later_streamed = stream(later_mnt, names)
    later = stats(later_mnt)
    later_row = {"ttlb_s": round(time.monotonic() - began, 2), "streamed": later_streamed,
                 "decoded_bytes": later["decoded_bytes"], "nodes": later["tiers"][TIER]["nodes"],
                 "redis_bytes": later["tiers"][TIER]["hit_bytes"], "origin_bytes": origin_sent(server, logged),
                 "chunk_bytes_from_redis": later["source"].get("shared_bytes", 0)}
    for mnt in [*mnts, later_mnt]:
        unmount(mnt)
    return {"n": n, "nodes": per_node, "origin_egress": fleet_origin,
            "redis_egress": [a - b for a, b in zip(after, before)], "later": later_row}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", default="1,2,4,8")
    parser.add_argument("--rate", default=None, help="nginx limit_rate per request, e.g. 20m (default: uncapped)")
    parser.add_argument("--shapes", default=str(SKELETONS / "gemma3-270m-q4_k_m.json"))
    parser.add_argument("--files", type=int, default=0, help="stream the first FILES .npy files (0: all)")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ckptfs-fleet-"))
    try:
        origin = work / "origin"
        origin.mkdir()
        model = origin / "model.gguf"
        subprocess.run([sys.executable, str(SCRIPTS / "make_realistic_gguf.py"), str(model),
                        "--shapes", opts.shapes], check=True, stdout=subprocess.DEVNULL)
        with Nginx(origin, limit_rate=opts.rate) as server, RedisClusterServers() as cluster:
            url = f"{server.url}/model.gguf"
            probe = mount(url, work / "probe", "--dtype", opts.dtype)
            names = sorted(p.name for p in probe.iterdir() if p.name.endswith(".npy"))
            unmount(probe)
            if opts.files:
                names = names[:opts.files]
            import ckptfs

            with ckptfs.open(model) as ck:  # stored bytes of the tensors streamed (a .npy per tensor)
                stored = sum(ck[name[:-4]].info.stored_nbytes for name in names)
            results = {"machine": f"{os.cpu_count()} cores (shared), loopback nginx and Redis Cluster",
                       "load_before": os.getloadavg(), "tree": str(TREE), "rate": opts.rate,
                       "stored_file_bytes": model.stat().st_size, "stored_read_bytes": stored, "files": len(names),
                       "dtype": opts.dtype, "fleets": []}
            for n in (int(x) for x in opts.fleet.split(",")):
                result = run_fleet(n, url, server, cluster, work, names, opts.dtype)
                result["load_after"] = os.getloadavg()
                results["fleets"].append(result)
                print(json.dumps(result), flush=True)
        one_copy = results["fleets"][0]["nodes"][0]["decoded_bytes"] or 1
        single = max(node["ttlb_s"] for node in results["fleets"][0]["nodes"]) or 1
        stored = results["stored_read_bytes"]
        print(f"\nstored bytes of the tensors read: {stored / 1e6:.0f} MB; origin cap per request: {opts.rate or 'none'}")
        print("\n| N | origin egress / stored bytes read | TTLB per node (s) | slowest / N=1 | decodes per group "
              "| per node: origin, chunks from Redis, groups from Redis (MB) | Redis egress per cluster node (MB) "
              "| later daemon: origin MB, decoded / streamed, nodes |")
        print("|---|---|---|---|---|---|---|---|")
        for fleet in results["fleets"]:
            nodes = fleet["nodes"]
            decoded = sum(node["decoded_bytes"] for node in nodes)
            ttlb = ", ".join(f"{node['ttlb_s']:.1f}" for node in nodes)
            per_node = "; ".join(f"{node['origin_bytes'] / 1e6:.0f}, {node['chunk_bytes_from_redis'] / 1e6:.0f}, "
                                 f"{node['group_bytes_from_redis'] / 1e6:.0f}" for node in nodes)
            red = ", ".join(f"{b / 1e6:.0f}" for b in fleet["redis_egress"])
            later = fleet["later"]
            print(f"| {fleet['n']} | {fleet['origin_egress'] / stored:.2f} | {ttlb} "
                  f"| {max(node['ttlb_s'] for node in nodes) / single:.2f} | {decoded / one_copy:.2f} | {per_node} "
                  f"| {red} | {later['origin_bytes'] / 1e6:.0f}, "
                  f"{later['decoded_bytes'] / max(1, later['streamed']):.4f}, {later['nodes']} |")
        if opts.json:
            Path(opts.json).write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0
