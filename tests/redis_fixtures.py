"""The Redis tests' side of loopback/redis_server.py and loopback/redis_cluster_server.py: the checks that skip
a test (fail it under ``CI=true``) without redis-server, redis-cli or redis-py, and ``server``, a fixture that
yields a started redis-server and stops it at teardown whatever happened.
"""

from __future__ import annotations

import os

import pytest

from loopback.redis_cluster_server import REDIS_CLI
from loopback.redis_server import REDIS_SERVER, RedisServer


def require_redis_server() -> None:
    if not os.access(REDIS_SERVER, os.X_OK):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("required in CI: redis-server is not installed")
        pytest.skip("redis-server is not installed")


def require_redis_cluster() -> None:
    """Skip (fail under CI=true) without redis-server, redis-cli or redis-py."""
    require_redis_server()
    if not os.access(REDIS_CLI, os.X_OK):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("required in CI: redis-cli is not installed")
        pytest.skip("redis-cli is not installed")
    pytest.importorskip("redis")


@pytest.fixture
def server():
    require_redis_server()
    srv = RedisServer().start()
    try:
        yield srv
    finally:
        srv.stop()
