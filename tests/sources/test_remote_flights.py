"""One fetch per chunk in a process, and warm-ups that keep out of the readers' memory.

Debian's nginx on loopback serves random bytes; its access log (with each request's Range) is what the origin
saw. What is proved:

- two sources of one URL in a process (the header reader of an open and a warm-up started before it, as
  ``ckptfs prefetch`` runs them) share their fetches: a reader of chunks another source is fetching waits for
  that fetch instead of sending its own request, and gets the same bytes;
- a warm-up's chunks go to the ``--cache-dir`` store only, not into the process's memory LRU, so warming a
  whole checkpoint does not evict the chunks readers are using; chunks fetched together are stored as one
  entry per aligned run of four (a quarter of the files); every byte read back from the store is the file's.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("urllib3")

from ckptfs.sources.remote import curl
from ckptfs.sources.remote.store.direct_write import AlignedBuffer
from ckptfs.sources.remote.store.names import name_path
from ckptfs.sources.remote.store.chunks import CHUNK, MEMORY_CHUNKS, chunk_key
from ckptfs.core.runtime import runtime
from ckptfs.sources import Opener
from ckptfs.core.options import OpenOptions
from ckptfs.sources.remote.options import RemoteOptions
from ckptfs.sources.remote.transport import record_name
from ckptfs.sources.remote.warmup import warm
from loopback.servers import data_ranges, same_bytes
from conftest import nginx_origin

MiB = 1 << 20


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    with nginx_origin(tmp_path_factory, lambda root: same_bytes(root, ("shared.bin", "warm.bin", "landed.bin", "kept.bin"), 12 * MiB)) \
            as (server, _, data):  # each test its own file: its own log lines
        yield server, data


def _source(url: str, **options):
    # a RemoteOptions of its own per source: nothing memoized between them (an open and a warm-up each probe)
    read_ahead = options.pop("read_ahead", True)
    return Opener(RemoteOptions(OpenOptions.build(timeout=20, stall_timeout=5, **options), read_ahead)).source(url)


def test_a_reader_waits_for_the_fetch_another_source_of_the_url_has_under_way(origin):
    server, data = origin
    url = f"{server.url}/shared.bin"
    fetcher, reader = _source(url), _source(url, read_ahead=False)  # as a warm-up's and a header reader's
    before = len(server.access_log())
    runs = fetcher.claim(16, 24)  # bytes 4..6 MiB are now on their way (not fetched yet; an open without a
    assert runs == [(16, 24)]     # --cache-dir fetched and kept the first 2 MiB)
    got: dict = {}
    waiting = threading.Thread(target=lambda: got.update(head=reader.pread(4 * MiB, 2 * MiB)))
    waiting.start()
    time.sleep(0.5)  # the reader has asked; with fetches of its own it would have sent its request by now
    assert data_ranges(server.ranges("shared.bin", before), len(data)) == []
    assert waiting.is_alive()  # waiting for the fetcher's chunks
    assert fetcher.fetch_claimed(runs) is None
    waiting.join(20)
    assert got["head"] == data[4 * MiB:6 * MiB]
    time.sleep(0.2)  # nginx logs a request once its answer is sent
    assert data_ranges(server.ranges("shared.bin", before), len(data)) == [(4 * MiB, 6 * MiB)]  # one request, not two


def test_a_warm_up_stores_its_chunks_without_filling_the_memory_cache(origin, tmp_path):
    server, data = origin
    url = f"{server.url}/warm.bin"
    source = _source(url, cache_dir=str(tmp_path / "cache"))
    chunks = -(-len(data) // CHUNK)
    report = warm([source])
    assert report.ok and report.fetched == len(data), report.summary()
    keys = [chunk_key(source.content_id(), i) for i in range(chunks)]
    assert not any(key in runtime().get(MEMORY_CHUNKS) for key in keys)  # the readers' LRU holds none of the warm-up's chunks
    assert source.unstored_chunks() == []  # every one is in the store ...
    sealed = source.fetcher.cache.disk.sealed_path(source.content_id())  # ... as one sealed file, not 48 entries
    assert sealed is not None and Path(sealed).read_bytes() == data
    name_record = name_path(str(tmp_path / "cache" / "remote"), record_name(url))  # what the URL stood for
    assert {p.name for p in (tmp_path / "cache" / "remote").glob("*/*")} == {
        Path(sealed).name, Path(sealed).with_suffix(".idx").name, Path(name_record).name}
    at = 5 * MiB + 12345  # a read inside a run: its chunk from the store
    assert source.pread(at, 4096) == data[at:at + 4096]
    assert source.pread(0, len(data)) == data  # and each reads back as the file's bytes, from the store


def test_a_warm_ups_body_lands_in_the_stores_buffer_and_its_waiters_read_the_store(origin, tmp_path):
    """Through libcurl a warm-up's body is written straight into a buffer the store lends and stored from
    there: the store is handed views of that buffer, not ``bytes`` (no copy, no fresh pages per piece). Its
    chunks' flights end with no bytes in hand, since the buffer is lent again: a reader that was waiting for
    them reads them from the store, and gets the file's bytes, with no request of its own."""
    if not curl.enabled(origin[0].url):
        pytest.skip("the libcurl extension is not built here (CKPTFS_CURL=0 or no libcurl4-openssl-dev)")
    server, data = origin
    url = f"{server.url}/landed.bin"
    source = _source(url, cache_dir=str(tmp_path / "cache"))
    reader = _source(url, cache_dir=str(tmp_path / "cache"), read_ahead=False)
    store = source.fetcher.cache.disk
    handed: list = []
    put_chunks = store.put_chunks

    def spying(content_id, first, parts, *args):
        handed.append([type(getattr(part, "obj", part)) for part in parts])
        return put_chunks(content_id, first, parts, *args)

    store.put_chunks = spying
    before = len(server.access_log())
    runs = source.claim(16, 32)  # bytes 4..8 MiB, on their way from now on
    got: dict = {}
    waiting = threading.Thread(target=lambda: got.update(body=reader.pread(5 * MiB, 2 * MiB)))
    waiting.start()
    time.sleep(0.3)
    assert source.fetch_claimed(runs, memory=False) is None
    waiting.join(20)
    assert got["body"] == data[5 * MiB:7 * MiB]
    assert handed and all(kinds == [AlignedBuffer] * len(kinds) for kinds in handed), handed
    time.sleep(0.2)  # nginx logs a request once its answer is sent
    assert data_ranges(server.ranges("landed.bin", before), len(data)) == [(4 * MiB, 8 * MiB)]
    assert source.pread(4 * MiB, 4 * MiB) == data[4 * MiB:8 * MiB]


def test_a_warm_up_lets_go_of_its_landing_buffers_when_it_ends(origin, tmp_path):
    """The buffers a warm-up's pieces landed in are kept for its next pieces, and let go once it ends: a
    mount's daemon that warmed its checkpoint up does not keep them for the rest of its life."""
    server, data = origin
    source = _source(f"{server.url}/kept.bin", cache_dir=str(tmp_path / "cache"))
    pool = source.fetcher.cache.disk._bounce  # probe: the store's pool (how many buffers it keeps)
    let_go, kept_then = pool.let_go, []

    def letting_go():
        kept_then.append(pool._kept)
        let_go()

    pool.let_go = letting_go
    report = warm([source])
    assert report.ok and report.fetched == len(data), report.summary()
    assert kept_then and kept_then[0] > 0  # kept while the warm-up ran (its pieces landed in them) ...
    assert pool._kept == 0 and pool._free == []  # ... and let go when it ended
