"""Cold remote streams over many parallel ranges: the origin's in-flight limit is learnt (grown while
throughput grows, halved on a throttle), and faults on some of 32+ connections in flight cost speed, never a
wrong byte or a hang.

The limit's arithmetic is checked with a clock of the test's own; the rest runs against Debian's nginx on
loopback with a per-request rate cap (``limit_rate``, as a CDN has) behind ``faultproxy.FaultProxy``, which
counts how many requests it serves at once (what the origin sees) and injects resets, 5xx, 429 storms,
stalls and short bodies into a share of them.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

pytest.importorskip("urllib3")

from ckptfs.ahead.limits import REPROBE_EPOCHS, OriginLimit
from ckptfs.sources import Opener
from ckptfs.core.options import OpenOptions
from ckptfs.sources.remote.options import RemoteOptions
from loopback.faultproxy import FaultProxy
from loopback.servers import Nginx, same_bytes
from conftest import nginx_origin, require_nginx

MiB = 1 << 20
SIZE = 160 * MiB
RATE = "6m"        # per request: a 2 MiB piece takes a third of a second, so speed comes only from parallelism
HANG_BOUND = 120.0  # a stream that would take 27 s at 4 in flight; only a hang (or a lost fetch) passes this
#: The faults' stream is this many SIZEs long: the window (FETCH_BUDGET, 32 pieces at the pinned limit) ramps up
#: over the first of them and is then topped up as each piece lands, 32 in flight; a stream of one SIZE (40
#: pieces) ended right after the ramp, where what the origin saw at once depended on when the faults fell
#: (23 to 33 seen).
LONG = 2


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _epoch(limit: OriginLimit, clock: Clock, rate: float, saturated: bool = True, per_byte_slowdown: float = 1.0):
    """One epoch in which the origin moved ``rate`` bytes/s over ``limit.limit`` requests."""
    if saturated:  # readers wanted more than the limit: take every slot, then one more
        taken = 0
        while limit.try_start():
            taken += 1
        for _ in range(taken):
            limit.done()
    n = limit.limit
    seconds = 0.2
    each = int(rate * seconds / n)
    clock.now += seconds
    for _ in range(n):
        limit.finished(each, per_byte_slowdown * each / (rate / n))


def test_the_limit_grows_while_throughput_grows_and_steps_back_when_it_stops():
    clock = Clock()
    limit = OriginLimit(initial=8, ceiling=64, clock=clock)
    per_request = 20e6
    seen = [limit.limit]
    for _ in range(6):  # a capped origin: throughput is in-flight x 20 MB/s up to a 400 MB/s link
        _epoch(limit, clock, min(400e6, limit.limit * per_request))
        seen.append(limit.limit)
    assert seen[:3] == [8, 16, 32]           # doubling while each step paid
    assert seen[3:] == [64, 32, 32, 32]  # 64 moved no more than 32 did: back to 32, and held there
    for _ in range(REPROBE_EPOCHS - 2):  # two of the held epochs are behind us
        _epoch(limit, clock, 400e6)
        assert limit.limit == 32
    _epoch(limit, clock, 400e6)
    assert limit.limit == 64  # a plateau is probed again after a while


def test_an_epoch_the_readers_did_not_fill_changes_nothing():
    clock = Clock()
    limit = OriginLimit(initial=8, clock=clock)
    for _ in range(5):
        _epoch(limit, clock, 50e6, saturated=False)
    assert limit.limit == 8


def test_a_throttle_halves_the_limit_and_holds_it():
    clock = Clock()
    limit = OriginLimit(initial=32, clock=clock)
    limit.throttled()
    assert limit.limit == 16 and limit.stats()["throttles"] == 1
    limit.throttled()
    limit.throttled()
    assert limit.limit == 4
    for rate in (10e6, 20e6, 40e6):  # better and better, but the origin asked for fewer: held for a while
        _epoch(limit, clock, rate)
    assert limit.limit == 4
    for _ in range(REPROBE_EPOCHS - 3):  # the rest of the hold
        _epoch(limit, clock, limit.limit * 20e6)
        assert limit.limit == 4
    for _ in range(2):  # then growth is tried again, and kept where it pays
        _epoch(limit, clock, limit.limit * 20e6)
    assert limit.limit == 16


def test_slower_requests_without_more_throughput_step_down():
    clock = Clock()
    limit = OriginLimit(initial=16, clock=clock)
    _epoch(limit, clock, 100e6)
    assert limit.limit == 32
    _epoch(limit, clock, 90e6, per_byte_slowdown=5.0)  # 32 in flight: each much slower, less in all
    assert limit.limit == 16


def test_a_pinned_limit_is_what_the_environment_says(monkeypatch):
    from ckptfs.ahead.limits import Origins

    monkeypatch.setenv("CKPTFS_REMOTE_IN_FLIGHT", "12")
    limit = Origins().limit("http://pinned.test:1")
    limit.throttled()
    assert limit.stats()["limit"] == 12


def test_the_limit_stays_within_its_bounds():
    clock = Clock()
    limit = OriginLimit(initial=1000, floor=2, ceiling=48, clock=clock)
    assert limit.limit == 48
    for _ in range(10):
        limit.throttled()
    assert limit.limit == 2
    assert limit.try_start() and limit.try_start() and not limit.try_start()


# -- against a capped origin -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    names = ("stream.bin", "faults.bin", "storm.bin", "storm-next.bin", "direct.bin", "advised.bin")
    with nginx_origin(tmp_path_factory, lambda root: same_bytes(root, names, SIZE), limit_rate=RATE) \
            as (server, root, data):  # one file a test: each learns its limit and fetches afresh
        (root / "faults-long.bin").write_bytes(data * LONG)
        yield server, data


def _source(url: str, timeout: float = 30.0, stall: float = 3.0):
    return Opener(RemoteOptions(OpenOptions.build(timeout=timeout, stall_timeout=stall))).source(url)


def _stream(source, data: bytes, step: int = 1 * MiB) -> None:
    """Read the whole source in order, as ``cat`` through a mount does, checking every byte."""
    for offset in range(0, source.size, step):
        got = source.pread(offset, min(step, source.size - offset))
        assert got == data[offset:offset + len(got)], f"wrong bytes at {offset}"


def test_a_cold_stream_keeps_many_ranges_in_flight(origin):
    server, data = origin
    with FaultProxy(server.url) as proxy:
        source = _source(proxy.url + "/stream.bin")
        started = time.monotonic()
        _stream(source, data)
        assert time.monotonic() - started < HANG_BOUND
        assert proxy.peak_in_flight >= 16, proxy.peak_in_flight  # the old read-ahead kept 4
        assert source.origin_limit().stats()["peak"] >= 16


@pytest.mark.parametrize("fault", ["reset", "500", "short", "stall:5"])
def test_faults_on_some_of_32_connections_cost_speed_not_bytes(origin, fault, monkeypatch):
    server, data = origin
    monkeypatch.setenv("CKPTFS_REMOTE_IN_FLIGHT", "32")  # 32 requests in flight, not what this machine learns
    with FaultProxy(server.url) as proxy:
        proxy.every(7, fault)  # one request in seven, among the 32 in flight
        source = _source(proxy.url + "/faults-long.bin")
        assert source.origin_limit().stats()["limit"] == 32
        started = time.monotonic()
        _stream(source, data * LONG)
        assert time.monotonic() - started < HANG_BOUND
        assert fault in proxy.faults_used
        assert source.origin_limit().stats()["peak"] == 32  # the client had the pinned 32 under way at once
        if fault.startswith("stall"):
            # A stalled piece holds the reader for the whole stall timeout, in which every other piece of the
            # window lands: the window then moves on in bursts as the reader passes the stalled pieces, so the
            # origin sees bursts of the 32 (23 to 35 seen), not a steady 32.
            assert proxy.peak_in_flight >= 16, proxy.peak_in_flight
        else:
            assert proxy.peak_in_flight >= 24, proxy.peak_in_flight  # the pinned 32, give or take a retry's pause


def test_an_origin_that_says_503_now_and_then_gets_fewer_requests_and_every_byte(origin):
    server, data = origin
    with FaultProxy(server.url) as proxy:
        proxy.every(7, "503")
        source = _source(proxy.url + "/faults.bin")
        started = time.monotonic()
        _stream(source, data)
        assert time.monotonic() - started < HANG_BOUND
        stats = source.origin_limit().stats()
        assert stats["throttles"] > 0 and stats["limit"] < stats["peak"]


def test_a_429_storm_halves_the_limit_and_every_byte_still_arrives(origin):
    server, data = origin
    with FaultProxy(server.url) as proxy:
        source = _source(proxy.url + "/storm.bin")
        half = SIZE // 2
        _stream_range = [(o, min(MiB, half - o)) for o in range(0, half, MiB)]
        for offset, size in _stream_range[:40]:
            assert source.pread(offset, size) == data[offset:offset + size]
        # (read-ahead may have the rest of this file in by now: a stream of another file on the same origin
        # starts in the storm, so some request surely meets it)
        following = _source(proxy.url + "/storm-next.bin")
        before = source.origin_limit().stats()
        proxy.always("429:0")  # every request refused for a while, as a throttling origin does
        timer = threading.Timer(1.5, proxy.always, args=(None,))
        timer.start()
        try:
            started = time.monotonic()
            _stream(following, data)
            _stream(source, data)
            assert time.monotonic() - started < HANG_BOUND
        finally:
            timer.cancel()
            proxy.always(None)
        after = source.origin_limit().stats()
        assert after["throttles"] > before["throttles"]
        assert "429:0" in proxy.faults_used


def test_one_large_read_is_many_parallel_requests(origin):
    """A loader's 64 MiB direct-I/O read that nobody fetched ahead: pieces in parallel, not one after another."""
    server, data = origin
    with FaultProxy(server.url) as proxy:
        source = _source(proxy.url + "/direct.bin")
        offset = 64 * MiB
        assert source.pread(offset, 64 * MiB) == data[offset:offset + 64 * MiB]
        assert proxy.peak_in_flight >= 8, proxy.peak_in_flight


