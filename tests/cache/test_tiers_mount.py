"""Real FUSE mounts with ``--cache-dir`` and ``--redis``: a second daemon streams what the first decoded
without decoding it again; a Redis killed mid-stream, a cache folder deleted or corrupted under a live
mount, a full cache file system and a checkpoint rewritten between two mounts all still serve exactly
np.save of gguf-py's values.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess

import pytest
from conftest import mount_stats
from loopback.redis_server import RedisServer
from redis_fixtures import require_redis_server
from tier_models import write_model

from ckptfs.cache.entry import HEADER_SIZE
from tier_models import expected_files, read_all, settled








@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.gguf"
    return path, write_model(path, seed=11)


@pytest.mark.parametrize("tier", ["disk", "redis"])
def test_a_second_daemon_on_the_same_tier_decodes_nothing(mounted, model, tmp_path, tier):
    path, refs = model
    expected = expected_files(refs)
    with contextlib.ExitStack() as stack:
        if tier == "redis":
            require_redis_server()
            pytest.importorskip("redis")
            args = ["--redis", stack.enter_context(RedisServer()).url]
        else:
            args = ["--cache-dir", str(tmp_path / "cache")]
        first = mounted(path, *args, "--cache-size", "0")
        read_all(first, expected)
        first_stats = settled(first, tier)
        assert first_stats["tiers"][tier]["stored"] > 0 and first_stats["decoded_bytes"] > 0
        second = mounted(path, *args, "--cache-size", "0")
        streamed = read_all(second, expected)
        stats = mount_stats(second)
        # a group is decoded only when every lower tier missed it: no miss, no decode
        assert stats["tiers"][tier]["misses"] == 0 and stats["tiers"][tier]["hits"] > 0
        assert stats["decoded_bytes"] <= 0.01 * streamed
        assert set(stats["tiers"]) == {"memory", tier}


def test_redis_killed_mid_stream_every_read_is_answered(mounted, model):
    require_redis_server()
    pytest.importorskip("redis")
    path, refs = model
    expected = expected_files(refs)
    with RedisServer() as server:
        first = mounted(path, "--redis", server.url, "--cache-size", "0")
        read_all(first, expected)
        settled(first, "redis")  # Redis holds it all
        mnt = mounted(path, "--redis", server.url, "--cache-size", "0")
        name = "blk.0.q4k.npy"
        with open(mnt / name, "rb") as fh:
            head = fh.read(len(expected[name]) // 2)
            server.kill()
            tail = fh.read()
        assert head + tail == expected[name]
        read_all(mnt, expected)
        stats = mount_stats(mnt)
        assert stats["tiers"]["redis"]["up"] == 0 and stats["tiers"]["redis"]["misses"] > 0  # decoded


def test_cache_dir_deleted_or_corrupted_under_a_live_mount(mounted, model, tmp_path):
    path, refs = model
    expected = expected_files(refs)
    cache = tmp_path / "cache"
    mnt = mounted(path, "--cache-dir", str(cache), "--cache-size", "0")
    read_all(mnt, expected)
    settled(mnt, "disk")
    shutil.rmtree(cache, ignore_errors=True)  # (a size check running meanwhile may recreate .lock)
    assert not list(cache.rglob("*.e"))
    read_all(mnt, expected)  # decoded again, and the folder made again
    settled(mnt, "disk")
    entries = list((cache / "blocks").rglob("*.e"))
    assert entries
    for entry in entries:  # flip one payload byte in each
        data = bytearray(entry.read_bytes())
        data[HEADER_SIZE + 5] ^= 0x10
        entry.write_bytes(data)
    read_all(mnt, expected)
    stats = mount_stats(mnt)
    assert stats["tiers"]["disk"]["corrupt"] >= len(entries)


def test_a_full_cache_file_system_costs_storage_not_reads(mounted, model, tmp_path):
    path, refs = model
    expected = expected_files(refs)
    cache = tmp_path / "small"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(cache)], check=True)
    try:
        mnt = mounted(path, "--cache-dir", str(cache), "--cache-size", "0")
        read_all(mnt, expected)
        read_all(mnt, expected)
        assert settled(mnt, "disk")["tiers"]["disk"]["errors"] > 0
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)


def test_a_checkpoint_rewritten_between_two_mounts_gets_new_values(mounted, model, tmp_path):
    path, refs = model
    cache = str(tmp_path / "cache")
    first = mounted(path, "--cache-dir", cache)
    read_all(first, expected_files(refs))
    settled(first, "disk")
    new_refs = write_model(path, seed=12)
    mnt = mounted(path, "--cache-dir", cache)
    read_all(mnt, expected_files(new_refs))
    disk = mount_stats(mnt)["tiers"]["disk"]
    assert disk["hits"] == 0 and disk["misses"] > 0
