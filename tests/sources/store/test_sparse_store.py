"""The ``--cache-dir`` store of fetched remote bytes: one sparse file per remote file and an index beside it.

The oracle is what was put (and the files themselves: the data file holds the remote file's bytes at their
own offsets, holes where nothing was stored, counted by ``st_blocks``). Forged or damaged chunks must read
as misses; a crash between the data and its record must leave the chunk absent; eviction punches the least
recently used chunks of unsealed files and removes sealed files only whole; leases are exclusive between
processes and vanish with a killed holder.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import struct
import subprocess
import sys
import textwrap

import pytest

from conftest import tmpfs

from ckptfs.cache import entry
from ckptfs.sources.remote.store import range_lease, sparse_store
from ckptfs.sources.remote.store.chunks import ChunkCache, MemoryChunks, chunk_key
from ckptfs.sources.remote.store import direct_write
from ckptfs.sources.remote.store.direct_write import BUFFER_BYTES, KEPT_BYTES, BouncePool, DirectWriter
from ckptfs.sources.remote.store.sparse_store import CHUNK, HEADER_SIZE, RECORD, SparseStore

CONTENT = "test:sparse-store:" + os.urandom(8).hex()
N = 10  # chunks of the test file; its last one is shorter
SIZE = (N - 1) * CHUNK + 1000


def remote_bytes() -> bytes:
    return bytes((i * 7 + i // CHUNK) % 251 for i in range(SIZE))


DATA = remote_bytes()


def chunk(i: int) -> bytes:
    return DATA[i * CHUNK: (i + 1) * CHUNK]


def store(tmp_path, **kw) -> SparseStore:
    return SparseStore(tmp_path / "cache", kw.pop("max_bytes", 1 << 30), **kw)


def test_chunks_land_at_their_offsets_and_read_back(tmp_path):
    s = store(tmp_path)
    assert s.put_chunks(CONTENT, 2, [chunk(2), chunk(3), chunk(4)], N)
    assert s.put_chunks(CONTENT, 7, [chunk(7)], None)
    assert s.stored_chunks(CONTENT, range(N)) == {2, 3, 4, 7}
    assert s.stored_chunks("another file", range(N)) == set()
    for i in range(N):
        assert s.get(CONTENT, i) == (chunk(i) if i in (2, 3, 4, 7) else None)
    data_path, index_path = s.paths_for(CONTENT)
    with open(data_path, "rb") as fh:
        on_disk = fh.read()
    assert on_disk[2 * CHUNK: 5 * CHUNK] == DATA[2 * CHUNK: 5 * CHUNK]  # the remote file's own offsets
    assert on_disk[:2 * CHUNK] == bytes(2 * CHUNK)                       # a hole reads as zeros
    assert os.stat(data_path).st_blocks * 512 <= 4 * CHUNK + 65536        # holes take no room
    assert s.sealed_path(CONTENT) is None
    assert oct(os.stat(data_path).st_mode & 0o777) == oct(0o600) == oct(os.stat(index_path).st_mode & 0o777)


def test_the_last_chunk_seals_the_file_a_byte_identical_copy(tmp_path):
    s = store(tmp_path)
    s.put_chunks(CONTENT, 0, [chunk(i) for i in range(N - 1)], N)
    assert s.sealed_path(CONTENT) is None
    s.put_chunks(CONTENT, N - 1, [chunk(N - 1)], N)
    path = s.sealed_path(CONTENT)
    with open(path, "rb") as fh:
        assert fh.read() == DATA
    assert s.stats()["sealed"] == 1
    again = SparseStore(tmp_path / "cache", 1 << 30)  # another process's view: the header says so
    assert again.sealed_path(CONTENT) == path
    mtime = os.stat(path).st_mtime_ns
    assert again.put_chunks(CONTENT, 0, [chunk(0)], N)  # never written again
    assert os.stat(path).st_mtime_ns == mtime


@pytest.mark.parametrize("damage", ["bytes", "record-without-key", "moved"])
def test_forged_or_damaged_chunks_are_misses_and_fetched_again(tmp_path, damage, caplog):
    s = store(tmp_path)
    s.put_chunks(CONTENT, 0, [chunk(0), chunk(1)], N)
    data_path, index_path = s.paths_for(CONTENT)
    forged = bytes(CHUNK)
    if damage == "bytes":  # the data rewritten in place
        with open(data_path, "r+b") as fh:
            fh.seek(10)
            fh.write(b"forged")
    elif damage == "record-without-key":  # bytes and a record whose MAC is computed under another key
        digest = entry.key_digest(CONTENT)
        with open(data_path, "r+b") as fh:
            fh.write(forged)
        with open(index_path, "r+b") as fh:
            fh.seek(HEADER_SIZE)
            fh.write(struct.pack("<16sII", entry.chunk_mac(os.urandom(32), digest, 0, forged), CHUNK, 0))
    else:  # chunk 1's bytes and record copied to chunk 0's place: their MAC names chunk 1
        with open(data_path, "r+b") as fh:
            fh.write(chunk(1))
        with open(index_path, "r+b") as fh:
            fh.seek(HEADER_SIZE + RECORD)
            record = fh.read(RECORD)
            fh.seek(HEADER_SIZE)
            fh.write(record)
    with caplog.at_level(logging.WARNING, logger="ckptfs.sources.remote.store.sparse_store"):
        assert s.get(CONTENT, 0) is None
    assert s.stats()["forged"] == 1
    assert s.stored_chunks(CONTENT, range(N)) == {1}  # dropped: fetched and stored again
    assert s.get(CONTENT, 1) == chunk(1)
    assert len([r for r in caplog.records if "forged chunk 0" in r.getMessage()]) == 1
    s.put_chunks(CONTENT, 0, [chunk(0)], N)
    assert s.get(CONTENT, 0) == chunk(0)


def test_a_crash_before_the_data_is_synced_leaves_the_chunk_absent(tmp_path, monkeypatch):
    s = store(tmp_path)

    def crash(fd, offset, length):
        raise OSError(5, "power lost")  # the data was written, not yet on the device: no record may exist

    monkeypatch.setattr(sparse_store, "write_out", crash)
    assert not s.put_chunks(CONTENT, 0, [chunk(0), chunk(1)], N)
    monkeypatch.undo()
    fresh = SparseStore(tmp_path / "cache", 1 << 30)
    assert fresh.stored_chunks(CONTENT, range(N)) == set()
    assert fresh.get(CONTENT, 0) is None


@pytest.mark.parametrize("order", ["in file order", "backwards", "odd ones first"])
def test_a_file_seals_when_its_last_absent_chunk_lands_whatever_the_order(tmp_path, monkeypatch, order):
    monkeypatch.setattr(sparse_store, "_SCAN_RECORDS", 3)  # the records read in several blocks
    s = store(tmp_path)
    indexes = {"in file order": list(range(N)), "backwards": list(range(N))[::-1],
               "odd ones first": [*range(1, N, 2), *range(0, N, 2)]}[order]
    for k, i in enumerate(indexes):
        assert s.sealed_path(CONTENT) is None, f"sealed with {N - k} chunks absent"
        s.put_chunks(CONTENT, i, [chunk(i)], N)
    with open(s.sealed_path(CONTENT), "rb") as fh:
        assert fh.read() == DATA


def test_a_chunk_evicted_behind_the_filling_keeps_the_file_unsealed_until_it_is_stored_again(tmp_path, monkeypatch):
    monkeypatch.setattr(sparse_store, "_SCAN_RECORDS", 3)
    s = store(tmp_path)
    s.put_chunks(CONTENT, 0, [chunk(i) for i in range(N - 2)], N)
    s.put_chunks(CONTENT, N - 2, [chunk(N - 2)], N)  # the store has looked past chunk 1 by now
    data_path, index_path = s.paths_for(CONTENT)
    with open(index_path, "r+b") as fh:  # another process evicts chunk 1 (its record cleared, as eviction does)
        fh.seek(HEADER_SIZE + 1 * RECORD)
        fh.write(bytes(RECORD))
    s.put_chunks(CONTENT, N - 1, [chunk(N - 1)], N)
    assert s.sealed_path(CONTENT) is None
    assert s.stored_chunks(CONTENT, range(N)) == set(range(N)) - {1}
    s.put_chunks(CONTENT, 1, [chunk(1)], N)
    with open(s.sealed_path(CONTENT), "rb") as fh:
        assert fh.read() == DATA


def test_eviction_punches_old_chunks_of_unsealed_files_and_removes_sealed_ones_whole(tmp_path):
    s = store(tmp_path)
    sealed = CONTENT + ":sealed"
    s.put_chunks(sealed, 0, [chunk(i) for i in range(N)], N)
    s.put_chunks(CONTENT, 0, [chunk(i) for i in range(6)], N)
    data_path, index_path = s.paths_for(CONTENT)
    with open(index_path, "r+b") as fh:  # chunk 3 unused for an hour, the sealed file for a day
        fh.seek(HEADER_SIZE + 3 * RECORD + 20)
        fh.write(struct.pack("<I", sparse_store._minutes() - 60))
    sealed_data, sealed_index = s.paths_for(sealed)
    with open(sealed_index, "r+b") as fh:
        for i in range(N):
            fh.seek(HEADER_SIZE + i * RECORD + 20)
            fh.write(struct.pack("<I", sparse_store._minutes() - 24 * 60))
    blocks = os.stat(data_path).st_blocks
    with open(sealed_data, "rb") as reader:  # an open reader keeps its copy
        removed = s.prune(need=1)
        assert removed["files"] == 1 and removed["chunks"] == 0
        assert not os.path.exists(sealed_data) and not os.path.exists(sealed_index)
        assert reader.read() == DATA
    removed = s.prune(need=1)
    assert removed == {"chunks": 1, "files": 0, "bytes": CHUNK}
    assert s.stored_chunks(CONTENT, range(N)) == {0, 1, 2, 4, 5}
    assert os.stat(data_path).st_blocks <= blocks - CHUNK // 512  # the hole is freed
    assert s.get(CONTENT, 3) is None and s.get(CONTENT, 4) == chunk(4)


def test_the_bound_and_the_free_space_floor_are_measured_in_blocks(tmp_path):
    # written within a roomy bound (a write past the bound starts a prune on a thread, which would race the
    # measure below), then measured and pruned under a bound of 3 chunks
    store(tmp_path).put_chunks(CONTENT, 0, [chunk(i) for i in range(6)], N)
    s = store(tmp_path, max_bytes=3 * CHUNK)
    assert s.excess() >= 6 * CHUNK - int(3 * CHUNK * sparse_store.LOW_WATER)
    s.prune()
    assert sparse_store.folder_bytes(tmp_path / "cache") <= 3 * CHUNK * sparse_store.LOW_WATER + 65536
    roomy = store(tmp_path, max_bytes=1 << 40, min_free=100.0)  # no file system is 100 % free
    assert roomy.excess() > 0


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
def test_a_full_file_system_costs_storage_never_a_read(tmp_path, caplog, direct):
    with tmpfs(tmp_path / "small", "1m") as root:
        s = SparseStore(root, 1 << 30, min_free=0.0)  # no floor: the writes find the file system full
        with caplog.at_level(logging.WARNING, logger="ckptfs.sources.remote.store.sparse_store"):
            stored = [i for i in range(N) if s.put_chunks(CONTENT, i, [chunk(i)], N, direct=direct) or
                      setattr(s, "_paused_until", 0.0)]
        assert 0 < len(stored) < N
        for i in range(N):
            assert s.get(CONTENT, i) == (chunk(i) if i in stored else None)
        assert len([r for r in caplog.records if "file system is full" in r.getMessage()]) == 1


def test_chunks_of_the_older_format_are_ignored_with_one_line(tmp_path, caplog):
    old = tmp_path / "cache" / "bytes" / "ab"
    old.mkdir(parents=True)
    (old / ("ab" * 16 + ".e")).write_bytes(b"an old entry")
    with caplog.at_level(logging.WARNING, logger="ckptfs.sources.remote.store.sparse_store"):
        s = store(tmp_path)
    assert [r.getMessage() for r in caplog.records if "older format" in r.getMessage()] != []
    assert len(caplog.records) == 1
    assert s.stored_chunks(CONTENT, range(N)) == set()


HOLDER = textwrap.dedent("""
    import os, sys
    from ckptfs.sources.remote.store.sparse_store import SparseStore
    s = SparseStore(sys.argv[1], 1 << 30)
    print(s.lease(sys.argv[2], [1, 2]), flush=True)
    sys.stdin.readline()
    if sys.argv[3] == "store":
        s.put_chunks(sys.argv[2], 1, [b"1" * (256 * 1024)], None)
        print("stored", flush=True)
        sys.stdin.readline()
