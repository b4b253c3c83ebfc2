"""Remote read-ahead over loopback nginx: a sequential reader's bytes arrive in few, large range requests
fetched ahead of it, and leave the process's memory once it has read past them; a random reader fetches only
the 256 KiB chunks covering its reads. Counts come from nginx's access log (with the Range header of each
request)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

pytest.importorskip("urllib3")

from ckptfs.sources import Opener
from ckptfs.sources.remote.store.chunks import CHUNK
from ckptfs.core.options import OpenOptions
from ckptfs.sources.remote.options import RemoteOptions
from loopback.servers import Nginx
from conftest import require_nginx

MiB = 1 << 20


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    require_nginx()
    root = tmp_path_factory.mktemp("www")
    data = os.urandom(48 * MiB)
    (root / "blob.bin").write_bytes(data)
    (root / "random.bin").write_bytes(data)  # its own file: no other test's read-ahead in its log lines
    (root / "passed.bin").write_bytes(data)
    with Nginx(root) as server:
        yield server, data


def _settled(server: Nginx) -> int:
    """The access log's length once the open's requests are all in it: its first GET and the tail sample sent
    beside it end on their own, so the latter may be logged after the open returned (bounded: 5 s)."""
    seen = -1
    for _ in range(50):
        now = len(server.access_log())
        if now == seen:
            return now
        seen = now
        time.sleep(0.1)
    return seen


def _open(server: Nginx, name: str):
    return Opener(RemoteOptions(OpenOptions.build(timeout=10, stall_timeout=2))).source(f"{server.url}/{name}")


def test_sequential_reads_are_fetched_ahead_in_large_requests(blob):
    server, data = blob
    source = _open(server, "blob.bin")
    before = _settled(server)
    start, step, reads = 4 * MiB, 128 * 1024, 160  # 20 MiB in 128 KiB reads, as the kernel sends them
    for i in range(reads):
        offset = start + i * step
        assert source.pread(offset, step) == data[offset:offset + step]
    ranges = server.ranges("blob.bin", before)
    assert len(ranges) < reads // 4, ranges  # one request per read would be 160
    assert max(end - begin for begin, end in ranges) >= 2 * MiB
    covered = sorted(ranges)
    assert covered[0][0] <= start and max(end for _, end in covered) >= start + reads * step


def test_a_stream_keeps_in_memory_only_the_chunks_its_reader_has_not_read_past(blob):
    server, data = blob
    source = _open(server, "passed.bin")
    for offset in range(0, len(data), MiB):
        assert source.pread(offset, MiB) == data[offset:offset + MiB]
    fetcher = source.fetcher
    held = [i for i in range(fetcher.chunks) if fetcher.cache.memory.contains(fetcher.key(i))]
    # what a late neighbouring request of the stream may still ask for stays (SLACK_READS reads of 1 MiB)
    from ckptfs.ahead.fetch import SLACK_READS

    assert held and len(held) * CHUNK <= (SLACK_READS + 1) * MiB, len(held)
    assert min(held) * CHUNK >= len(data) - (SLACK_READS + 1) * MiB  # the ones left are the stream's last
    again = 20 * MiB  # read again, long past: fetched again, the same bytes
    assert source.pread(again, MiB) == data[again:again + MiB]


def test_random_reads_fetch_only_their_chunks(blob):
    server, data = blob
    source = _open(server, "random.bin")
    before = _settled(server)
    rng = np.random.default_rng(3)
    offsets = sorted(int(o) for o in rng.integers(4 * MiB, 47 * MiB, 12))
    for offset in rng.permutation(offsets):
        offset = int(offset)
        assert source.pread(offset, 4096) == data[offset:offset + 4096]
    ranges = server.ranges("random.bin", before)
    # nginx's ETag is weak: each fetch is followed by a check of the last 4 KiB, sent as its answer begins
    # (sources/remote/version.py); a confirm that finds that early check still out after about as long as a
    # check takes (a loaded machine) sends its own: at least one check per fetch, at most two
    tail = (len(data) - 4096, len(data))
    checks = ranges.count(tail)
    ranges = [r for r in ranges if r != tail]
    assert len(ranges) <= len(offsets) and len(ranges) <= checks <= 2 * len(ranges), (len(ranges), checks)
    for begin, end in ranges:
        assert begin % CHUNK == 0 and end - begin <= 2 * CHUNK
        assert any(begin <= o < end for o in offsets)
