"""The disk tier on real file systems: corrupt entries, a full tmpfs, a read-only or deleted folder, killed
writers, several processes filling the same entries at once, the size bound.

Every failure must read as a miss (the caller decodes), never raise and never return other bytes than were
stored; each kind of trouble is logged once.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cli_runs import one_error_line, run_cli
from conftest import remount_read_only, skip_or_fail, tmpfs
from tier_models import FORGED_VALUE, forge, write_model

from ckptfs.cache import entry
from ckptfs.cache.auth import CacheRefused
from ckptfs.cache.disk import DiskStore, DiskTier


def values(seed: int, n: int = 4096, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def tmp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob(".tmp.*")]


def test_round_trip_keeps_dtype_and_values(tmp_path):
    tier = DiskTier(tmp_path, 1 << 30)
    for i, dtype in enumerate((np.float32, np.float16, np.int8)):
        tier.put(f"k{i}", values(i, dtype=dtype))
    assert tier.flush()
    for i, dtype in enumerate((np.float32, np.float16, np.int8)):
        got = tier.get(f"k{i}")
        assert got.dtype == np.dtype(dtype) and not got.flags.writeable
        np.testing.assert_array_equal(got, values(i, dtype=dtype))
    assert tier.get("absent") is None
    stats = tier.stats()
    assert (stats["hits"], stats["misses"], stats["stored"]) == (3, 1, 3)


def test_namespaces_share_the_folder_and_the_bound(tmp_path):
    blocks = DiskTier(tmp_path, 1 << 30)
    raw = DiskStore(tmp_path, 1 << 30, "bytes")
    blocks.put("same key", values(1))
    raw.put("same key", b"remote bytes")
    blocks.flush()
    assert raw.get("same key") == b"remote bytes"
    np.testing.assert_array_equal(blocks.get("same key"), values(1))
    usage = raw.usage()
    assert usage["blocks"]["files"] == 1 and usage["bytes"]["files"] == 1
    assert (tmp_path / "blocks").is_dir() and (tmp_path / "bytes").is_dir()


def _damage_payload(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[entry.HEADER_SIZE + 10] ^= 0x40
    p.write_bytes(data)


def _damage_header_length(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[16] ^= 0x01
    p.write_bytes(data)


def _truncate(p: Path) -> None:
    os.truncate(p, p.stat().st_size - 100)


def _garbage(p: Path) -> None:
    p.write_bytes(os.urandom(5000))


def _empty(p: Path) -> None:
    p.write_bytes(b"")


@pytest.mark.parametrize("damage", [_damage_payload, _damage_header_length, _truncate, _garbage, _empty])
def test_a_corrupt_entry_is_a_miss_deleted_and_logged_once(tmp_path, caplog, damage):
    tier = DiskTier(tmp_path, 1 << 30)
    for k in ("a", "b"):
        tier.put(k, values(7))
        tier.flush()
        damage(tier.store.path_for(k))
    with caplog.at_level(logging.WARNING, logger="ckptfs.cache.disk"):
        assert tier.get("a") is None
        assert tier.get("b") is None
    assert not tier.store.path_for("a").exists() and not tier.store.path_for("b").exists()
    assert tier.stats()["corrupt"] == 2
    assert len([r for r in caplog.records if "corrupt entry" in r.getMessage()]) == 1
    tier.put("a", values(8))  # decoded again and stored again
    tier.flush()
    np.testing.assert_array_equal(tier.get("a"), values(8))


def test_an_entry_under_another_keys_name_is_refused(tmp_path):
    tier = DiskTier(tmp_path, 1 << 30)
    tier.put("first", values(1))
    tier.put("second", values(2))
    tier.flush()
    target = tier.store.path_for("second")
    shutil.copyfile(tier.store.path_for("first"), target)  # a valid entry, but for another key
    assert tier.get("second") is None
    assert tier.stats()["corrupt"] == 1


def test_an_entry_forged_with_recomputed_checksums_is_a_miss_counted_and_deleted(tmp_path, caplog):
    """crc32s are public: an entry rewritten with other values and recomputed crc32s fails the MAC."""
    tier = DiskTier(tmp_path, 1 << 30)
    tier.put("a", values(1))
    tier.put("b", values(2))
    tier.flush()
    for k in ("a", "b"):
        p = tier.store.path_for(k)
        p.write_bytes(forge(p.read_bytes()))
        assert (np.frombuffer(p.read_bytes()[entry.HEADER_SIZE:], np.float32) == FORGED_VALUE).all()
    with caplog.at_level(logging.WARNING, logger="ckptfs.cache.disk"):
        assert tier.get("a") is None and tier.get("b") is None
    assert not tier.store.path_for("a").exists()
    stats = tier.stats()
    assert (stats["forged"], stats["corrupt"], stats["hits"]) == (2, 0, 0)
    assert len([r for r in caplog.records if "forged entry" in r.getMessage()]) == 1
    other = tmp_path / "other"  # another folder, another key: its entries are forgeries here
    DiskStore(other, 1 << 30, "blocks").put_array("a", values(1))
    shutil.copyfile(DiskStore(other, 1 << 30, "blocks").path_for("a"), tier.store.path_for("a"))
    assert tier.get("a") is None and tier.stats()["forged"] == 3


def test_shared_keys_and_remote_bytes_use_the_same_authentication(tmp_path):
    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    one = DiskStore(tmp_path / "one", 1 << 30, "bytes", key_file=key)
    two = DiskStore(tmp_path / "two", 1 << 30, "bytes", key_file=key)
    one.put("chunk", b"remote bytes")
    assert not (tmp_path / "one" / ".key").exists()  # the key file given, no folder key made
    two.path_for("chunk").parent.mkdir(parents=True)
    shutil.copyfile(one.path_for("chunk"), two.path_for("chunk"))
    assert two.get("chunk") == b"remote bytes"  # same key: the entry checks out in another folder
    p = one.path_for("chunk")
    p.write_bytes(forge(p.read_bytes()))
    assert one.get("chunk") is None and one.stats()["forged"] == 1


def test_a_killed_writer_leaves_nothing_that_reads_as_valid(tmp_path):
    code = f"""
