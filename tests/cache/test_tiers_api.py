"""Shared tiers through the library API and the cache commands: a second process (or open) finds what the
first decoded; a checkpoint rewritten in place never gets the old entries; ``Tensor.shared()`` gives N
processes one copy; ``ckptfs prefetch`` and ``ckptfs cache`` work on a real folder and a real Redis. The
tier seam: a lower tier built outside the checkpoint (a dict) gets decoded groups keyed by content identity,
serves another checkpoint without decoding, and is closed by the mount's ``destroy``.

Oracle: gguf-py's dequantize of the bytes gguf-py's writer stored (tests/fixtures.py).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runs import run_cli
from conftest import cli_env
from loopback.redis_server import RedisServer
from redis_fixtures import require_redis_server
from fixtures import write_mixed_gguf
from tier_models import write_model

import ckptfs
from ckptfs.cache.tiered import BlockCache, CacheTier, TieredCache
from ckptfs.checkpoint.api import Checkpoint
from ckptfs.formats.multi import read_checkpoint
from ckptfs.fuse.operations import CkptOperations
from ckptfs.tree.mount_tree import MountTree


def read_by_rows(ck) -> dict[str, np.ndarray]:
    """Every tensor by windows of rows (whole-range reads: through the shared tiers when configured)."""
    out = {}
    for name, t in ck.items():
        out[name] = np.concatenate([t[i:i + 8].reshape(-1) for i in range(0, t.shape[0], 8)]).reshape(t.shape)
    return out


def assert_values(got: dict, refs: dict) -> None:
    for name, ref in refs.items():
        np.testing.assert_array_equal(got[name], ref.astype(got[name].dtype), err_msg=name)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.gguf"
    return path, write_model(path, seed=1)


def test_a_second_open_reads_the_first_ones_groups_from_disk(model, tmp_path):
    path, refs = model
    cache_dir = tmp_path / "cache"
    with ckptfs.open(path, cache_size=0, cache_dir=str(cache_dir)) as first:
        assert_values(read_by_rows(first), refs)
        decoded_first = first.cache.decoded_bytes
        first.cache.flush()  # the disk tier writes on a thread of its own: "stored" counts what landed
        assert first.cache.tier_stats()["disk"]["stored"] > 0
    with ckptfs.open(path, cache_size=0, cache_dir=str(cache_dir)) as second:
        assert_values(read_by_rows(second), refs)
        stats = second.cache.tier_stats()
        assert second.cache.decoded_bytes == 0 < decoded_first
        assert stats["disk"]["hits"] > 0 and stats["disk"]["misses"] == 0


def test_a_checkpoint_rewritten_in_place_never_gets_the_old_entries(model, tmp_path):
    path, refs = model
    cache_dir = tmp_path / "cache"
    with ckptfs.open(path, cache_dir=str(cache_dir)) as ck:
        assert_values(read_by_rows(ck), refs)
    size = path.stat().st_size
    new_refs = write_model(path, seed=2)  # same names, shapes, types and size: other values
    assert path.stat().st_size == size
    with ckptfs.open(path, cache_dir=str(cache_dir)) as ck:
        assert_values(read_by_rows(ck), new_refs)
        decodable = sum(t.nbytes for t in ck.tensors if not t.data.direct)
        assert ck.cache.decoded_bytes == decodable  # every group decoded anew, once


def test_redis_tier_shared_between_opens_and_a_rewrite(model):
    require_redis_server()
    pytest.importorskip("redis")
    path, refs = model
    with RedisServer() as server:
        with ckptfs.open(path, cache_size=0, redis=server.url) as first:
            assert_values(read_by_rows(first), refs)
        with ckptfs.open(path, cache_size=0, redis=server.url) as second:
            assert_values(read_by_rows(second), refs)
            assert second.cache.decoded_bytes == 0
            assert second.cache.tier_stats()["redis"]["hits"] > 0
        new_refs = write_model(path, seed=3)
        with ckptfs.open(path, cache_size=0, redis=server.url) as third:
            assert_values(read_by_rows(third), new_refs)
            assert third.cache.decoded_bytes == sum(t.nbytes for t in third.tensors if not t.data.direct)


def test_disk_then_redis_lookup_order_and_promotion(model, tmp_path):
    require_redis_server()
    pytest.importorskip("redis")
    path, refs = model
    with RedisServer() as server:
        with ckptfs.open(path, cache_size=0, redis=server.url) as ck:  # only Redis holds the groups
            read_by_rows(ck)
        cache_dir = str(tmp_path / "cache")
        with ckptfs.open(path, cache_size=0, cache_dir=cache_dir, redis=server.url) as ck:
            assert_values(read_by_rows(ck), refs)  # found in Redis, promoted to the disk tier
        stats = ck.cache.tier_stats()  # after close: the background writes are done
        assert stats["redis"]["hits"] > 0 and stats["disk"]["stored"] == stats["redis"]["hits"]
        with ckptfs.open(path, cache_size=0, cache_dir=cache_dir, redis=server.url) as ck:
            assert_values(read_by_rows(ck), refs)  # now the disk answers first
            stats = ck.cache.tier_stats()
            assert stats["disk"]["hits"] > 0 and stats["redis"]["hits"] == 0 and ck.cache.decoded_bytes == 0


# ------------------------------------------------------------------------------ one copy for N workers


def _mapping_pss_kib(pid: int, folder: str) -> int:
    """Pss of the mappings of files under ``folder`` in process ``pid`` (from /proc/PID/smaps)."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and all(c in "0123456789abcdef-" for c in head[0]):
                inside = len(head) >= 6 and head[5].startswith(folder)
            elif inside and line.startswith("Pss:"):
                total += int(head[1])
    return total


