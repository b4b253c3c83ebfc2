"""Which fetched chunks a process holds, asked for many chunks at once (``ChunkCache.stored_chunks`` / ``held``).

A warm-up asks for every chunk of a checkpoint several times, and read-ahead for every chunk of each piece it
claims; the answers must be what the ``--cache-dir`` folder and the memory LRU hold: chunks stored in their
run's entry, in an entry of their own, in memory only, or nowhere. What was put is the oracle (and the
folder's files): a chunk put is found, one not put is not, whatever the layout."""

from __future__ import annotations

import os

from ckptfs.cache.chunks import CHUNK, STORED_RUN, ChunkCache, MemoryChunks, chunk_key, disk_store

CONTENT = "test:chunk-lookup:" + os.urandom(8).hex()


def _cache(tmp_path) -> ChunkCache:
    return ChunkCache(disk_store(str(tmp_path / "cache"), 1 << 30), memory=MemoryChunks(64 * CHUNK))


def _chunks(first: int, last: int) -> tuple[list, list[bytes]]:
    return ([chunk_key(CONTENT, i) for i in range(first, last)],
            [bytes([i % 251]) * CHUNK for i in range(first, last)])


def test_runs_single_entries_memory_and_gaps_are_told_apart(tmp_path):
    cache = _cache(tmp_path)
    n = 22  # the file's last run (chunks 20 and 21) is a short one of two
    keys, parts = _chunks(0, 8)
    cache.put_run(keys, parts, n, memory=False)            # chunks 0..7: two run entries
    keys, parts = _chunks(9, 11)
    cache.put_run(keys, parts, n, memory=False)            # 9, 10: no whole aligned run: an entry each
    keys, parts = _chunks(20, 22)
    cache.put_run(keys, parts, n, memory=False)            # 20, 21: the file's last run, one entry
    key, = _chunks(14, 15)[0]
    cache.put(key, bytes(CHUNK), memory=False)             # 14: an entry of its own
    cache.memory.put(chunk_key(CONTENT, 12), bytes(CHUNK))  # 12: in memory only
    entries = sorted(p.stat().st_size for p in (tmp_path / "cache" / "bytes").glob("*/*.e"))
    assert len(entries) == 6  # 2 runs of 4, the short last run, chunks 9, 10 and 14 alone
    on_disk = set(range(8)) | {9, 10, 14, 20, 21}
    assert cache.stored_chunks(CONTENT, range(n)) == on_disk
    assert cache.held(CONTENT, range(n)) == on_disk | {12}
    assert cache.stored_chunks(CONTENT, range(5, 11)) == {5, 6, 7, 9, 10}  # a range starting inside a run
    assert cache.stored_chunks(CONTENT, [3, 13, 21]) == {3, 21}             # any sorted chunks
    assert cache.stored_chunks("another file", range(n)) == set()
    # the one-chunk questions agree with the many-chunk ones
    assert {i for i in range(n) if cache.stored(chunk_key(CONTENT, i))} == on_disk
    assert {i for i in range(n) if cache.has(chunk_key(CONTENT, i))} == on_disk | {12}
    assert STORED_RUN == 4  # the layout this test builds


def test_a_deleted_run_entry_is_no_longer_counted(tmp_path):
    cache = _cache(tmp_path)
    keys, parts = _chunks(0, 8)
    cache.put_run(keys, parts, 8, memory=False)
    for entry in (tmp_path / "cache" / "bytes").glob("*/*.e"):
        entry.unlink()  # pruned by another process
        break
    found = cache.stored_chunks(CONTENT, range(8))
    assert found in ({0, 1, 2, 3}, {4, 5, 6, 7})


def test_no_store_or_a_store_that_fails_holds_nothing(tmp_path):
    assert ChunkCache(None).stored_chunks(CONTENT, range(8)) == set()

    class Broken:
        def contains(self, key):
            raise OSError("the folder went away")

    assert ChunkCache(Broken()).stored_chunks(CONTENT, range(8)) == set()
