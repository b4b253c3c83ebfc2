"""Which fetched chunks a process holds, asked for many chunks at once (``ChunkCache.stored_chunks`` / ``held``).

A warm-up asks for every chunk of a checkpoint several times, and read-ahead for every chunk of each piece it
claims; the answers must be what the ``--cache-dir`` store and the memory LRU hold: chunks stored in runs,
alone, in memory only, or nowhere. What was put is the oracle (and the store's data file): a chunk put is
found, one not put is not."""

from __future__ import annotations

import os

from ckptfs.sources.remote.store.chunks import CHUNK, ChunkCache, MemoryChunks, chunk_key, disk_store

CONTENT = "test:chunk-lookup:" + os.urandom(8).hex()


def _cache(tmp_path) -> ChunkCache:
    return ChunkCache(disk_store(str(tmp_path / "cache"), 1 << 30), memory=MemoryChunks(64 * CHUNK))


def _chunks(first: int, last: int) -> tuple[list, list[bytes]]:
    return ([chunk_key(CONTENT, i) for i in range(first, last)],
            [bytes([i % 251 + 1]) * CHUNK for i in range(first, last)])


def test_runs_single_chunks_memory_and_gaps_are_told_apart(tmp_path):
    cache = _cache(tmp_path)
    n = 22
    for first, last in ((0, 8), (9, 11), (20, 22)):
        keys, parts = _chunks(first, last)
        cache.put_run(keys, parts, n, memory=False)
    key, = _chunks(14, 15)[0]
    cache.put(key, bytes(CHUNK), memory=False)             # 14: alone
    cache.memory.put(chunk_key(CONTENT, 12), bytes(CHUNK))  # 12: in memory only
    on_disk = set(range(8)) | {9, 10, 14, 20, 21}
    data_path, _ = cache.disk.paths_for(CONTENT)
    with open(data_path, "rb") as fh:
        stored = fh.read()
    assert {i for i in range(n) if stored[i * CHUNK: i * CHUNK + 1] not in (b"", b"\0")} == on_disk - {14}
    assert cache.stored_chunks(CONTENT, range(n)) == on_disk
    assert cache.held(CONTENT, range(n)) == on_disk | {12}
    assert cache.stored_chunks(CONTENT, range(5, 11)) == {5, 6, 7, 9, 10}
    assert cache.stored_chunks(CONTENT, [3, 13, 21]) == {3, 21}
    assert cache.stored_chunks("another file", range(n)) == set()
    # the one-chunk questions agree with the many-chunk ones
    assert {i for i in range(n) if cache.stored(chunk_key(CONTENT, i))} == on_disk
    assert {i for i in range(n) if cache.has(chunk_key(CONTENT, i))} == on_disk | {12}


def test_an_evicted_file_is_no_longer_counted(tmp_path):
    cache = _cache(tmp_path)
    keys, parts = _chunks(0, 8)
    cache.put_run(keys, parts, 16, memory=False)
    assert cache.stored_chunks(CONTENT, range(8)) == set(range(8))
    for path in cache.disk.paths_for(CONTENT):
        os.unlink(path)  # evicted by another process
    assert cache.stored_chunks(CONTENT, range(8)) == set()
    cache.put_run(keys[:2], parts[:2], 16, memory=False)  # stored again, in a file of its own
    assert cache.stored_chunks(CONTENT, range(8)) == {0, 1}


def test_no_store_or_a_store_that_fails_holds_nothing(tmp_path):
    assert ChunkCache(None).stored_chunks(CONTENT, range(8)) == set()

    class Broken:
        def stored_chunks(self, content_id, indexes):
            raise OSError("the folder went away")

    assert ChunkCache(Broken()).stored_chunks(CONTENT, range(8)) == set()
