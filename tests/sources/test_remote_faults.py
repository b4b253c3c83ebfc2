"""http:// sources against a misbehaving network: each fault gives the right bytes after retries, or a
CheckpointError within the read's timeout — never wrong bytes, never a hang.

The bytes come from Debian's nginx on loopback through ``faultproxy.FaultProxy`` (refused connections,
resets mid-body, 5xx/429 with Retry-After, slow/stalled/short bodies, a changed ETag, a server that ignores
Range). Timeouts are short (``timeout`` 4 s, ``stall_timeout`` 1 s); the elapsed-time checks are generous
upper bounds that only a hang would break.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

pytest.importorskip("urllib3")

from ckptfs.core.errors import CheckpointError
from ckptfs.sources import Opener
from ckptfs.core.runtime import runtime
from ckptfs.sources.netstats import SOURCE_COUNTERS
from ckptfs.core.options import OpenOptions
from ckptfs.sources.remote.options import RemoteOptions
from loopback.faultproxy import FaultProxy
from loopback.servers import Nginx
from conftest import require_nginx

SIZE = 6 * 1024 * 1024 + 12345
TIMEOUT, STALL = 4.0, 1.0
HANG_BOUND = TIMEOUT + 6.0  # a read must end by its timeout; this slack only absorbs a loaded machine


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    require_nginx()
    root = tmp_path_factory.mktemp("www")
    data = os.urandom(SIZE)
    (root / "blob.bin").write_bytes(data)
    with Nginx(root) as server:
        yield server, data


@pytest.fixture
def proxy(upstream):
    server, _ = upstream
    with FaultProxy(server.url) as p:
        yield p


def _open_url(url: str, timeout=TIMEOUT, stall=STALL, retries=4):
    return Opener(RemoteOptions(OpenOptions.build(timeout=timeout, stall_timeout=stall), max_retries=retries)).source(url)


def _open(proxy, **options):
    return _open_url(proxy.url + "/blob.bin", **options)


# offsets past the bytes fetched at open, so every read below is a request
OFFSET, LENGTH = 3 * 1024 * 1024 + 777, 600_000


@pytest.mark.parametrize("fault", ["500", "503", "429", "reset", "short", "stall:3", "slow:0.5", "refuse:0.2"])
def test_transient_fault_then_right_bytes(upstream, proxy, fault):
    _, data = upstream
    src = _open(proxy)
    retries_before = runtime().get(SOURCE_COUNTERS).snapshot()["retries"]
    proxy.plan(fault)
    got = src.pread(OFFSET, LENGTH)
    assert got == data[OFFSET:OFFSET + LENGTH]
    assert proxy.pending() == 0
    if not fault.startswith("slow"):  # a slow body is no failure: nothing to retry
        assert runtime().get(SOURCE_COUNTERS).snapshot()["retries"] > retries_before


def test_retry_after_is_honoured(upstream, proxy):
    _, data = upstream
    src = _open(proxy, timeout=8.0)
    proxy.plan("429:1")
    start = time.monotonic()
    assert src.pread(OFFSET, 1000) == data[OFFSET:OFFSET + 1000]
    assert time.monotonic() - start >= 0.95  # waited as the server asked, not the ~0.1 s backoff


def test_retry_after_beyond_the_deadline_fails_at_once(upstream, proxy):
    src = _open(proxy, timeout=2.0)
    proxy.plan("503:60")
    start = time.monotonic()
    with pytest.raises(CheckpointError, match="HTTP 503"):
        src.pread(OFFSET, 1000)
    assert time.monotonic() - start < 2.0 + 3.0


@pytest.mark.parametrize("fault, message", [("503", "HTTP 503"), ("reset", "connection"),
                                            ("stall:30", "stall|timed out|deadline"), ("short", "short|broken")])
def test_persistent_fault_is_an_error_within_the_timeout(upstream, proxy, fault, message):
    src = _open(proxy, retries=50)
    proxy.always(fault)
    start = time.monotonic()
    with pytest.raises(CheckpointError, match=message):
        src.pread(OFFSET, LENGTH)
    assert time.monotonic() - start < HANG_BOUND
    proxy.always(None)


@pytest.mark.parametrize("fault, message", [("etag", "changed since it was opened: validator"),
                                            ("total", "changed since it was opened: its size is now"),
                                            ("norange", "does not support Range")])
def test_an_answer_that_cannot_be_the_bytes_twice_fails_that_read(upstream, proxy, fault, message):
    """Another ETag (the file was replaced), another total, a 200 with the whole file, given again when asked
    again: an error, not bytes."""
    src = _open(proxy)
    proxy.always(fault)
    with pytest.raises(CheckpointError, match=message):
        src.pread(OFFSET, 1000)
    proxy.always(None)
    assert proxy.faults_used == [fault, fault]  # asked once more, and no more


@pytest.mark.parametrize("fault", ["etag", "total", "norange"])
def test_one_odd_answer_is_asked_again_on_a_fresh_connection(upstream, proxy, fault):
    """One backend behind a load balancer answering wrongly once: its bytes dropped, the range asked again on
    a connection never used before, and the right bytes served."""
    _, data = upstream
    src = _open(proxy)
    before = len(proxy.peers)
    proxy.plan(fault)
    assert src.pread(OFFSET, LENGTH) == data[OFFSET:OFFSET + LENGTH]
    assert proxy.faults_used == [fault]
    odd, again = proxy.peers[before], proxy.peers[before + 1]
    assert again not in proxy.peers[:before + 1], (odd, again)  # a fresh connection


def test_two_different_odd_answers_are_retried_within_the_deadline(upstream, proxy):
    _, data = upstream
    src = _open(proxy)
    proxy.plan("etag", "total")
    assert src.pread(OFFSET, LENGTH) == data[OFFSET:OFFSET + LENGTH]
    assert proxy.faults_used == ["etag", "total"]


def test_server_ignoring_range_is_refused_at_open(upstream, proxy):
    proxy.always("norange")
    with pytest.raises(CheckpointError, match="does not support Range"):
        _open(proxy)


def test_many_faults_in_a_row_never_give_wrong_bytes(upstream, proxy):
    _, data = upstream
    src = _open(proxy, timeout=10.0)
    faults = ["reset", "503", "short", "500", "reset", "short", "429"]
    for i, fault in enumerate(faults):
        proxy.plan(fault)
        offset = 2 * 1024 * 1024 + i * 500_000
        assert src.pread(offset, 400_000) == data[offset:offset + 400_000]


def test_unreachable_server_is_one_line_at_open(tmp_path):
    from loopback.servers import free_port

    port = free_port()
    with pytest.raises(CheckpointError, match="cannot open: connection failed") as info:
        Opener(RemoteOptions(OpenOptions.build(timeout=2.0, stall_timeout=0.5))).source(f"http://127.0.0.1:{port}/model.gguf")
    assert "\n" not in str(info.value)


def test_reads_are_range_requests(upstream, proxy):
    """Without a fault the proxy forwards Range untouched and nginx answers 206 with only those bytes (and,
    nginx's ETag being weak, the file's last 4 KiB once more: the re-check of its version)."""
    server, data = upstream
    src = _open(proxy)
    before = len(server.access_log())
    assert src.pread(OFFSET, 1000) == data[OFFSET:OFFSET + 1000]
    new = server.access_log()[before:]
    assert len(new) == 2 and '" 206 262144 ' in new[0]  # one aligned 256 KiB chunk, not the file
    assert '" 206 4096 ' in new[1] and f'range="bytes={SIZE - 4096}-{SIZE - 1}"' in new[1]


@pytest.mark.parametrize("fault, message", [("loop", r"redirect loop \(HTTP 302"),
                                            ("403", r"access denied \(HTTP 403; sent no credentials\)")])
def test_one_line_errors_at_open(upstream, proxy, fault, message):
    proxy.always(fault)
    with pytest.raises(CheckpointError, match=message) as info:
        _open(proxy)
    assert "\n" not in str(info.value)
    assert proxy.requests["GET"] <= 2  # neither is retried


def test_empty_and_small_files(upstream, tmp_path):
    """An empty file (the server answers 416 to the first range) opens with size 0; a file smaller than the
    first read comes whole in that one request."""
    from loopback.servers import Nginx as Server

    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "small.bin").write_bytes(b"0123456789")
    with Server(tmp_path) as server:
        empty = _open_url(server.url + "/empty.bin")
        assert empty.size == 0 and empty.pread(0, 0) == b""
        small = _open_url(server.url + "/small.bin")
        assert small.size == 10 and small.pread(3, 4) == b"3456"
        assert len(server.access_log(expect=2)) == 2  # nginx writes the line after it answers
        with pytest.raises(CheckpointError, match="past the end"):
            small.pread(8, 4)


def test_a_failed_read_leaves_no_fetch_behind_for_later_readers(upstream, proxy):
    """A read of two separate missing runs that fails on the first must not leave the second registered as
    in flight: the next read of it is served at once, not after a stall."""
    _, data = upstream
    src = _open(proxy, retries=0)
    near, far = 3 * 1024 * 1024, 5 * 1024 * 1024
    src.pread(near + 300_000, 10)  # cached: the read below has two missing runs around it
    proxy.plan("500")
    with pytest.raises(CheckpointError, match="HTTP 500"):
        src.pread(near, far - near + 10)
    assert not len(src.fetcher.flights)
    assert src.pread(far, 10) == data[far:far + 10]


def test_concurrent_readers_under_faults_get_the_right_bytes_or_an_error(upstream, proxy):
    """Eight threads reading overlapping ranges while resets, short bodies and 503s come and go: every read
    returns exactly the file's bytes or raises CheckpointError; nothing hangs."""
    import threading

    _, data = upstream
    src = _open(proxy, timeout=6.0)
    proxy.plan(*(["reset", "short", "503", "500"] * 6))
    rng = np.random.default_rng(17)
    jobs = [(int(o), int(n)) for o, n in zip(rng.integers(2 << 20, SIZE - (1 << 20), 64),
                                             rng.integers(1, 700_000, 64))]
    wrong, errors = [], []

    def reader(part: list[tuple[int, int]]) -> None:
        for offset, size in part:
            size = min(size, SIZE - offset)
            try:
                got = src.pread(offset, size)
            except CheckpointError as exc:
                errors.append(exc)
                continue
            if got != data[offset:offset + size]:
                wrong.append((offset, size))

    threads = [threading.Thread(target=reader, args=(jobs[i::8],)) for i in range(8)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not wrong
    assert len(errors) < len(jobs)  # retries carry most reads through
    assert time.monotonic() - start < 60