""")


@pytest.mark.parametrize("ending", ["store", "killed"])
def test_a_lease_is_exclusive_between_processes_and_ends_with_its_holder(tmp_path, ending):
    s = store(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "cache"), CONTENT, ending],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "[True, True]"
        assert s.lease(CONTENT, [0, 1, 2, 3]) == [True, False, False, True]
        s.release(CONTENT, [0, 3])
        if ending == "store":
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.stdout.readline().strip() == "stored"
            # chunk 1 stored and its lease given up with it; chunk 2's lease still held: waited out
            assert s.wait(CONTENT, [1, 2], timeout=0.2) == [b"1" * CHUNK, None]
            assert s.lease(CONTENT, [1, 2]) == [False, False]  # stored; leased elsewhere
        else:
            holder.kill()
            holder.wait(10)
            assert s.wait(CONTENT, [1, 2], timeout=30) == [None, None]  # ended without a value: fetch
            assert s.lease(CONTENT, [1, 2]) == [True, True]
    finally:
        holder.kill()
        holder.wait(10)


def test_leases_are_open_file_description_locks():
    import fcntl

    assert range_lease.F_OFD_SETLK == getattr(fcntl, "F_OFD_SETLK", 37)


def test_the_chunk_cache_reads_the_store_below_memory(tmp_path):
    s = store(tmp_path)
    cache = ChunkCache(s, memory=MemoryChunks(4 * CHUNK))
    keys = [chunk_key(CONTENT, i) for i in range(4)]
    cache.put_run(keys, [chunk(i) for i in range(4)], N, memory=False)
    assert keys[2] not in cache.memory and cache.stored_chunks(CONTENT, range(N)) == {0, 1, 2, 3}
    assert cache.get(keys[2]) == chunk(2) and keys[2] in cache.memory
    assert cache.held(CONTENT, range(6)) == {0, 1, 2, 3}
    assert cache.lookup([chunk_key(CONTENT, i) for i in (3, 4)]) == [chunk(3), None]


def test_a_store_that_fails_holds_nothing():
    class Broken:
        def get(self, content_id, index):
            raise OSError("the folder went away")

        def stored_chunks(self, content_id, indexes):
            raise OSError("the folder went away")

    cache = ChunkCache(Broken())
    assert cache.stored_chunks(CONTENT, range(8)) == set()
    assert cache.get(chunk_key(CONTENT, 0)) is None


def test_the_free_space_floor_is_an_open_option_that_reaches_the_store(tmp_path):
    from ckptfs.core.options import OpenOptions
    from ckptfs.sources.plan import SourcePlan

    options = OpenOptions.build(cache_dir=str(tmp_path / "cache"), cache_dir_min_free=12.5)
    plan = SourcePlan("http://127.0.0.1:9/model.gguf", options)
    assert plan.options.chunk_cache().disk.min_free == 12.5
    default = SourcePlan("http://127.0.0.1:9/model.gguf", OpenOptions.build(cache_dir=str(tmp_path / "cache")))
    assert default.options.chunk_cache().disk.min_free == sparse_store.DEFAULT_MIN_FREE == 5.0
    for bad in (-1, 100, "5%", True):
        with pytest.raises(ValueError, match="cache_dir_min_free must be a percentage"):
            OpenOptions.build(cache_dir_min_free=bad)


def test_an_unsealed_file_left_without_chunks_is_removed_unless_it_is_being_filled(tmp_path):
    s = store(tmp_path)
    filling = CONTENT + ":filling"
    s.put_chunks(CONTENT, 0, [chunk(0), chunk(1)], N)
    s.put_chunks(filling, 0, [chunk(0)], N)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "cache"), filling, "killed"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "[True, True]"  # chunks 1, 2 of ``filling`` being fetched
        assert s.prune(need=1 << 30) == {"chunks": 3, "files": 0, "bytes": 3 * CHUNK}
        assert not any(os.path.exists(p) for p in s.paths_for(CONTENT))  # nothing left in it: removed
        assert all(os.path.exists(p) for p in s.paths_for(filling))      # a fetcher is filling it: kept
    finally:
        holder.kill()
        holder.wait(10)


@pytest.mark.parametrize("damage", ["bytes", "record", "length"])
def test_a_damaged_chunk_or_record_of_a_sealed_file_drops_that_chunk_alone(tmp_path, damage):
    s = store(tmp_path)
    s.put_chunks(CONTENT, 0, [chunk(i) for i in range(N)], N)
    other = store(tmp_path)  # another process's view of the folder, the file open there while sealed
    assert other.get(CONTENT, 0) == chunk(0)
    data_path, index_path = s.paths_for(CONTENT)
    if damage == "bytes":
        path, at, value = data_path, 3 * CHUNK + 5, bytes([DATA[3 * CHUNK + 5] ^ 1])
    elif damage == "record":  # a byte of chunk 3's MAC
        path, at, value = index_path, HEADER_SIZE + 3 * RECORD + 2, None
    else:  # chunk 3's length: a chunk's at most, or no read of it is made
        path, at, value = index_path, HEADER_SIZE + 3 * RECORD + 16, struct.pack("<I", 0xFFFF_FFF0)
    with open(path, "r+b") as fh:
        if value is None:
            fh.seek(at)
            value = bytes([fh.read(1)[0] ^ 1])
        fh.seek(at)
        fh.write(value)
    assert s.get(CONTENT, 3) is None and s.stats()["forged"] + s.stats()["corrupt"] == 1
    assert os.path.exists(data_path) and s.sealed_path(CONTENT) is None  # unsealed, the rest kept
    assert s.stored_chunks(CONTENT, range(N)) == set(range(N)) - {3}
    assert [s.get(CONTENT, i) for i in range(N) if i != 3] == [chunk(i) for i in range(N) if i != 3]
    assert other.put_chunks(CONTENT, 3, [chunk(3)], N)  # stored again, by the process that thought it sealed
    assert s.get(CONTENT, 3) == chunk(3) and s.sealed_path(CONTENT) == data_path  # complete: sealed again


def test_the_free_space_floor_is_a_flag_of_the_commands(tmp_path):
    from cli_runs import one_error_line, run_cli

    cache = tmp_path / "cache"
    s = SparseStore(cache, 1 << 40)
    s.put_chunks(CONTENT, 0, [chunk(i) for i in range(N)], N)  # sealed
    s.put_chunks(CONTENT + ":part", 0, [chunk(0)], N)
    kept = run_cli("cache", "prune", "--cache-dir", str(cache), "--cache-dir-size", "1T")
    assert kept.returncode == 0, kept.stderr
    assert s.stored_chunks(CONTENT, range(N)) == set(range(N))  # under the bound, the default floor met
    pruned = run_cli("cache", "prune", "--cache-dir", str(cache), "--cache-dir-size", "1T",
                     "--cache-dir-min-free", "99.99")  # a floor no file system meets: everything evictable goes
    assert pruned.returncode == 0, pruned.stderr
    assert s.stored_chunks(CONTENT, range(N)) == set() == s.stored_chunks(CONTENT + ":part", range(N))
    for command in (["prefetch", "http://127.0.0.1:9/m.gguf"], ["cache", "prune"]):
        one_error_line(run_cli(*command, "--cache-dir", str(cache), "--cache-dir-min-free", "100"), 2,
                       "--cache-dir-min-free", "below 100")
    assert "--cache-dir-min-free" in run_cli("mount", "--help").stdout
    from ckptfs.commands.cli import mount
    from ckptfs.commands.fstab import mount_arguments, parse_helper_argv

    assert mount_arguments(parse_helper_argv(["src", "mnt", "-o", "cache_dir_min_free=7"]), mount)[3:] == [
        "--cache-dir-min-free", "7"]  # the fstab spelling


def _descriptors_of(*paths) -> int:
    """How many descriptors this process holds of ``paths`` (deleted since, too). Only the entry's own files
    are counted: a store's background prune opens the folder's ``.lock`` and walks its subfolders while it
    runs, and other tests' threads open descriptors elsewhere."""
    names = {str(p) for p in paths}
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # (closed meanwhile, or the listing's own descriptor)
            continue
        held += target.removesuffix(" (deleted)") in names
    return held


