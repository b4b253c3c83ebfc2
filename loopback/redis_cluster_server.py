"""A real 3-node Redis Cluster on loopback, for the cluster tier tests and the fleet benchmark.

``RedisClusterServers(3).start()`` runs three ``redis-server --cluster-enabled yes`` (each a
``redis_server.RedisServer``: free port, own folder, no persistence), joins them with ``redis-cli --cluster
create ... --cluster-yes`` (masters only, no replicas), and waits, bounded, until every node reports
``cluster_state:ok``. Nodes run with ``cluster-require-full-coverage no`` (a dead node's slots fail, the
others' keep answering; the setting docs/caches.md tells a fleet to use) and a 2 s node timeout.
``stop()`` ends every node and is safe to call twice; ``kill(i)`` SIGKILLs one.
"""

from __future__ import annotations

import shutil
import subprocess
import time

from loopback.redis_server import RedisServer
from loopback.servers import free_port

REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
CLUSTER_ARGS = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
                "--cluster-require-full-coverage", "no")


class RedisClusterServers:
    def __init__(self, n: int = 3):
        # the cluster bus port is named too: the default (port + 10000) may be taken or past 65535
        self.nodes = [RedisServer(*CLUSTER_ARGS, "--cluster-port", str(free_port())) for _ in range(n)]

    @property
    def seeds(self) -> list[str]:
        return [f"127.0.0.1:{node.port}" for node in self.nodes]

    def cli(self, port: int, *args: str, timeout: float = 30.0) -> str:
        result = subprocess.run([REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), *args], check=False, capture_output=True,
                                text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
        return result.stdout

    def start(self, timeout: float = 30.0) -> RedisClusterServers:
        try:
            for node in self.nodes:
                node.start()
            self.cli(self.nodes[0].port, "--cluster", "create", *self.seeds, "--cluster-yes")
            deadline = time.monotonic() + timeout
            while not all("cluster_state:ok" in self.cli(n.port, "CLUSTER", "INFO") for n in self.nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def dbsize(self, i: int) -> int:
        """Keys held by node ``i`` (DBSIZE over a raw socket)."""
        return int(self.nodes[i].command("DBSIZE").lstrip(b":"))

    def kill(self, i: int) -> None:
        self.nodes[i].kill()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
