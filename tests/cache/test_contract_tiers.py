"""The cache-tier contract (``CacheTier`` in ckptfs/cache/tiered.py), one set of tests run over every tier.

Tiers: memory (``BlockCache``), disk (``DiskTier`` in a fresh folder, authenticated under the folder's own
key), Redis (``RedisTier`` against a real redis-server on loopback, authenticated under a key file) and
Redis Cluster (``RedisClusterTier`` against a real 3-node cluster on loopback, the same key file).
Keys are ``CacheKey`` values. Values are offered read-only, as ``TieredCache`` offers them.

What the tiers share: a missing key is None and a counted miss; a value put comes back equal and
read-only, under its own key only (keys that differ in any part find nothing); counters are exact; close
is idempotent. A lower tier that is down (a removed or read-only cache folder, a stopped redis-server)
answers None or what it still holds, and ``put`` returns quietly: it costs speed, never a read. What
differs is stated per tier: ``bytes`` is what the memory tier holds, and what a shared tier served.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import uuid

import numpy as np
import pytest
from conftest import remount_read_only, tmpfs
from loopback.redis_cluster_server import RedisClusterServers
from redis_fixtures import require_redis_cluster, require_redis_server
from loopback.redis_server import RedisServer

from ckptfs.cache.disk import DiskTier
from ckptfs.cache.keys import CacheKey
from ckptfs.cache.tiered import BlockCache

HANG_GUARD_S = 10.0
TIERS = ("memory", "disk", "redis", "redis-cluster")


def value(seed: int, n: int = 4096, dtype=np.float32) -> np.ndarray:
    """A read-only array of ``n`` values (as TieredCache offers them)."""
    out = (np.random.default_rng(seed).standard_normal(n) * 100).astype(dtype)
    out.setflags(write=False)
    return out


def counters(tier) -> dict:
    stats = tier.stats()
    return stats.as_dict() if hasattr(stats, "as_dict") else stats


def settle(tier) -> None:
    """Wait for a tier's queued writes (disk and Redis write in the background)."""
    flush = getattr(tier, "flush", None)
    if flush is not None:
        assert flush(HANG_GUARD_S)


