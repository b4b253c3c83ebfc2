"""The ``redis-cluster`` cache tier (``--redis-cluster HOST:PORT``, repeatable): decoded block groups spread
over the slots of a Redis Cluster, so a fleet's reads are served by every node instead of one server.

It is the single-node tier (``redis_tier.py``: checked and authenticated entries, short timeouts, the
background writer, batched look-ahead, the cross-process lease) with three things done differently:

- **The client** is redis-py's ``RedisCluster``, built from the seed nodes given (the rest of the cluster is
  discovered from them); it follows MOVED and ASK itself, so a resharding in progress costs a redirect, never
  a read. Its own retry loop is off (as the single-node tier's is) and it accepts a cluster whose slots are
  not all covered (``require_full_coverage=False``): a dead node's slots are misses, the rest still serve.
- **A breaker per node.** Each node has its own ``Breaker``: a node that dies or stalls costs its keys one
  timeout, then they are misses (decoded) while the other nodes keep serving; the node is pinged in the
  background and its keys served again once it answers. The tier-wide breaker guards the client itself
  (no seed reachable: every lookup a miss until one answers).
- **Batches per node.** MGET only works for keys of one slot, and a group's keys are spread over slots on
  purpose (a tensor's groups land on every node). A batch lookup is grouped by the node that holds each key
  (the client's slot table) and sent as one pipeline of GETs per node: one round trip per node asked, and a
  dead node fails only its own share.

Keys are the single-node tier's (``ckptfs:e1:<digest>``, leases ``ckptfs:l1:<digest>``; another namespace's
prefixes for another namespace, ``redis_tier.Namespace``), so a fleet can
move from one server to a cluster and a ``ckptfs prefetch --redis-cluster`` warms what mounts then read.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ckptfs.cache.breaker import Breaker
from ckptfs.cache.redis_tier import (
    FAILED,
    BACKOFF_S,
    CONNECT_TIMEOUT_S,
    GROUPS,
    OP_TIMEOUT_S,
    Namespace,
    RedisTier,
)


def check_seed(seed: str) -> tuple[str, int]:
    """(host, port) of a ``HOST:PORT`` seed node; ValueError with a one-line reason otherwise."""
    host, sep, port = str(seed).strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--redis-cluster wants HOST:PORT (a seed node of the cluster), not {seed!r}")
    return host, int(port)


class RedisClusterTier(RedisTier):
    """Get/put decoded groups in a Redis Cluster; every method returns quickly whatever the nodes do."""

    name = "redis-cluster"

    def __init__(self, seeds: str | Sequence[str], connect_timeout: float = CONNECT_TIMEOUT_S,
                 op_timeout: float = OP_TIMEOUT_S, backoff: tuple[float, float] = BACKOFF_S,
                 key_file: str | os.PathLike[str] | None = None, namespace: Namespace = GROUPS) -> None:
        if isinstance(seeds, str):
            seeds = [seeds]
        self.seeds = [check_seed(seed) for seed in seeds]
        if not self.seeds:
            raise ValueError("--redis-cluster needs at least one HOST:PORT seed node")
        self._nodes: dict[str, Breaker] = {}
        self._nodes_lock = threading.Lock()
        self._setup(connect_timeout, op_timeout, backoff, key_file, namespace)
        self._breaker = Breaker(self._where(), self._redis, lambda: None, backoff)  # ping: build the client

    def _connect(self) -> Any:  # a redis.cluster.RedisCluster
        from redis.backoff import NoBackoff
        from redis.cluster import ClusterNode, RedisCluster
        from redis.retry import Retry

        connect_timeout, op_timeout = self._timeouts
        nodes = [ClusterNode(host, port) for host, port in self.seeds]  # type: ignore[no-untyped-call, unused-ignore]
        return RedisCluster(startup_nodes=nodes,
                            socket_connect_timeout=connect_timeout, socket_timeout=op_timeout,
                            retry=Retry(NoBackoff(), 0), require_full_coverage=False)

    def _redis(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._connect()  # may raise: no seed answers (the tier-wide breaker's case)
            return self._client

    def _node_of(self, name: str) -> Any:
        """The node holding ``name`` per the client's slot table; None when there is no client (counted as a
        tier-wide failure) or the slot is not covered."""
        if not self._breaker.available():
            self._count(skipped=1)
            return None
        try:
            client = self._redis()
        except Exception as exc:  # noqa: BLE001 - no seed answered: every lookup a miss until one does
            self._failed(exc, self._breaker)
            return None
        try:
            return client.get_node_from_key(name)
        except Exception:  # noqa: BLE001 - a slot no node covers: a miss
            return None

    def _node_breaker(self, node: Any) -> Breaker:
        with self._nodes_lock:
            breaker = self._nodes.get(node.name)
            if breaker is None:
                def ping(node: Any = node) -> None:
                    self._redis().get_redis_connection(node).ping()

                def drop(node: Any = node) -> None:
                    self._redis().get_redis_connection(node).connection_pool.disconnect()

                breaker = self._nodes[node.name] = Breaker(node.name, ping, drop, self._backoff)
            return breaker

    def _route(self, name: str) -> Breaker | None:
        node = self._node_of(name)
        return None if node is None else self._node_breaker(node)

    def _read(self, names: list[str]) -> list[bytes | None]:
        """GETs of ``names`` grouped by node, one pipeline (one round trip) per node; a node that is down or
        fails answers None for its own keys only."""
        return [None if value is FAILED else value for value in self._batch(names, lambda pipe, name: pipe.get(name))]

    def _batch(self, names: list[str], add: Callable[[Any, str], None], counted: bool = True) -> list[Any]:
        """One command per name (``add(pipeline, name)``), grouped by the node holding each: one pipeline (one
        round trip, counted unless ``counted`` is False) per node; a node that is down or fails answers
        ``FAILED`` for its own keys only."""
        by_node: dict[str, list[int]] = {}
        nodes = {}
        for i, name in enumerate(names):
            node = self._node_of(name)
            if node is not None:
                by_node.setdefault(node.name, []).append(i)
                nodes[node.name] = node
        replies: list[Any] = [FAILED] * len(names)
        for node_name, positions in by_node.items():
            def batch(client: Any, positions: list[int] = positions) -> Any:
                pipe = client.pipeline()
                for i in positions:
                    add(pipe, names[i])
                return pipe.execute()

            got = self._command(names[positions[0]], batch, self._node_breaker(nodes[node_name]))
            if got is FAILED:
                continue
            self._count(round_trips=int(counted))
            for i, value in zip(positions, got):
                replies[i] = value
        return replies

    def _where(self) -> str:
        return "cluster " + ",".join(f"{host}:{port}" for host, port in self.seeds)

    def _up(self) -> bool:
        with self._nodes_lock:
            return not self._breaker.down and not any(b.down for b in self._nodes.values())

    def stats(self) -> dict[str, Any]:
        """The single-node tier's counters, plus ``nodes`` (known so far) and ``nodes_down``."""
        stats = super().stats()
        with self._nodes_lock:
            stats.update(nodes=len(self._nodes), nodes_down=sum(b.down for b in self._nodes.values()))
        return stats

    def close(self) -> None:
        super().close()
        with self._nodes_lock:
            for breaker in self._nodes.values():
                breaker.close()
