"""The Redis tier against a real redis-server on loopback: killed mid-stream, paused (DEBUG SLEEP), full
(maxmemory + noeviction), values overwritten with garbage or with another key's entry.

Whatever the server does, a lookup returns the stored values or None (a miss: the caller decodes), and
returns: each call runs in a thread joined with a generous bound, so a hang fails the test instead of
stalling it. The bound is a hang guard, not a speed assertion.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest
from conftest import bounded, wait_until
from loopback.redis_server import RedisServer
from redis_fixtures import require_redis_server, server  # noqa: F401

pytest.importorskip("redis")

from ckptfs.cache.redis_tier import GROUPS, RedisTier

HANG_GUARD_S = 10.0


def values(seed: int, n: int = 8192) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)








@pytest.fixture
def tier(server):
    t = RedisTier(server.url, backoff=(0.2, 1.0))
    yield t
    t.close()


def test_round_trip_and_batched_lookups(tier):
    for k in range(5):
        tier.put(f"key{k}", values(k))
    assert tier.flush()
    got = tier.get_many([f"key{k}" for k in range(6)])
    for k in range(5):
        np.testing.assert_array_equal(got[k], values(k))
        assert not got[k].flags.writeable
    assert got[5] is None
    np.testing.assert_array_equal(tier.get("key3"), values(3))
    stats = tier.stats()
    assert (stats["hits"], stats["misses"], stats["stored"]) == (6, 1, 5)


def test_values_queued_behind_a_slow_write_are_written_together_each_under_its_key(server, tier):
    server.pause(0.3)  # the first write waits for the server; the rest pile up behind it (one pipeline)
    for k in range(20):
        tier.put(f"queued{k}", values(100 + k))
    assert tier.flush(HANG_GUARD_S)
    got = tier.get_many([f"queued{k}" for k in range(20)])
    for k in range(20):
        np.testing.assert_array_equal(got[k], values(100 + k))
    assert tier.stats()["stored"] == 20 and tier.stats()["errors"] == 0


def test_garbage_and_foreign_values_are_deleted_and_decoded_again(server, tier, caplog):
    tier.put("a", values(1))
    tier.put("b", values(2))
    tier.flush()
    assert server.command("SET", GROUPS.key("a"), "garbage" * 100) == b"+OK"
    client = tier._redis()
    client.set(GROUPS.key("b"), client.get(GROUPS.key("a")))  # now also garbage, under b's name
    tier.put("c", values(3))
    tier.flush()
    client.set(GROUPS.key("a"), client.get(GROUPS.key("c")))  # a valid entry, but for key c
    with caplog.at_level(logging.WARNING, logger="ckptfs.cache.redis_tier"):
        assert tier.get_many(["a", "b"]) == [None, None]
    assert server.command("EXISTS", GROUPS.key("a")) == b":0"
    assert tier.stats()["corrupt"] == 2
    assert len([r for r in caplog.records if "corrupt value" in r.getMessage()]) == 1
    np.testing.assert_array_equal(tier.get("c"), values(3))


def test_killed_mid_stream_then_back(server, tier, caplog):
    for k in range(20):
        tier.put(f"key{k}", values(k))
    tier.flush()
    with caplog.at_level(logging.WARNING, logger="ckptfs.cache.redis_tier"):
        for k in range(10):
            np.testing.assert_array_equal(bounded(tier.get, f"key{k}", guard=HANG_GUARD_S), values(k))
        server.kill()
        for k in range(10, 20):  # the first lookup fails (connection refused), the rest skip Redis
            assert bounded(tier.get, f"key{k}", guard=HANG_GUARD_S) is None
            bounded(tier.put, f"new{k}", values(k), guard=HANG_GUARD_S)
    stats = tier.stats()
    assert not stats["up"] and stats["skipped"] >= 9
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1
    restarted = RedisServer(port=server.port).start()  # same port: the background reconnect finds it
    try:
        assert wait_until(lambda: tier.stats()["up"], timeout=20)
        assert bounded(tier.get, "key0", guard=HANG_GUARD_S) is None  # a fresh server: empty, not stale
        tier.put("key0", values(0))
        tier.flush()
        np.testing.assert_array_equal(tier.get("key0"), values(0))
    finally:
        restarted.stop()


def test_paused_server_costs_one_timeout_then_lookups_skip_it(server, tier):
    for k in range(5):
        tier.put(f"key{k}", values(k))
    tier.flush()
    server.pause(3)
    time.sleep(0.1)
    results = [bounded(tier.get, f"key{k}", guard=HANG_GUARD_S) for k in range(5)]
    assert results == [None] * 5
    stats = tier.stats()
    assert stats["errors"] == 1 and stats["skipped"] == 4  # one timed-out command, then the breaker
    assert wait_until(lambda: tier.stats()["up"], timeout=30)
    for k in range(5):  # no reply meant for a timed-out command is taken for a later one
        np.testing.assert_array_equal(bounded(tier.get, f"key{k}", guard=HANG_GUARD_S), values(k))


def test_full_server_refuses_writes_but_serves_lookups(caplog):
    require_redis_server()
    with RedisServer("--maxmemory", "3mb", "--maxmemory-policy", "noeviction") as server:
        tier = RedisTier(server.url)
        try:
            with caplog.at_level(logging.WARNING, logger="ckptfs.cache.redis_tier"):
                for k in range(80):  # 80 x 32 KiB > 3 MiB
                    bounded(tier.put, f"key{k}", values(k), guard=HANG_GUARD_S)
                assert bounded(tier.flush, guard=HANG_GUARD_S)
            stats = tier.stats()
            assert 0 < stats["stored"] < 80 and stats["up"]
            assert len([r for r in caplog.records if "is full" in r.getMessage()]) == 1
            np.testing.assert_array_equal(bounded(tier.get, "key0", guard=HANG_GUARD_S), values(0))
            assert tier.stats()["hits"] == 1
        finally:
            tier.close()


def test_an_unreachable_url_is_a_miss_not_an_error():
    require_redis_server()
    from loopback.servers import free_port

    tier = RedisTier(f"redis://127.0.0.1:{free_port()}/0")
    try:
        assert bounded(tier.get, "k", guard=HANG_GUARD_S) is None
        bounded(tier.put, "k", values(1), guard=HANG_GUARD_S)
        assert bounded(tier.flush, guard=HANG_GUARD_S)
        assert bounded(tier.get_many, ["a", "b"], guard=HANG_GUARD_S) == [None, None]
        assert not tier.stats()["up"]
    finally:
        tier.close()


def test_bad_urls_are_one_line_errors():
    with pytest.raises(ValueError, match="redis://HOST:PORT/DB"):
        RedisTier("http://localhost:6379")
    for url, words in (("redis://localhost:99999/0", "out of range"), ("redis://localhost:6379/x", "not a number")):
        with pytest.raises(ValueError, match=words):
            RedisTier(url)


def test_values_forged_with_recomputed_checksums_fail_the_key(server, tmp_path, caplog):
    from tier_models import forge

    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    keyed = RedisTier(server.url, key_file=str(key))
    try:
        keyed.put("a", values(1))
        keyed.flush()
        client = keyed._redis()
        client.set(GROUPS.key("a"), forge(client.get(GROUPS.key("a"))))
        with caplog.at_level(logging.WARNING, logger="ckptfs.cache.redis_tier"):
            assert keyed.get_many(["a"]) == [None]
        assert server.command("EXISTS", GROUPS.key("a")) == b":0"
        assert (keyed.stats()["forged"], keyed.stats()["corrupt"]) == (1, 0)
        assert len([r for r in caplog.records if "forged value" in r.getMessage()]) == 1
        unkeyed = RedisTier(server.url)  # trusted as-is: its own values carry no MAC, so they fail the key
        unkeyed.put("b", values(2))
        unkeyed.flush()
        assert keyed.get_many(["b"]) == [None] and keyed.stats()["forged"] == 2
        unkeyed.close()
    finally:
        keyed.close()


def group_key(b0: int, b1: int) -> str:
    from ckptfs.cache.tiered import cache_key

    return cache_key("sha256:" + "ab" * 32, 4096, "Q4_K", "<f4", b0, b1)


def test_a_sequential_reader_gets_several_groups_per_round_trip(tier):
    spans = [(b, min(b + 16, 300)) for b in range(0, 300, 16)]  # 19 groups, the last one cut short
    for i, (b0, b1) in enumerate(spans):
        tier.put(group_key(b0, b1), values(i, 1024))
    tier.flush()
    before = tier.stats()["round_trips"]
    for i, (b0, b1) in enumerate(spans):
        np.testing.assert_array_equal(tier.get(group_key(b0, b1)), values(i, 1024))
    stats = tier.stats()
    assert stats["hits"] == len(spans) and stats["misses"] == 0
    assert stats["round_trips"] - before <= 5  # not 19: the first two alone, then 8 groups per MGET


def test_a_random_reader_fetches_only_what_it_asks(tier):
    spans = [(b, b + 16) for b in range(0, 320, 16)]
    for i, (b0, b1) in enumerate(spans):
        tier.put(group_key(b0, b1), values(i, 1024))
    tier.flush()
    order = [7, 2, 15, 0, 11, 19, 4]
    before = tier.stats()["round_trips"]
    for i in order:
        np.testing.assert_array_equal(tier.get(group_key(*spans[i])), values(i, 1024))
    assert tier.stats()["round_trips"] - before == len(order)
    assert not tier._ahead