def _worker(path: str, cache_dir: str, name: str, ready, done, out) -> None:
    ck = ckptfs.open(path, cache_dir=cache_dir)
    values = ck[name].shared()
    out.put((float(values.astype(np.float64).sum()), values.flags.writeable, values.shape))
    ready.wait()
    done.wait()


def test_shared_tensor_is_one_copy_for_several_processes(model, tmp_path):
    path, refs = model
    cache_dir = str(tmp_path / "cache")
    name = "blk.0.q4k"
    ctx = multiprocessing.get_context("spawn")
    workers = 4
    ready, done, out = ctx.Barrier(workers + 1), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(path), cache_dir, name, ready, done, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=120) for _ in procs]
        ready.wait(timeout=120)
        pss_kib = sum(_mapping_pss_kib(p.pid, cache_dir) for p in procs)
    finally:
        done.set()
        for p in procs:
            p.join(60)
    expected = refs[name].astype(np.float32)
    for total, writeable, shape in results:
        assert shape == expected.shape and not writeable
        assert total == pytest.approx(float(expected.astype(np.float64).sum()), rel=1e-9)
    one_copy_kib = expected.nbytes / 1024
    assert one_copy_kib * 0.9 <= pss_kib <= one_copy_kib * 1.25
    with ckptfs.open(path, cache_dir=cache_dir) as ck:
        np.testing.assert_array_equal(ck[name].shared(), expected)


def test_pickled_tensors_reopen_with_their_tiers(model, tmp_path):
    path, refs = model
    cache_dir = str(tmp_path / "cache")
    with ckptfs.open(path, cache_dir=cache_dir) as ck:
        blob = pickle.dumps(ck["blk.0.q8"])
    code = ("import pickle, sys; t = pickle.loads(sys.stdin.buffer.read()); v = t.shared(); "
            "print([x.name for x in t._ck.cache.tiers], float(v.astype('f8').sum()))")
    result = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, env=cli_env(),
                            timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    tiers, total = result.stdout.decode().rsplit("]", 1)
    assert tiers + "]" == "['memory', 'disk']"
    assert float(total) == pytest.approx(float(refs["blk.0.q8"].astype(np.float64).sum()), rel=1e-9)
    assert any(Path(cache_dir, "tensors").rglob("*.e"))


def test_shared_without_a_cache_folder_says_what_to_do(model, monkeypatch):
    path, _ = model
    monkeypatch.delenv("CKPTFS_CACHE_DIR", raising=False)
    with ckptfs.open(path) as ck, pytest.raises(ValueError, match="cache_dir"):
        ck["norm"].shared()


# ---------------------------------------------------------------------------------------- commands