def bounded(call, *args):
    """``call(*args)``, failing the test if it does not return within HANG_GUARD_S (a hang guard)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(call, *args).result(timeout=HANG_GUARD_S)


@pytest.fixture(scope="module")
def redis_server():
    require_redis_server()
    pytest.importorskip("redis")
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def redis_cluster():
    require_redis_cluster()
    with RedisClusterServers() as cluster:
        yield cluster


def key_file(folder) -> str:
    path = folder / "cache.key"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return str(path)


def make_tier(name: str, tmp_path, request):
    if name == "memory":
        return BlockCache(64 << 20)
    if name == "disk":
        return DiskTier(tmp_path / "cache", 1 << 30)
    if name == "redis-cluster":
        from ckptfs.cache.redis_cluster import RedisClusterTier

        cluster = request.getfixturevalue("redis_cluster")
        for node in cluster.nodes:
            assert node.command("FLUSHALL") == b"+OK"
        return RedisClusterTier(cluster.seeds[:1], backoff=(0.2, 1.0), key_file=key_file(tmp_path))
    from ckptfs.cache.redis_tier import RedisTier

    server = request.getfixturevalue("redis_server")
    assert server.command("FLUSHALL") == b"+OK"
    return RedisTier(server.url, backoff=(0.2, 1.0), key_file=key_file(tmp_path))


@pytest.fixture(params=TIERS)
def tier(request, tmp_path):
    made = make_tier(request.param, tmp_path, request)
    yield made
    made.close()


def key(b0: int = 0, content_id: str | None = None, **changes) -> CacheKey:
    parts = dict(content_id=content_id or "sha256:" + uuid.uuid4().hex, offset=4096, kind="Q4_K", form="<f4",
                 start=b0, stop=b0 + 8)
    parts.update(changes)
    return CacheKey(**parts)


def test_a_missing_key_is_none_and_a_counted_miss(tier):
    before = counters(tier)
    assert tier.get(key()) is None
    assert tier.contains(key()) is False
    after = counters(tier)
    assert (after["misses"] - before["misses"], after["hits"] - before["hits"]) == (1, 0)


def test_put_then_get_returns_equal_read_only_values(tier):
    keys = [key(), key(), key()]
    values = [value(1), value(2, 1000, np.float16), value(3, 333, np.int8)]
    for k, v in zip(keys, values):
        tier.put(k, v)
    settle(tier)
    for k, v in zip(keys, values):
        assert tier.contains(k) is True
        got = tier.get(k)
        assert got is not None and got.dtype == v.dtype and not got.flags.writeable
        np.testing.assert_array_equal(got, v)


def test_counters_are_exact(tier):
    k, absent = key(), key()
    tier.put(k, value(4))
    settle(tier)
    start = counters(tier)
    for key_name in ("hits", "misses", "bytes"):
        assert isinstance(start[key_name], int)
    for _ in range(3):
        assert tier.get(k) is not None
    for _ in range(2):
        assert tier.get(absent) is None
    tier.contains(k)  # not a lookup: counted neither way
    end = counters(tier)
    assert (end["hits"] - start["hits"], end["misses"] - start["misses"]) == (3, 2)
    if isinstance(tier, BlockCache):  # the memory tier: the bytes it holds
        assert end["bytes"] == value(4).nbytes
    else:  # a shared tier: the bytes it served
        assert end["bytes"] - start["bytes"] == 3 * value(4).nbytes


@pytest.mark.parametrize("part, other", [("content_id", "sha256:00"), ("offset", 8192),
                                         ("kind", "Q6_K"), ("form", "<f2"), ("start", 8), ("stop", 9)])
def test_a_value_is_never_returned_for_another_key(tier, part, other):
    mine = key()
    theirs = key(**{"content_id": mine.content_id, part: other})
    assert theirs != mine and str(theirs) != str(mine)
    tier.put(mine, value(5))
    settle(tier)
    assert tier.get(theirs) is None and tier.contains(theirs) is False
    tier.put(theirs, value(6))
    settle(tier)
    np.testing.assert_array_equal(tier.get(mine), value(5))
    np.testing.assert_array_equal(tier.get(theirs), value(6))


def test_sequential_keys_of_one_tensor_each_get_their_own_value(tier):
    """Consecutive block ranges of one tensor (a sequential reader; Redis fetches ahead for it)."""
    first = key(0)
    keys = [first.with_range(8 * i, 8 * (i + 1)) for i in range(6)]
    for i, k in enumerate(keys[:5]):
        tier.put(k, value(10 + i))
    settle(tier)
    for i, k in enumerate(keys[:5]):
        np.testing.assert_array_equal(tier.get(k), value(10 + i))
    assert tier.get(keys[5]) is None


def test_close_is_idempotent(tier):
    k = key()
    tier.put(k, value(7))
    settle(tier)
    tier.close()
    tier.close()
    got = tier.get(k)  # after close: nothing, or what was stored — never another value, never an error
    assert got is None or np.array_equal(got, value(7))


# -- a tier that is down: (how it goes down, get of what it held, get of a value put while down) ---------------
DOWN = {"disk-removed": (None, "equal"), "disk-read-only": ("equal", None), "redis-stopped": (None, None),
        "cluster-stopped": (None, None)}


def remove_folder(root) -> None:
    """The cache folder gone at once, as ``rm -rf`` run by someone else leaves it: renamed away in one step, then
    deleted (a tier's background prune may still be writing its lock file in it, which made a plain rmtree
    fail with "Directory not empty" on a loaded machine)."""
    gone = root.with_name(root.name + ".removed")
    os.rename(root, gone)
    shutil.rmtree(gone, ignore_errors=True)


@pytest.fixture(params=sorted(DOWN))
def down(request, tmp_path):
    """(tier, take_down) for each way a shared tier goes down."""
    how = request.param
    if how == "redis-stopped":
        require_redis_server()
        pytest.importorskip("redis")
        from ckptfs.cache.redis_tier import RedisTier

        server = RedisServer().start()
        made = RedisTier(server.url, backoff=(0.2, 1.0), key_file=key_file(tmp_path))
        yield how, made, server.kill
        made.close()
        server.stop()
    elif how == "cluster-stopped":
        require_redis_cluster()
        from ckptfs.cache.redis_cluster import RedisClusterTier

        cluster = RedisClusterServers().start()
        made = RedisClusterTier(cluster.seeds, backoff=(0.2, 1.0), key_file=key_file(tmp_path))
        yield how, made, lambda: [cluster.kill(i) for i in range(len(cluster.nodes))]
        made.close()
        cluster.stop()
    elif how == "disk-removed":
        root = tmp_path / "cache"
        made = DiskTier(root, 1 << 30)
        yield how, made, lambda: remove_folder(root)
        made.close()
    else:
        with tmpfs(tmp_path / "ro", "8m") as root:
            made = DiskTier(root, 1 << 30)
            yield how, made, lambda: remount_read_only(root, made.store)
            made.close()


def test_a_tier_that_is_down_answers_none_and_put_returns_quietly(down):
    how, tier, take_down = down
    held, new, never = key(), key(), key()
    tier.put(held, value(8))
    settle(tier)
    np.testing.assert_array_equal(tier.get(held), value(8))
    take_down()
    start = counters(tier)
    expect_held, expect_new = DOWN[how]
    got = bounded(tier.get, held)
    if expect_held == "equal":
        np.testing.assert_array_equal(got, value(8))
    else:
        assert got is None
    assert bounded(tier.put, new, value(9)) is None
    settle(tier)
    got = bounded(tier.get, new)
    if expect_new == "equal":  # a removed folder is made again by the next write
        np.testing.assert_array_equal(got, value(9))
    else:
        assert got is None
    assert bounded(tier.get, never) is None
    assert bounded(tier.contains, never) is False
    end = counters(tier)
    misses = 1 + (expect_held is None) + (expect_new is None)
    assert end["misses"] - start["misses"] == misses
    tier.close()
    tier.close()
