"""A remote file the ``--cache-dir`` store holds complete (sealed) is served like a local file: once the
daemon has checked its MACs (in the background, Python serving meanwhile), opens of the checkpoint's own
file, of its ``.raw`` files and of the ``.npy`` of a type served as stored are registered with the C read path (``ckptfs/fuse/direct.py``), which reads
the store's file at the remote file's own offsets.

Debian's nginx serves a generated GGUF on loopback; ``ckptfs prefetch`` fills the folder, then a real mount
of the URL with the same folder is read. The oracles: the file itself (and its tensors' stored bytes), the
mount's ``c_reads`` counters (what the C path served), and nginx's access log (no byte of data asked for).
The check runs ahead of the readers chunk by chunk: a handle opened while it runs is served in C behind it.
A damaged sealed file fails the check and is never served from C; its damaged chunk alone is dropped.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import os

import numpy as np
import pytest

pytest.importorskip("urllib3")

from cli_runs import run_cli
from conftest import mount_stats, require_nginx, wait_until
from fixtures import write_gguf, write_mixed_gguf
from mount_expect import read_direct
from loopback.servers import Nginx, data_ranges

from ckptfs.sources.remote.store.sparse_store import CHUNK, SparseStore
from ckptfs.fuse import direct

pytestmark = pytest.mark.skipif(direct._direct is None, reason="the C helper ckptfs.fuse._direct is not built")


def _c_served(mnt, kind: str) -> int:
    return mount_stats(mnt)["c_reads"]["by_kind"].get(kind, {}).get("reads", 0)


@contextlib.contextmanager
def _prefetched(tmp_path, name: str, write):
    """``write(path)``'s GGUF served by nginx as ``name`` and prefetched into ``tmp_path/cache``: (the server,
    its URL, what was written, the cache folder)."""
    require_nginx()
    root = tmp_path / "www"
    root.mkdir()
    written = write(root / name)
    cache = tmp_path / "cache"
    with Nginx(root) as server:
        url = f"{server.url}/{name}"
        warmed = run_cli("prefetch", url, "--cache-dir", str(cache), timeout=120)
        assert warmed.returncode == 0, warmed.stderr
        yield server, url, written, cache


def test_a_sealed_remote_file_and_its_raw_files_are_read_in_c_exactly(mounted, tmp_path):
    with _prefetched(tmp_path, "mixed.gguf", write_mixed_gguf) as (server, url, written, cache):
        data = written.path.read_bytes()
        mnt = mounted(url, "--cache-dir", str(cache))
        own = mnt / "mixed.gguf"
        # the first open starts the daemon's check of the sealed file; an open after it is read in C (O_DIRECT:
        # each read reaches the daemon, not the page cache)
        assert wait_until(lambda: read_direct(own, [(0, len(data))]) == [data] and _c_served(mnt, "file") > 0,
                          timeout=60)
        server.wait_idle()
        before = len(server.access_log())
        ranges = [(0, 1), (7, 4093), (CHUNK - 3, 10), (len(data) // 2, 300_000), (len(data) - 1, 10), (0, len(data))]
        for (offset, size), got in zip(ranges, read_direct(own, ranges)):
            assert got == data[offset:offset + size], (offset, size)
        assert own.read_bytes() == data
        for name, ref in written.tensors.items():
            assert (mnt / f"{name}.raw").read_bytes() == ref.raw, name
        npy = io.BytesIO()
        np.save(npy, written.tensors["f32.mat"].array)
        assert (mnt / "f32.mat.npy").read_bytes() == npy.getvalue()  # a type served as stored: header + bytes
        served = mount_stats(mnt)["c_reads"]
        assert served["handed_back"] == 0
        assert served["by_kind"]["npy"]["reads"] > 0
        assert served["by_kind"]["raw"]["reads"] >= len(written.tensors)
        assert served["by_kind"]["file"]["bytes"] >= sum(min(s, len(data) - o) for o, s in ranges)
        server.wait_idle()
        assert data_ranges(server.ranges("mixed.gguf", before), len(data)) == []  # nothing fetched


def _gate(copy) -> int:
    """The bytes ``copy``'s check has passed (-1: failed), read where the C reader reads it."""
    return ctypes.c_int64.from_address(copy[3]).value


