"""A fleet fetches once: daemons mounting one http origin with one Redis (or Redis Cluster) share the stored
bytes they fetch (``ckptfs.sources.remote.store.chunks``' shared tier), checked against a real nginx's access log.

Every byte is compared with the reference (gguf-py's values and stored bytes, the file itself); the origin's
bytes are counted from nginx's own log. A stopped Redis and a lease whose holder never stores must cost
speed, never a byte or a hang: each read runs under a hang guard (a bound, not a speed assertion).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import bounded, mount_stats, nginx_origin
from fixtures import quantized, write_gguf
from loopback.redis_cluster_server import RedisClusterServers
from redis_fixtures import require_redis_cluster, require_redis_server
from redis_fixtures import server as redis  # noqa: F401 - the fixture: a started redis-server
from loopback.redis_server import RedisServer
from loopback.servers import Nginx, requests_since
from tier_models import expected_files, read_all


pytest.importorskip("redis")

from ckptfs.core.runtime import runtime
from ckptfs.cache import entry
from ckptfs.sources.remote.store import chunks
from ckptfs.sources.remote.store.chunks import CHUNK, chunk_key
from ckptfs.cache.redis_tier import RedisTier
from ckptfs.sources.registry import Opener
from ckptfs.core.options import OpenOptions
from ckptfs.sources.remote.options import RemoteOptions

HANG_GUARD_S = 120.0


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    """A GGUF of about 23 MB (eight Q4_K tensors and an F32 one) served by nginx at 40 MB/s per request
    (so that daemons streaming together overlap); its expected files and stored bytes."""
    def fill(root):
        rng = np.random.default_rng(25)
        tensors = {f"blk.{i}.q4k": (quantized("Q4_K", (1024, 4096), rng), "Q4_K") for i in range(8)}
        tensors["out.f32"] = (rng.standard_normal((1024, 1024)).astype(np.float32), "F32")
        return write_gguf(root / "model.gguf", tensors)

    with nginx_origin(tmp_path_factory, fill, "origin", limit_rate="40m") as (server, root, written):
        expected = expected_files({name: ref.array for name, ref in written.tensors.items()})
        expected.update({f"{name}.raw": ref.raw for name, ref in written.tensors.items()})
        yield server, root / "model.gguf", expected, sum(len(ref.raw) for ref in written.tensors.values())


def origin_bytes(server: Nginx, before: int, checks: bool = True) -> int:
    """Body bytes nginx sent after the first ``before`` lines of its log (``checks`` False: without the
    re-checks of the file's last 4 KiB that follow each fetch, nginx's ETag being weak)."""
    return sum(nbytes for _, _, nbytes in requests_since(server, before, checks=checks))


def stream_together(mnts: list[Path], expected: dict[str, bytes], meanwhile=None) -> None:
    """Every mount reads every expected file at once (one barrier), each compared with its reference;
    ``meanwhile()`` is called once, by the first mount's reader as it opens the third file (the others are
    mid-stream then)."""
    barrier = threading.Barrier(len(mnts))
    errors: list[BaseException] = []

    def node(k: int, mnt: Path) -> None:
        try:
            barrier.wait(30)
            for n, name in enumerate(expected):
                if k == 0 and n == 2 and meanwhile is not None:
                    meanwhile()
                read_all(mnt, {name: expected[name]}, chunk=1 << 20)
        except BaseException as exc:  # noqa: BLE001 - reported in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(k, mnt), daemon=True) for k, mnt in enumerate(mnts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_GUARD_S)
        assert not thread.is_alive(), f"a daemon's stream did not finish within {HANG_GUARD_S} s"
    assert not errors, errors


@pytest.mark.parametrize("shared", ["redis", "redis-cluster"])
def test_daemons_streaming_together_fetch_one_copy_from_the_origin(mounted, origin, tmp_path, shared):
    server, _, expected, stored = origin
    require_redis_cluster() if shared == "redis-cluster" else require_redis_server()
    with (RedisClusterServers() if shared == "redis-cluster" else RedisServer()) as redis:
        args = ["--redis-cluster", redis.seeds[0]] if shared == "redis-cluster" else ["--redis", redis.url]
        url = f"{server.url}/model.gguf"
        mnts = [mounted(url, *args, "--cache-dir", str(tmp_path / f"cache{i}")) for i in range(3)]
        before = len(server.access_log())  # the mounts' header reads are each their own
        stream_together(mnts, expected)
        sent = origin_bytes(server, before)
        stats = [mount_stats(mnt) for mnt in mnts]
    # one copy, where every daemon fetching its own (main before the chunk tier) is 3 copies less the headers
    assert sent <= 1.5 * stored, (sent, stored)
    shared_bytes = [s["source"]["shared_bytes"] for s in stats]
    tiers = [s["tiers"][shared] for s in stats]
    assert sum(shared_bytes) >= stored, shared_bytes  # the other copies came from the shared tier
    assert sum(t["chunk_leases"] for t in tiers) * CHUNK >= 0.5 * stored, tiers
    assert all(t["chunk_forged"] == t["chunk_corrupt"] == 0 for t in tiers)


def test_redis_killed_mid_stream_every_byte_is_right_and_reads_go_to_the_origin(mounted, origin, tmp_path):
    server, _, expected, stored = origin
    require_redis_server()
    url = f"{server.url}/model.gguf"
    names = sorted(expected)
    with RedisServer() as redis:
        mnts = [mounted(url, "--redis", redis.url, "--cache-dir", str(tmp_path / f"cache{i}")) for i in range(2)]
        stream_together(mnts, {name: expected[name] for name in names}, meanwhile=redis.kill)  # SIGKILL
        assert redis.proc.poll() is not None
        later = mounted(url, "--redis", redis.url, "--cache-dir", str(tmp_path / "cache-later"))
        before = len(server.access_log())
        bounded(read_all, later, expected, 1 << 20, guard=HANG_GUARD_S)
        sent = origin_bytes(server, before, checks=False)
        tier = mount_stats(later)["tiers"]["redis"]
    assert sent >= stored - 2 * (1 << 20), (sent, stored)  # all but what its header read brought: the origin's
    assert tier["chunk_up"] == 0 and tier["chunk_hits"] == 0, tier
    assert tier["chunk_errors"] + tier["chunk_skipped"] > 0, tier


@pytest.fixture
def sources(origin, redis):
    """(nginx, the file's bytes, ``fresh()``: a new remote source of the file sharing its chunks through the
    test's Redis, this process's chunk memory emptied first: what it reads comes from Redis or the origin)."""
    server, path, _, _ = origin
    options = {"redis": redis.url}

    def fresh():
        runtime().get(chunks.MEMORY_CHUNKS).clear()
        return Opener(RemoteOptions(OpenOptions.build(**options))).source(f"{server.url}/model.gguf")

    return server, path.read_bytes(), fresh


def test_one_piece_costs_one_lookup_and_one_lease_round_trip_and_bad_entries_are_fetched(sources, redis):
    server, data, fresh = sources
    first = fresh()
    tier = first.fetcher.cache.shared
    start, end = 8 * CHUNK, 24 * CHUNK  # 16 chunks: one piece, past what the open's header read cached
    trips = tier.stats()["round_trips"]
    before = len(server.access_log())
    assert bounded(first.pread, start, end - start) == data[start:end]
    assert tier.stats()["round_trips"] - trips == 2  # one MGET, one pipeline of SET NX PX
    assert tier.flush(30)
    assert origin_bytes(server, before, checks=False) == end - start

    second = fresh()
    trips, before = tier.stats()["round_trips"], len(server.access_log())
    assert bounded(second.pread, start, end - start) == data[start:end]
    assert tier.stats()["round_trips"] - trips == 1 and origin_bytes(server, before) == 0  # no request at all

    garbage, short = (chunk_key(second.content_id(), i) for i in (10, 11))
    redis.command("SET", chunks.BYTES.key(garbage), "garbage" * 100)
    header, payload = entry.encode(short, np.zeros(100, np.uint8))  # a valid entry, of another length
    import redis as redis_py

    redis_py.Redis.from_url(redis.url).set(chunks.BYTES.key(short), header + bytes(payload))
    third = fresh()
    corrupt, before = tier.stats()["corrupt"], len(server.access_log())
    assert bounded(third.pread, start, end - start) == data[start:end]
    assert tier.stats()["corrupt"] - corrupt == 1
    assert requests_since(server, before, checks=False) == [("/model.gguf", 206, 2 * CHUNK)]  # chunks 10, 11


def test_a_lease_nobody_fills_is_waited_out_then_fetched_from_the_origin(sources, redis):
    server, data, fresh = sources
    source = fresh()
    tier = source.fetcher.cache.shared
    lease_ms = 1500
    held = range(30, 34)  # leased by "another node" that never stores a value
    for i in held:
        reply = redis.command("SET", chunks.BYTES.lease(chunk_key(source.content_id(), i)), "gone:1", "NX", "PX",
                              str(lease_ms))
        assert reply == b"+OK"
    leased_at = time.time()
    waited = tier.stats()
    before = len(server.access_log())
    start, end = 28 * CHUNK, 36 * CHUNK
    assert bounded(source.pread, start, end - start) == data[start:end]
    stats = tier.stats()
    assert stats["waited"] - waited["waited"] == len(held) and stats["waited_hits"] == waited["waited_hits"]
    assert origin_bytes(server, before, checks=False) == end - start  # every chunk once, the held ones too
    spans = server.request_spans(before)
    # the held chunks were asked for after their lease ended (nginx's millisecond clock), or Redis did not
    # answer the waiter (a loaded machine's timeouts: fetching then is the design)
    late = [s for s, _, nbytes in spans if nbytes == len(held) * CHUNK]
    unanswered = stats["errors"] + stats["skipped"] - waited["errors"] - waited["skipped"]
    assert late and (min(late) >= leased_at + lease_ms / 1000 - 0.1 or unanswered > 0), (spans, leased_at)

    released = range(40, 42)  # a holder that gives its leases up: the waiter goes on at once
    holder = RedisTier(redis.url, namespace=chunks.BYTES)
    keys = [chunk_key(source.content_id(), i) for i in released]
    assert holder.lease_many(keys) == [True, True] and tier.lease_many(keys) == [False, False]
    holder.release_many(keys)
    assert bounded(tier.wait_many, keys, 5.0) == [None, None]
    assert tier.lease_many(keys) == [True, True]
    holder.close()