import sys, time, numpy as np
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from ckptfs.cache.disk import DiskStore
store = DiskStore({str(tmp_path)!r}, 1 << 30, "blocks")
def chunks():
    yield np.ones(1 << 16, np.float32)
    print("half", flush=True)
    time.sleep(60)
    yield np.ones(1 << 16, np.float32)
store.write_chunks("key", np.float32, 1 << 19, chunks())
"""
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "half"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    store = DiskStore(tmp_path, 1 << 30, "blocks")
    leftovers = tmp_files(tmp_path)
    assert leftovers, "the killed writer's temporary file should exist (else this test tests nothing)"
    assert store.get_array("key") is None and not store.contains("key")
    old = time.time() - 7200
    for p in leftovers:
        os.utime(p, (old, old))
    assert store.prune()["files"] == len(leftovers)
    assert tmp_files(tmp_path) == []


def test_a_full_file_system_costs_storage_never_a_read(tmp_path, caplog):
    with tmpfs(tmp_path / "small", "1m") as root:
        tier = DiskTier(root, 1 << 30)
        tier.put("early", values(1, 1024))
        tier.flush()
        with caplog.at_level(logging.WARNING, logger="ckptfs.cache.disk"):
            for i in range(12):  # 12 x 256 KiB entries into 1 MiB: most cannot be written
                tier.put(f"big{i}", values(i, 64 * 1024))
                tier.flush()
                tier.store._paused_until = 0.0  # try each, as writes after the pause would
        np.testing.assert_array_equal(tier.get("early"), values(1, 1024))
        stored = [i for i in range(12) if tier.get(f"big{i}") is not None]
        for i in stored:
            np.testing.assert_array_equal(tier.get(f"big{i}"), values(i, 64 * 1024))
        assert len(stored) < 12
        assert tier.stats()["errors"] >= 12 - len(stored)
        assert len([r for r in caplog.records if "file system is full" in r.getMessage()]) == 1
        assert tmp_files(root) == []


def test_a_read_only_folder_serves_what_it_has(tmp_path, caplog):
    with tmpfs(tmp_path / "ro", "4m") as root:
        tier = DiskTier(root, 1 << 30)
        tier.put("kept", values(3))
        tier.flush()
        remount_read_only(root, tier.store)
        with caplog.at_level(logging.WARNING, logger="ckptfs.cache.disk"):
            tier.put("new", values(4))
            tier.put("new2", values(5))
            tier.flush()
        np.testing.assert_array_equal(tier.get("kept"), values(3))
        assert tier.get("new") is None
        assert len([r for r in caplog.records if "not writable" in r.getMessage()]) == 1


def test_a_deleted_folder_is_made_again(tmp_path):
    root = tmp_path / "cache"
    tier = DiskTier(root, 1 << 30)
    tier.put("a", values(1))
    tier.flush()
    while tier.store._pruning:  # the first write's size check may still be scanning (and locking) the folder
        time.sleep(0.01)
    shutil.rmtree(root)
    assert tier.get("a") is None
    tier.put("a", values(2))
    tier.flush()
    np.testing.assert_array_equal(tier.get("a"), values(2))


def _fill(root: str, worker: int, keys: int, barrier) -> None:
    store = DiskStore(root, 1 << 30, "blocks")
    barrier.wait()
    for k in range(keys):
        store.put_array(f"key{k}", values(k, 32 * 1024))
        got = store.get_array(f"key{(k * 7 + worker) % keys}")
        if got is not None:
            np.testing.assert_array_equal(got, values((k * 7 + worker) % keys, 32 * 1024))


def test_several_processes_fill_the_same_entries_at_once(tmp_path):
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_fill, args=(str(tmp_path), w, 40, barrier)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    store = DiskStore(tmp_path, 1 << 30, "blocks")
    for k in range(40):
        np.testing.assert_array_equal(store.get_array(f"key{k}"), values(k, 32 * 1024))
    assert store.stats()["corrupt"] == 0
    assert tmp_files(tmp_path) == []
    assert store.usage()["blocks"]["files"] == 40


def test_the_bound_removes_least_recently_used_entries(tmp_path):
    entry_bytes = entry.HEADER_SIZE + 4096 * 4
    store = DiskStore(tmp_path, 1 << 30, "blocks")  # nothing pruned while the times are set
    now = time.time()
    for k in range(16):
        store.put_array(f"key{k}", values(k))
        os.utime(store.path_for(f"key{k}"), (now - 1000 + k, now - 1000 + k))
    os.utime(store.path_for("key0"), (now, now))  # used most recently: must survive
    result = store.prune(max_bytes=10 * entry_bytes)
    assert result["total"] <= 9 * entry_bytes
    left = {k for k in range(16) if store.contains(f"key{k}")}
    assert 0 in left
    assert left == {0} | set(range(16 - len(left) + 1, 16))
    assert store.clear()["total"] == 0 and store.usage() == {}


def test_writes_past_the_bound_prune_in_the_background(tmp_path):
    entry_bytes = entry.HEADER_SIZE + 64 * 1024 * 4
    store = DiskStore(tmp_path, 8 * entry_bytes, "blocks")
    for k in range(60):
        store.put_array(f"key{k}", values(k, 64 * 1024))
    deadline = time.monotonic() + 30
    while store._pruning and time.monotonic() < deadline:
        time.sleep(0.05)
    # no explicit prune was called: only the background passes (one per 4 MiB written) removed entries
    assert store.usage()["blocks"]["files"] < 30
    assert store.contains("key59")


def test_writes_made_during_a_prune_are_pruned_when_it_ends(tmp_path, monkeypatch):
    """A burst of writes that ends while a prune walks the folder (a busy machine) leaves it over its bound
    unless the running prune runs again: no later write will start one."""
    import threading

    entry_bytes = entry.HEADER_SIZE + 64 * 1024 * 4
    store = DiskStore(tmp_path, 8 * entry_bytes, "blocks")
    release, started, real_prune = threading.Event(), threading.Event(), DiskStore.prune

    def slow_first_prune(self, *args, **kwargs):
        result = real_prune(self, *args, **kwargs)  # walks the folder as it is now: one entry
        if not started.is_set():
            started.set()
            assert release.wait(10)  # ... and is still running while the other 59 are written
        return result

    monkeypatch.setattr(DiskStore, "prune", slow_first_prune)
    store.put_array("key0", values(0, 64 * 1024))  # the first write makes a prune due: it now waits
    assert started.wait(10)
    for k in range(1, 60):
        store.put_array(f"key{k}", values(k, 64 * 1024))
    release.set()
    deadline = time.monotonic() + 30
    while store._pruning and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not store._pruning
    assert store.usage()["blocks"]["bytes"] <= 8 * entry_bytes
    assert store.contains("key59")


def test_writes_wait_in_the_background_and_lookups_see_them(tmp_path):
    import threading

    gate = threading.Event()
    tier = DiskTier(tmp_path, 1 << 30)
    real_put = tier.store.put_array
    tier._writer._write = lambda key, value: (gate.wait(10), real_put(key, value))
    tier.put("slow", values(9))
    assert tier.stats()["pending"] == 1 and not tier.store.path_for("slow").exists()
    np.testing.assert_array_equal(tier.get("slow"), values(9))  # served from the queue meanwhile
    gate.set()
    assert tier.flush(timeout=10)
    assert tier.store.path_for("slow").exists() and tier.stats()["pending"] == 0
    np.testing.assert_array_equal(tier.store.get_array("slow"), values(9))


def test_a_full_write_queue_holds_readers_back_then_drops():
    import threading

    from ckptfs.cache.writer import BackgroundWriter

    gate, written = threading.Event(), []
    writer = BackgroundWriter(lambda k, v: (gate.wait(10), written.append(k)), "test", max_bytes=3 * 4096 * 4,
                              max_wait=0.2)
    for k in range(3):
        assert writer.submit(f"k{k}", values(k, 4096))
    assert not writer.submit("over", values(9, 4096))  # full, and nothing drains within max_wait
    assert writer.dropped == 1
    later = threading.Thread(target=lambda: written.append(("queued", writer.submit("late", values(8, 4096)))))
    writer._max_wait = 10.0
    later.start()
    gate.set()  # the writer drains: the waiting submit gets its room
    later.join(10)
    assert writer.flush(timeout=10)
    assert ("queued", True) in written and "late" in written and "over" not in written


def _refused_parent(tmp_path: Path, kind: str) -> Path:
    """A folder a cache folder must not be made under: another user's, or one others can write to (not sticky)."""
    parent = tmp_path / kind
    parent.mkdir()
    if kind == "others-own":
        if os.geteuid() != 0:
            skip_or_fail("needs root to make a folder another user owns")
        os.chown(parent, 65534, 65534)
        parent.chmod(0o755)
    else:
        parent.chmod(0o777)
    return parent


@pytest.mark.parametrize("kind, words", [("others-own", "owned by nobody"), ("others-write", "chmod go-w")])
def test_a_refused_cache_dir_is_never_created(tmp_path, kind, words):
    """The folders above a missing cache folder are checked before it is made: a refusal leaves nothing,
    through the library and through the command line."""
    parent = _refused_parent(tmp_path, kind)
    for target in (parent / "new", parent / "new" / "deeper"):
        with pytest.raises(CacheRefused, match=words):
            DiskStore(target, 1 << 20)
        assert list(parent.iterdir()) == []
    model = tmp_path / "model.gguf"
    write_model(model, seed=5)
    one_error_line(run_cli("prefetch", str(model), "--cache-dir", str(parent / "new")), 1, str(parent), words)
    assert list(parent.iterdir()) == []