def test_a_sealed_file_that_fails_its_check_drops_that_chunk_and_is_not_served_from_c(tmp_path):
    store = SparseStore(tmp_path / "cache", 1 << 30)
    content = "test:sealed-check:" + os.urandom(8).hex()
    payload = os.urandom(3 * CHUNK + 5)
    parts = [payload[i: i + CHUNK] for i in range(0, len(payload), CHUNK)]
    store.put_chunks(content, 0, parts, len(parts))
    path = store.sealed_path(content)
    good = content + ":good"
    store.put_chunks(good, 0, parts, len(parts))
    with open(path, "r+b") as fh:  # one byte of the sealed copy changed under the store
        fh.seek(CHUNK + 17)
        fh.write(bytes([payload[CHUNK + 17] ^ 1]))
    copies = {name: store.sealed_copy(name, len(payload)) for name in (content, good)}  # the checks start
    assert all(copy is not None for copy in copies.values())  # at once, the gate at what was checked so far
    assert wait_until(lambda: _gate(copies[good]) == len(payload), timeout=30)
    fd, size, _, _ = store.sealed_copy(good, len(payload))
    assert size == len(payload) and os.pread(fd, size, 0) == payload
    assert wait_until(lambda: _gate(copies[content]) == -1, timeout=30)  # failed: C reads of it end
    assert store.sealed_copy(content, len(payload)) is None
    # the damaged chunk alone is dropped (fetched again), the file unsealed and the rest of it kept (the check's
    # thread unseals it right after it marks the gate failed)
    assert wait_until(lambda: store.sealed_path(content) is None, timeout=30)
    assert os.path.exists(path)
    assert store.stored_chunks(content, range(4)) == {0, 2, 3}
    assert [store.get(content, i) for i in (0, 2, 3)] == [parts[0], parts[2], parts[3]]
    assert store.put_chunks(content, 1, [parts[1]], len(parts)) and store.sealed_path(content) == path
    again = store.sealed_copy(content, len(payload))  # complete again: checked afresh
    assert again is not None and wait_until(lambda: _gate(again) == len(payload), timeout=30)


def _several_chunks_gguf(path):
    """A GGUF of five F32 tensors of about 1.2 MB each: a file of some 24 chunks, each tensor in chunks of its
    own."""
    rng = np.random.default_rng(11)
    return write_gguf(path, {f"t{i}": (rng.standard_normal(300_000).astype(np.float32), "F32") for i in range(5)})


@pytest.mark.parametrize("stamp", ["kept", "stale"])
def test_the_first_handle_of_a_sealed_file_is_served_from_c(mounted, tmp_path, stamp):
    """``ckptfs prefetch``, then the first open of the file in a fresh mount: that very handle's reads are
    served in C, not by Python for the handle's life. With the stamp the prefetch left (kept), no check is
    needed; once the data file's ctime moved (stale: a chmod), the open starts the check and the handle is
    served behind it."""
    with _prefetched(tmp_path, "m.gguf", _several_chunks_gguf) as (server, url, written, cache):
        data = written.path.read_bytes()
        if stamp == "stale":
            stored, = (cache / "remote").glob("*/*.data")
            os.chmod(stored, stored.stat().st_mode)  # the same mode: only its ctime moves
        mnt = mounted(url, "--cache-dir", str(cache))
        server.wait_idle()
        before = len(server.access_log())
        fd = os.open(mnt / "m.gguf", os.O_RDONLY | os.O_DIRECT)  # the first open (a stale stamp: the check starts)
        try:
            served = []

            def a_pass_in_c() -> bool:
                start = _c_served_bytes(mnt)
                got = b"".join(os.pread(fd, 1 << 20, at) for at in range(0, len(data), 1 << 20))
                assert got == data
                served.append(_c_served_bytes(mnt) - start)
                return served[-1] >= len(data)

            assert wait_until(a_pass_in_c, timeout=60), served
        finally:
            os.close(fd)
        assert mount_stats(mnt)["c_reads"]["by_kind"]["file"]["reads"] > 0
        server.wait_idle()
        assert data_ranges(server.ranges("m.gguf", before), len(data)) == []  # nothing fetched