def test_a_damaged_index_header_drops_the_file_with_one_line_and_leaks_no_descriptor(tmp_path, caplog):
    s = store(tmp_path)
    s.put_chunks(CONTENT, 0, [chunk(0)], N)
    data_path, index_path = s.paths_for(CONTENT)
    with open(index_path, "r+b") as fh:
        fh.seek(30)
        fh.write(b"\xff\xff")  # inside the crc'd header
    fresh = SparseStore(tmp_path / "cache", 1 << 30)
    held = _descriptors_of(data_path, index_path)  # (the first store's: the files it wrote)
    assert held == 2
    with caplog.at_level(logging.WARNING, logger="ckptfs.sources.remote.store.sparse_store"):
        assert fresh.get(CONTENT, 0) is None and fresh.get(CONTENT, 0) is None
    assert _descriptors_of(data_path, index_path) == held
    assert not os.path.exists(index_path) and not os.path.exists(data_path)
    assert len([r for r in caplog.records if "header checksum mismatch" in r.getMessage()]) == 1
    assert fresh.put_chunks(CONTENT, 0, [chunk(0)], N) and fresh.get(CONTENT, 0) == chunk(0)


def test_a_store_that_pauses_writing_gives_up_the_leases_of_what_it_did_not_store(tmp_path):
    s = store(tmp_path)
    other = SparseStore(tmp_path / "cache", 1 << 30)  # its own open files: its leases conflict with s's
    assert s.lease(CONTENT, [0]) == [True] and other.lease(CONTENT, [0]) == [False]
    s._paused_until = float("inf")  # the file system was full a moment ago
    assert not s.put_chunks(CONTENT, 0, [chunk(0)], N)
    assert other.lease(CONTENT, [0]) == [True]  # not stored, and the lease given up: the other fetches it


