"""The capped origin of ``python -m benchmarks remote --capped`` (``benchmarks/remote_cold_start.py``) really caps:
nginx's ``limit_rate`` bounds one request's throughput, nginx's echo module delays each first byte with Range
answers and the cap unchanged, ``loopback/faultproxy.py`` (the older method) delays each first byte and
paces a body to its ``rate``, every byte relayed unchanged; a missing echo module stops the benchmark in one
line; the requests-in-flight figures are computed right
from the server's own spans; and a missing downloader is a note, not a crash.

The only timings asserted are lower bounds on the fixture's own caps, with a wide margin (a loaded machine
makes a request slower, never faster): nothing about ckptfs's speed.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

import pytest

from benchmarks import remote_cold_start
from loopback.faultproxy import FaultProxy
from loopback import servers
from loopback.servers import MissingTool, Nginx
from conftest import require_nginx, skip_or_fail

MiB = 1 << 20


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[Path, bytes]:
    require_nginx()
    root = tmp_path_factory.mktemp("capped")
    data = bytes(range(256)) * (6 * MiB // 256)
    (root / "blob.bin").write_bytes(data)
    return root, data


def get(url: str, first: int | str, last: int | str = "",
        headers: dict | None = None) -> tuple[bytes, float, float]:
    """(body, seconds to the first body byte, seconds in all) of one ranged GET (``first`` "" and ``last`` N: the
    last N bytes); the answer's headers go into ``headers`` if given."""
    start = time.perf_counter()
    req = urllib.request.Request(url, headers={"Range": f"bytes={first}-{last}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 206
        if headers is not None:
            headers.update(resp.headers)
        head = resp.read(1)
        ttfb = time.perf_counter() - start
        body = head + resp.read()
    return body, ttfb, time.perf_counter() - start


def test_limit_rate_caps_one_request(served):
    # nginx sends an answer in pieces of sendfile_max_chunk (2 MiB), the first at once, each next one when
    # the rate allows: 6 MiB at 2 MiB/s take about 2 s
    root, data = served
    with Nginx(root, limit_rate="2m") as server:
        body, _, seconds = get(f"{server.url}/blob.bin", 0, 6 * MiB - 1)
        spans = server.request_spans(expect=1)  # its line is written after the answer's last byte went out
    assert body == data[:6 * MiB]
    assert seconds >= 1.5, f"6 MiB at limit_rate 2m took {seconds:.2f} s (about 2 s expected)"
    (start, end, nbytes), = spans
    assert nbytes == 6 * MiB and end - start >= 1.5  # the server's own clock agrees


def test_a_log_line_written_after_the_answer_is_waited_for(served):
    # a buffered access log (flush=1s) is written a second after the answer, every time: what an unbuffered
    # one does now and then, on a loaded machine, in the moment between the answer's last byte and its line
    root, data = served
    with Nginx(root, log_flush="1s") as server:
        body, _, _ = get(f"{server.url}/blob.bin", 0, MiB - 1)
        spans = server.request_spans(expect=1)
    assert body == data[:MiB]
    (_, _, nbytes), = spans
    assert nbytes == MiB


def test_wait_idle_returns_once_a_request_in_progress_is_logged(served):
    import threading

    root, data = served
    with Nginx(root, limit_rate="2m") as server:
        answering = threading.Event()
        got: dict = {}

        def read_all() -> None:  # 6 MiB at 2 MiB/s: about 2 s in progress at nginx
            req = urllib.request.Request(f"{server.url}/blob.bin", headers={"Range": f"bytes=0-{6 * MiB - 1}"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                got["body"] = resp.read(1)
                answering.set()
                got["body"] += resp.read()

        reader = threading.Thread(target=read_all)
        reader.start()
        try:
            assert answering.wait(30)  # the request is in progress (or, on a stalled machine, over by now)
            server.wait_idle()
            assert len(server.access_log()) == 1  # its line is there as soon as nginx is idle
        finally:
            reader.join(60)
    assert got["body"] == data[:6 * MiB]


def test_uncapped_nginx_has_no_limit_rate(served):
    root, data = served
    with Nginx(root) as server:
        assert "limit_rate" not in server._config()
        body, _, _ = get(f"{server.url}/blob.bin", 0, MiB - 1)
    assert body == data[:MiB]


def require_echo_module() -> None:
    require_nginx()
    if reason := servers.echo_module_missing():
        skip_or_fail(reason)


def test_nginx_delays_each_request_on_its_own_timer_with_range_and_limit_rate_intact(served):
    # the capped benchmark's latency with no process in between: echo_sleep, then echo_exec to the file
    require_echo_module()
    root, data = served
    size = len(data)
    with Nginx(root, limit_rate="2m", first_byte_delay=0.3) as server:
        assert server._config().startswith(f"load_module {servers.ECHO_MODULE};")
        url = f"{server.url}/blob.bin"
        headers: dict = {}
        body, ttfb, _ = get(url, 100, 4195, headers)
        assert body == data[100:4196] and ttfb >= 0.25
        assert headers["Content-Range"] == f"bytes 100-4195/{size}" and headers["Content-Length"] == "4096"
        assert headers["ETag"] and headers["Last-Modified"]
        headers.clear()
        body, _, _ = get(url, "", 4096, headers)  # a suffix range: the open's tail sample
        assert body == data[-4096:] and headers["Content-Range"] == f"bytes {size - 4096}-{size - 1}/{size}"
        # 6 MiB at 2 MiB/s: about 2 s after the 0.3 s wait (the first 2 MiB piece goes at once)
        body, _, seconds = get(url, 0, 6 * MiB - 1)
        assert body == data[:6 * MiB] and seconds >= 1.5, f"6 MiB at limit_rate 2m took {seconds:.2f} s"
        spans = server.request_spans(expect=3)
    assert [n for _, _, n in spans] == [4096, 4096, 6 * MiB]
    assert all(end - start >= 0.25 for start, end, _ in spans)  # the wait is part of each request's span


def test_a_missing_echo_module_is_one_line(served, monkeypatch, capsys, tmp_path):
    from benchmarks.__main__ import main as benchmarks_main

    require_nginx()
    monkeypatch.setattr(servers, "ECHO_MODULE", str(tmp_path / "ngx_http_echo_module.so"))
    delayed = Nginx(served[0], first_byte_delay=0.03)
    try:
        with pytest.raises(MissingTool, match="apt-get install libnginx-mod-http-echo"):
            delayed.start()
    finally:
        delayed.stop()  # its folder
    with Nginx(served[0]) as server:  # without a delay the module is not needed
        assert "load_module" not in server._config()
    # the benchmark stops before it makes its fixture (nothing written into --dir but the folder)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the runner names the workload in it
    assert benchmarks_main(["remote", "--capped", "--dir", str(tmp_path / "bench"), "--rounds", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "libnginx-mod-http-echo" in err and "Traceback" not in err
    assert list((tmp_path / "bench").iterdir()) == []


def test_proxy_delays_first_byte_and_paces_the_body(served):
    root, data = served
    with Nginx(root) as server:
        with FaultProxy(server.url, first_byte_delay=0.3) as proxy:
            body, ttfb, _ = get(f"{proxy.url}/blob.bin", 100, 4195)
            assert body == data[100:4196] and ttfb >= 0.25
        with FaultProxy(server.url, rate=2 * MiB) as proxy:
            body, _, seconds = get(f"{proxy.url}/blob.bin", MiB, 4 * MiB - 1)
            assert body == data[MiB:4 * MiB] and seconds >= 1.2
            deadline = time.monotonic() + 5  # the span is recorded once the last write returned
            while not proxy.spans and time.monotonic() < deadline:
                time.sleep(0.05)
            (start, end, nbytes), = proxy.spans
            assert nbytes == 3 * MiB and end - start >= 1.2


def test_proxy_in_its_own_process(served, tmp_path):
    root, data = served
    spans = tmp_path / "spans"
    with Nginx(root) as server, remote_cold_start.DelayProxy(server.url, 0.05, spans=spans) as proxy:
        assert proxy.url != server.url and proxy.proc is not None
        body, _, _ = get(f"{proxy.url}/blob.bin", 0, MiB - 1)
        assert body == data[:MiB]
        deadline = time.monotonic() + 5
        while not proxy.spans() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [s[2] for s in proxy.spans()] == [MiB]
    assert proxy.proc is None
    with remote_cold_start.DelayProxy("http://127.0.0.1:9", 0.0) as direct:  # no delay, no rate: no proxy
        assert direct.url == "http://127.0.0.1:9" and direct.proc is None


def test_in_flight_counts():
    spans = [(0.0, 2.0, MiB), (1.0, 3.0, 2 * MiB), (5.0, 6.0, 3 * MiB), (10.0, 11.0, 0)]
    got = remote_cold_start.in_flight(spans, 0.0, 6.0)  # the last one is outside the case
    # in flight: 1 on [0,1], 2 on [1,2], 1 on [2,3], 0 on [3,5], 1 on [5,6]: 5 request-seconds over 6 s
    assert got == {"requests": 3, "small_requests": 0, "fetched_MiB": 6.0, "median_request_MiB": 2.0,
                   "peak_in_flight": 2, "mean_in_flight": 0.8}
    checks = [(0.0, 0.1, 4096), (0.2, 0.3, 4096), (0.4, 0.5, MiB)]  # version checks apart from the data
    got = remote_cold_start.in_flight(checks, 0.0, 1.0)
    assert (got["requests"], got["small_requests"], got["median_request_MiB"]) == (3, 2, 1.0)
    # clipped to [1.5, 5.5]: 2 on [1.5,2], 1 on [2,3], 0 on [3,5], 1 on [5,5.5]: 2.5 request-seconds over 4 s
    got = remote_cold_start.in_flight(spans, 1.5, 5.5)
    assert (got["requests"], got["peak_in_flight"], got["mean_in_flight"]) == (3, 2, 0.6)
    assert remote_cold_start.in_flight([], 0.0, 1.0)["requests"] == 0


def test_missing_downloaders_are_notes(monkeypatch):
    monkeypatch.setitem(sys.modules, "hf_transfer", None)  # import fails as if not installed
    monkeypatch.setattr(remote_cold_start.shutil, "which", lambda name, **kw: None)
    cases, notes = remote_cold_start.downloader_cases((64, 4 * MiB))
    assert cases == []
    assert any(n.startswith("hf_transfer skipped: not installed") for n in notes)
    assert any(n.startswith("aria2c skipped: not installed") for n in notes)


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_the_cases_writing_the_file_take_turns_at_each_place_and_after_each_other(count):
    # what ran just before a case moves its time on this machine (memory just freed is cheap to touch again):
    # over a design's rounds each case runs as often at each place and right after each of the others
    cases = [f"case{k}" for k in range(count)]
    rounds = count if count % 2 == 0 else 2 * count
    orders = [remote_cold_start.balanced_order(cases, i) for i in range(rounds)]
    assert all(sorted(order) == cases for order in orders)
    for place in range(count):
        placed = [order[place] for order in orders]
        assert all(placed.count(c) == rounds // count for c in cases)
    after = [(order[k - 1], order[k]) for order in orders for k in range(1, count)]
    pairs = {(a, b) for a in cases for b in cases if a != b}
    assert set(after) == pairs and all(after.count(p) == len(after) // len(pairs) for p in pairs)
    assert remote_cold_start.balanced_order(cases, rounds) == orders[0]  # and again from the start
    assert remote_cold_start.balanced_order([], 3) == [] and remote_cold_start.balanced_order(["a"], 1) == ["a"]