def test_the_rest_of_a_tensor_advised_as_a_unit_is_fetched_in_parallel(origin):
    """What the mount's read-ahead advises when it finds a stream (the rest of the tensor's stored bytes)
    continues the source's run: all of it is fetched ahead, many pieces at once, with no further read."""
    server, data = origin
    with FaultProxy(server.url) as proxy:
        source = _source(proxy.url + "/advised.bin")
        for offset in (0, MiB):
            assert source.pread(offset, MiB) == data[offset:offset + MiB]
        source.advise(2 * MiB, 96 * MiB)
        deadline = time.monotonic() + HANG_BOUND
        while time.monotonic() < deadline and _fetched_until(server, "advised.bin") < 98 * MiB:
            time.sleep(0.1)
        assert _fetched_until(server, "advised.bin") >= 98 * MiB
        assert proxy.peak_in_flight >= 16, proxy.peak_in_flight
        assert source.pread(97 * MiB, MiB) == data[97 * MiB:98 * MiB]


def _fetched_until(server: Nginx, name: str) -> int:
    """How far from the start the ranges nginx served of ``name`` reach without a gap."""
    reach = 0
    for begin, end in sorted(server.ranges(name)):
        if begin > reach:
            break
        reach = max(reach, end)
    return reach


# -- a mount daemon, many connections, some of them failing --------------------------------------------------