def resident_pages(path) -> tuple[int, int]:
    """(pages of ``path`` in the page cache, pages of it): ``mincore`` over a read-only mapping of it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                              ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec.raw), pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def direct_write_probe(folder, length: int) -> tuple[bool, bool]:
    """(whether the file system of ``folder`` takes an ``O_DIRECT`` write of ``length`` bytes, whether what it
    took stays out of the page cache): a tmpfs takes them and keeps every page in memory, ext4 refuses a
    length that is no multiple of its blocks."""
    probe = folder / "direct-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False, False
    try:
        with mmap.mmap(-1, max(length, mmap.PAGESIZE)) as buf, memoryview(buf) as view:
            os.pwrite(fd, view[:length], 0)
        return True, resident_pages(probe)[0] == 0
    except OSError:
        return False, False
    finally:
        os.close(fd)
        probe.unlink()


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
def test_a_warm_ups_chunks_are_written_past_the_page_cache(tmp_path, direct):
    """Chunks no reader waits for (``direct``: a warm-up's) go to the device without filling the page cache:
    the file's whole chunks are not resident once written, the same bytes read back checked, and the
    file's short last chunk is written too. A reader's chunks (buffered) stay in the page cache."""
    if direct_write_probe(tmp_path, mmap.PAGESIZE) != (True, True):
        pytest.skip("this file system takes no O_DIRECT writes, or keeps them in memory (tmpfs)")
    s = store(tmp_path)
    assert s.put_chunks(CONTENT, 0, [chunk(i) for i in range(5)], N, direct=direct)
    assert s.put_chunks(CONTENT, 5, [chunk(i) for i in range(5, N)], N, direct=direct)
    data_path, _ = s.paths_for(CONTENT)
    resident, pages = resident_pages(data_path)
    whole = (N - 1) * CHUNK // mmap.PAGESIZE
    if direct:
        assert resident <= pages - whole, (resident, pages)  # at most the short last chunk's pages
    else:
        assert resident == pages
    assert s.sealed_path(CONTENT) == data_path
    fresh = store(tmp_path)
    assert [fresh.get(CONTENT, i) for i in range(N)] == [chunk(i) for i in range(N)]
    with open(data_path, "rb") as fh:
        assert fh.read() == DATA


def test_a_direct_write_the_file_system_refuses_is_written_buffered(tmp_path):
    """``O_DIRECT`` refuses what is not aligned (``EINVAL``) on most file systems: those bytes are written
    buffered, and so is every later write of that file; the bytes land either way."""
    refused = not direct_write_probe(tmp_path, 1000)[0]
    path = tmp_path / "data"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        writer = DirectWriter(fd, BouncePool())
        buffered = functools.partial(sparse_store._write_all, fd)
        odd = memoryview(b"x" * 1000)  # not a multiple of a page: O_DIRECT refuses it where it is taken at all
        assert writer.write([odd], 0, buffered) == 1000
        assert writer.usable is not refused
        assert writer.write([memoryview(b"y" * mmap.PAGESIZE)], mmap.PAGESIZE, buffered) == mmap.PAGESIZE
        writer.close()
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 1000 + bytes(mmap.PAGESIZE - 1000) + b"y" * mmap.PAGESIZE


def test_the_direct_writes_of_many_files_share_a_few_buffers():
    """A warm-up writing many files holds a few aligned buffers in all, not one per file: a buffer given back
    is the next one taken (for any size up to its own), and at most ``KEPT_BYTES`` of them are kept between
    writes."""
    pool = BouncePool()
    first = pool.take()
    assert len(first) == BUFFER_BYTES
    pool.give(first)
    assert pool.take(BUFFER_BYTES) is first
    kept = KEPT_BYTES // BUFFER_BYTES
    taken = [first] + [pool.take() for _ in range(kept + 3)]
    assert len({id(b) for b in taken}) == len(taken)  # writes at once each get their own
    for b in taken:
        pool.give(b)
    again = [pool.take() for _ in range(kept + 1)]
    assert sum(any(b is t for t in taken) for b in again) == kept
    assert len(pool.take(BUFFER_BYTES + 1)) == BUFFER_BYTES + direct_write.BOUNCE_BYTES  # (larger: whole MiB)
    kept = pool.take()
    pool.give(kept)
    pool.let_go()  # (a warm-up ended): none kept, the next one is made anew
    assert pool.take() is not kept


def test_a_landing_buffer_is_written_from_where_it_is_and_lent_again(tmp_path):
    """Chunks that landed in a buffer the pool lent (``landing``) go to the file in one write from that
    buffer, not copied into a bounce buffer first; the same bytes land as through a copy, and the buffer is
    lent again once the block ends."""
    pool = BouncePool()
    path = tmp_path / "data"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    data = bytes(range(256)) * (4 * CHUNK // 256)
    copied = []
    try:
        writer = DirectWriter(fd, pool)
        buffered = functools.partial(sparse_store._write_all, fd)
        with pool.landing(len(data)) as into:
            into[:] = data
            lent = into.obj
            taken = pool.take

            def counting(nbytes=direct_write.BOUNCE_BYTES):
                copied.append(nbytes)
                return taken(nbytes)

            pool.take = counting  # the bounce buffers a copy would take
            views = [into[k * CHUNK: (k + 1) * CHUNK] for k in range(4)]
            assert writer.write(views, 0, buffered) == len(data)
            del views
            pool.take = taken
        writer.close()
    finally:
        os.close(fd)
    assert path.read_bytes() == data
    assert copied == [] or not direct_write_probe(tmp_path, mmap.PAGESIZE)[0]  # no bounce where O_DIRECT works
    with pool.landing(CHUNK) as again:
        assert again.obj is lent
