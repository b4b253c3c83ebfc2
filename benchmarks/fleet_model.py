"""The fleet model of docs/scale.md: N nodes cold-starting a 70B Q4_K_M GGUF from S3, with and without Redis.

Every input is a named parameter (measured here: decode and Redis per-group costs
from the ``tiers`` workload; the requests a node keeps in flight and their size from ``remote --capped``;
assumed: S3 latency and bandwidth) so anyone can change one and redo the table.

Usage: python -m benchmarks fleet_model [--decode-ms 0.046] [--redis-server-bps 1.45e9] [--redis-nodes 3] ...
(every field of Params is a flag)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

GB = 1e9
MIB = 1 << 20


@dataclass
class Params:
    params: float = 70.55e9          # Llama-3-70B
    stored: float = 42.5 * GB        # its Q4_K_M GGUF
    out_itemsize: int = 2            # served as float16 (--dtype float16)
    group_out: int = 256 * 1024      # one decoded block group (ckptfs/engine/blocks.py GROUP_TARGET_BYTES)
    request: int = 8 * MIB           # remote read-ahead request size for s3:// (measured median, docs/remote.md)
    in_flight: float = 8.8           # requests in flight per node, time-weighted mean (measured, docs/remote.md)
    s3_latency: float = 0.050        # s to first byte per request (assumed)
    s3_conn_bps: float = 90e6        # bytes/s per connection (assumed)
    s3_prefix_rps: float = 5500      # GET/s per prefix before S3 throttles (AWS guideline)
    decode_ms: float = 0.046         # per 256 KiB float16 group of Q4_K, C kernel (measured: 0.023 ms per 64 Ki elements)
    decode_cores: int = 4            # cores decoding at once in one daemon (assumed)
    redis_put_ms: float = 0.25       # per group, measured on loopback
    redis_client_bps: float = 1.0e9  # one daemon reading groups from Redis (measured 0.25 ms per 256 KiB)
    redis_server_bps: float = 1.45e9 # one Redis instance's egress (measured: 256 KiB GET in 0.18 ms, unloaded)
    redis_nodes: int = 3             # masters of the Redis Cluster of the cold-fleet row (as the fleet workload's)

    @property
    def decoded(self) -> float:
        return self.params * self.out_itemsize

    @property
    def groups(self) -> float:
        return self.decoded / self.group_out


def fetch_seconds(p: Params) -> float:
    per_request = p.s3_latency + p.request / p.s3_conn_bps
    return p.stored / (p.in_flight * p.request / per_request)


def decode_seconds(p: Params) -> float:
    return p.groups * p.decode_ms / 1e3 / p.decode_cores


def rows(p: Params, nodes=(1, 10, 100)) -> list[dict]:
    requests = p.stored / p.request
    t_fetch, t_decode = fetch_seconds(p), decode_seconds(p)
    t_node = max(t_fetch, t_decode)  # fetching and decoding overlap (read-ahead)
    out = []
    for n in nodes:
        rate = n * requests / t_node
        throttle = max(1.0, rate / p.s3_prefix_rps)
        out.append({"nodes": n, "tier": "no Redis", "requests/node": requests, "requests": n * requests,
                    "fetched/node": p.stored, "fetched": n * p.stored, "decoded/node": p.decoded,
                    "decoded": n * p.decoded, "cold start s": t_node * throttle,
                    "s3 GET/s": rate / throttle})
        # Redis, filled ahead of the rollout by one `ckptfs prefetch` (it fetches and decodes once)
        t_prefetch = max(t_fetch, t_decode, p.groups * p.redis_put_ms / 1e3)
        t_serve = p.decoded / min(p.redis_client_bps, p.redis_server_bps / n)
        out.append({"nodes": n, "tier": "Redis (prefetched)", "requests/node": 0, "requests": requests,
                    "fetched/node": 0, "fetched": p.stored, "decoded/node": 0, "decoded": p.decoded,
                    "cold start s": t_serve, "prefetch s": t_prefetch, "redis egress": n * p.decoded})
        # a cold fleet on a Redis Cluster (--redis-cluster), all nodes starting together: fetched chunks and
        # decoded groups are single-flighted fleet-wide (docs/caches.md), so S is fetched and D decoded once,
        # 1/N by each node, and each node pulls the other nodes' share of both from the cluster (every node's
        # read-ahead reads all of S; the fleet workload measured this at N = 1..8)
        share = (n - 1) / n
        t_pull = (p.stored + p.decoded) * share / min(p.redis_client_bps, p.redis_nodes * p.redis_server_bps / n)
        t_own = max(t_fetch / n, t_decode / n, p.groups * p.redis_put_ms / 1e3 / n)
        out.append({"nodes": n, "tier": f"Redis Cluster of {p.redis_nodes}, cold", "requests/node": requests / n,
                    "requests": requests, "fetched/node": p.stored / n, "fetched": p.stored,
                    "decoded/node": p.decoded / n, "decoded": p.decoded,
                    "cold start s": max(t_own, t_pull),
                    "redis egress": n * (p.stored + p.decoded) * share})
    return out


def human(x: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if x >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} B"


def markdown(table: list[dict]) -> str:
    lines = ["| N | tier | S3 requests per node / total | fetched per node / total | decoded per node / total "
             "| cold start per node |", "|---|---|---|---|---|---|"]
    for r in table:
        start = f"{r['cold start s']:.0f} s"
        if "prefetch s" in r:
            start += f" (after a {r['prefetch s']:.0f} s prefetch)"
        lines.append(f"| {r['nodes']} | {r['tier']} | {r['requests/node']:,.0f} / {r['requests']:,.0f} | "
                     f"{human(r['fetched/node']) if r['fetched/node'] else '0'} / {human(r['fetched'])} | "
                     f"{human(r['decoded/node']) if r['decoded/node'] else '0'} / {human(r['decoded'])} | {start} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in Params().__dict__.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = parser.parse_args(argv)
    p = Params(**{k: getattr(args, k) for k in Params().__dict__})
    print(f"decoded output {human(p.decoded)} in {p.groups:,.0f} groups; per node: fetch {fetch_seconds(p):.0f} s, "
          f"decode {decode_seconds(p):.0f} s")
    print(markdown(rows(p)))
    return 0