@pytest.fixture(scope="module")
def gguf_origin(tmp_path_factory):
    """A GGUF of a few large Q8_0 tensors behind the capped nginx."""
    import numpy as np

    from fixtures import quantized, write_gguf

    require_nginx()
    root = tmp_path_factory.mktemp("gguf-www")
    rng = np.random.default_rng(11)
    tensors = {f"blk.{i}.w": (quantized("Q8_0", (1024, 8192), rng), "Q8_0") for i in range(6)}  # 8.5 MiB each
    write_gguf(root / "m.gguf", tensors)
    with Nginx(root, limit_rate=RATE) as server:
        yield server, root / "m.gguf"


def test_a_mount_under_faults_on_many_connections_serves_every_byte(gguf_origin, mounted):
    import gguf

    from conftest import mount_stats
    from ckptfs.util.procinfo import peak_rss

    server, path = gguf_origin
    reference = gguf.GGUFReader(str(path))
    with FaultProxy(server.url) as proxy:
        mnt = mounted(proxy.url + "/m.gguf", "--timeout", "30", "--stall-timeout", "3", "--cache-size", "64M")
        proxy.every(5, "reset")
        started = time.monotonic()
        for tensor in reference.tensors:  # every .raw in file order, as a loader streams them
            with open(mnt / f"{tensor.name}.raw", "rb") as fh:
                assert fh.read() == bytes(tensor.data.tobytes()), tensor.name
        assert "reset" in proxy.faults_used
        proxy.every(5, "503")
        mnt = mounted(proxy.url + "/m.gguf", "--timeout", "30", "--stall-timeout", "3", "--cache-size", "64M")
        own = mnt / "m.gguf"  # a fresh daemon: nothing of the file fetched but its header
        fd = os.open(own, os.O_RDONLY | os.O_DIRECT)  # the loader pattern: 64 MiB direct-I/O reads
        try:
            import mmap

            buf = mmap.mmap(-1, 64 * MiB)
            got = bytearray()
            while True:
                n = os.readv(fd, [buf])
                if n <= 0:
                    break
                got += buf[:n]
        finally:
            os.close(fd)
        assert bytes(got) == path.read_bytes()
        assert time.monotonic() - started < HANG_BOUND
        stats = mount_stats(mnt)
        assert proxy.peak_in_flight >= 8 and "503" in proxy.faults_used
        peak = peak_rss(stats["pid"])  # cache 64 MiB + chunk LRU 256 MiB + 128 MiB ahead, and Python's own
        assert peak is not None and peak < (64 + 256 + 128 + 200) * MiB, peak