def test_prefetch_then_cache_stats_prune_clear(model, tmp_path):
    path, refs = model
    cache_dir = str(tmp_path / "cache")
    result = run_cli("prefetch", str(path), "--cache-dir", cache_dir)
    assert result.returncode == 0, result.stderr
    assert "prefetched 3 tensors" in result.stdout
    with ckptfs.open(path, cache_size=0, cache_dir=cache_dir) as ck:
        assert_values(read_by_rows(ck), refs)
        assert ck.cache.decoded_bytes == 0
    stats = json.loads(run_cli("cache", "stats", "--cache-dir", cache_dir, "--json").stdout)
    assert stats["namespaces"]["blocks"]["files"] > 0
    total = stats["total"]["bytes"]
    pruned = run_cli("cache", "prune", "--cache-dir", cache_dir, "--cache-dir-size", str(total // 2))
    assert pruned.returncode == 0, pruned.stderr
    after = json.loads(run_cli("cache", "stats", "--cache-dir", cache_dir, "--json").stdout)
    assert 0 < after["total"]["bytes"] <= total // 2
    cleared = run_cli("cache", "clear", "--cache-dir", cache_dir)
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(run_cli("cache", "stats", "--cache-dir", cache_dir, "--json").stdout)["total"]["files"] == 0


def test_prefetch_named_tensors_into_redis(model):
    require_redis_server()
    pytest.importorskip("redis")
    path, refs = model
    with RedisServer() as server:
        result = run_cli("prefetch", str(path), "blk.0.q8", "--redis", server.url)
        assert result.returncode == 0, result.stderr
        with ckptfs.open(path, cache_size=0, redis=server.url) as ck:
            np.testing.assert_array_equal(ck["blk.0.q8"][0:32], refs["blk.0.q8"])
            assert ck.cache.decoded_bytes == 0


def test_cache_command_usage_errors(model, tmp_path):
    path, _ = model
    assert run_cli("cache", "stats").returncode == 2
    assert run_cli("prefetch", str(path)).returncode == 2
    missing = run_cli("prefetch", str(path), "nope", "--cache-dir", str(tmp_path / "c"))
    assert missing.returncode == 2 and "nope" in missing.stderr
    bad = run_cli("prefetch", str(path), "--redis", "http://x")
    assert bad.returncode == 2 and "redis://HOST:PORT/DB" in bad.stderr
    env_dir = run_cli("cache", "stats", CKPTFS_CACHE_DIR=str(tmp_path / "env"))
    assert env_dir.returncode == 0, env_dir.stderr


def test_prefetch_reports_a_redis_that_is_down(model):
    require_redis_server()
    pytest.importorskip("redis")
    from loopback.servers import free_port

    path, _ = model
    result = run_cli("prefetch", str(path), "--redis", f"redis://127.0.0.1:{free_port()}/0")
    assert result.returncode == 1
    assert "tier errors: redis" in result.stderr
    assert os.path.exists(path)


class DictTier(CacheTier):
    """A fake shared tier: a dict, with the counters the protocol asks for."""

    name = "fake"

    def __init__(self):
        self.entries: dict[str, np.ndarray] = {}
        self.hits = self.misses = 0

    def get(self, key):
        value = self.entries.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key, value):
        self.entries[key] = np.array(value)

    def contains(self, key):
        return key in self.entries

    def stats(self):
        return {"hits": self.hits, "misses": self.misses, "bytes": sum(v.nbytes for v in self.entries.values())}


def _open_with_tiers(path, *tiers) -> Checkpoint:
    """A checkpoint whose cache is built outside it, as the tier factories do."""
    return Checkpoint(read_checkpoint(str(path)), str(path), cache=TieredCache([BlockCache(1 << 20), *tiers]))


def test_a_lower_tier_gets_decoded_groups_and_serves_another_checkpoint_without_decoding(tmp_path):
    written = write_mixed_gguf(tmp_path / "model.gguf")
    name = next(n for n, r in written.tensors.items() if r.storage_type == "Q4_K")
    shared = DictTier()
    with _open_with_tiers(tmp_path / "model.gguf", shared) as ck:
        rows = ck[name].shape[0]
        ck[name].data.read(0, ck[name].size)  # through the cache, group by group
        assert shared.entries and all(key.startswith(ck.content_id + "|") for key in shared.entries)
        assert ck.cache.decoded_bytes > 0
    with _open_with_tiers(tmp_path / "model.gguf", shared) as again:
        data = again[name].data
        values = data.read(0, again[name].size)
        assert again.cache.decoded_bytes == 0 and shared.hits > 0
        assert again.cache.tier_stats()["fake"]["hits"] == shared.hits
        np.testing.assert_array_equal(values.reshape(rows, -1), written.tensors[name].array.reshape(rows, -1))
        # promoted: the same read again is a memory hit, not another lower-tier lookup
        hits = shared.hits
        data.read(0, again[name].size)
        assert shared.hits == hits


def test_destroy_closes_the_sources_and_the_tiers(tmp_path):
    write_mixed_gguf(tmp_path / "model.gguf")
    closed = []
    tier = DictTier()
    tier.close = lambda: closed.append(True)
    ck = _open_with_tiers(tmp_path / "model.gguf", tier)
    ops = CkptOperations(MountTree(ck))
    assert ck.sources.open_count() == 1
    ops.destroy("/")
    assert ck.sources.open_count() == 0 and closed == [True]