def _c_served_bytes(mnt) -> int:
    return mount_stats(mnt)["c_reads"]["by_kind"].get("file", {}).get("bytes", 0)


@pytest.mark.parametrize("online", [False, True], ids=["offline", "online"])
def test_a_damaged_chunk_of_a_sealed_file_costs_that_range_alone(mounted, tmp_path, online):
    """One chunk of the sealed file damaged after the prefetch: offline, every other tensor is served exactly
    and the damaged one's range fails with EIO; online, that chunk alone is fetched again."""
    with _prefetched(tmp_path, "m.gguf", _several_chunks_gguf) as (server, url, written, cache):
        data = written.path.read_bytes()
        stored, = (cache / "remote").glob("*/*.data")
        at = data.index(written.tensors["t2"].raw) + len(written.tensors["t2"].raw) // 2  # inside t2
        with open(stored, "r+b") as fh:
            fh.seek(at)
            fh.write(bytes([data[at] ^ 0x55]))
        server.wait_idle()
        before = len(server.access_log())
        mnt = mounted(url, "--cache-dir", str(cache), "--cache-size", "0", *(() if online else ("--offline",)))
        for name, ref in written.tensors.items():
            if name == "t2" and not online:
                with pytest.raises(OSError) as info:
                    (mnt / f"{name}.raw").read_bytes()
                assert info.value.errno == errno.EIO
            else:
                assert (mnt / f"{name}.raw").read_bytes() == ref.raw, name
        outside = [(0, at // CHUNK * CHUNK), ((at // CHUNK + 1) * CHUNK, len(data))]
        assert read_direct(mnt / "m.gguf", outside) == [data[o: o + n] for o, n in outside]
        server.wait_idle()
        fetched = data_ranges(server.ranges("m.gguf", before), len(data))
        if online:  # the damaged chunk, fetched again (as part of one piece at most)
            assert fetched and all(a <= at < b for a, b in fetched), fetched
        else:
            assert fetched == []
    assert stored.exists()  # the file kept: its damaged chunk dropped alone


def test_a_stamped_sealed_file_skips_the_check_until_its_data_file_changes(tmp_path):
    """The process that seals a file stamps it (its data file's inode, size, mtime, ctime and the boot, under
    the folder's key): a later process finds the copy checked at once. A ctime that moved (a write, a chmod)
    means a check, which stamps it again."""
    content = "test:sealed-stamp:" + os.urandom(8).hex()
    payload = os.urandom(100 * CHUNK + 3)
    parts = [payload[i: i + CHUNK] for i in range(0, len(payload), CHUNK)]
    SparseStore(tmp_path / "cache", 1 << 30).put_chunks(content, 0, parts, len(parts))
    fresh = SparseStore(tmp_path / "cache", 1 << 30)  # another process
    assert _gate(fresh.sealed_copy(content, len(payload))) == len(payload)  # no check needed
    path = fresh.sealed_path(content)
    os.chmod(path, os.stat(path).st_mode)
    checking = SparseStore(tmp_path / "cache", 1 << 30)
    copy = checking.sealed_copy(content, len(payload))
    gates = [_gate(copy)]
    assert wait_until(lambda: gates.append(_gate(copy)) or gates[-1] == len(payload), timeout=30)
    assert gates[0] < len(payload)  # checked, chunk by chunk, from the start
    after = SparseStore(tmp_path / "cache", 1 << 30)
    assert _gate(after.sealed_copy(content, len(payload))) == len(payload)  # stamped again by the check
