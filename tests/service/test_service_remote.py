"""The source families of ``--metrics`` on a real remote mount: requests by outcome, bytes, failovers, and
each origin's outages and full deadlines met.

A local primary cut in half, with a ``--mirror`` served by Debian's nginx through the loopback fault proxy
(which answers the first request to the mirror with 503, so one attempt is retried). Reads past the cut
fail over to the mirror. The counters are checked against what the servers saw: nginx's access log (every
request it answered and the body bytes it sent) and the proxy's 503. Then an origin (nginx behind the proxy)
that answers every request with a 500: one O_DIRECT read meets one outage and one full ``--timeout``, which
the per-origin families export under the origin's label, as the stats show them.
"""

from __future__ import annotations

import errno
import mmap
import os
import re

import numpy as np
import pytest

pytest.importorskip("urllib3")
parser = pytest.importorskip("prometheus_client.parser")

from conftest import mount_stats, require_nginx  # noqa: E402
from loopback.faultproxy import FaultProxy  # noqa: E402
from fixtures import quantized, write_gguf  # noqa: E402
from loopback.servers import Nginx  # noqa: E402
from metrics_samples import scrape, value  # noqa: E402

ACCESS = re.compile(r'"(GET|HEAD) (\S+) HTTP/[\d.]+" (\d{3}) (\d+)')


def test_source_families_match_what_the_servers_saw(mounted, tmp_path):
    if not os.path.exists("/usr/sbin/nginx"):
        pytest.skip("nginx is not installed")
    root = tmp_path / "www"
    root.mkdir()
    rng = np.random.default_rng(12)
    written = write_gguf(root / "model.gguf", {"w.q8": (quantized("Q8_0", (512, 2048), rng), "Q8_0"),
                                               "w.f32": (rng.standard_normal((300, 700)).astype(np.float32), "F32")})
    full = (root / "model.gguf").read_bytes()
    part = tmp_path / "part.gguf"
    part.write_bytes(full[: len(full) // 2])
    with Nginx(root) as server, FaultProxy(server.url) as proxy:
        proxy.plan("503")  # the first request to the mirror: answered 503 by the proxy, retried
        mnt = mounted(str(part), "--mirror", proxy.url + "/model.gguf", "--metrics", "127.0.0.1:0",
                      "--timeout", "20", "--stall-timeout", "5")
        before = scrape(mnt)
        for name in ("w.q8", "w.f32"):  # (values through a mirror: tests/sources/test_remote_mirror.py)
            assert np.load(mnt / f"{name}.npy").shape == written.tensors[name].shape
        after = scrape(mnt)
        stats = mount_stats(mnt)
        log = [ACCESS.search(line) for line in server.access_log()]
    served = [m for m in log if m and m.group(2) == "/model.gguf"]
    assert proxy.faults_used == ["503"]
    ok = after.get(("ckptfs_source_requests_total", (("outcome", "ok"), ("scheme", "http"))), 0)
    retry = after.get(("ckptfs_source_requests_total", (("outcome", "retry"), ("scheme", "http"))), 0)
    got = after.get(("ckptfs_source_bytes_total", (("scheme", "http"),)), 0)
    # every answer nginx gave was an answer used; the one 503 (the proxy's own) was retried
    assert ok == len(served) > 0 and all(m.group(3) in ("200", "206") for m in served)
    assert retry == 1  # (counted by the mounting process before the fork, and so by the daemon)
    assert got == sum(int(m.group(4)) for m in served if m.group(1) == "GET")
    failovers = after[("ckptfs_mirror_failovers_total", ())]
    assert failovers > before[("ckptfs_mirror_failovers_total", ())]
    source = stats["source"]
    assert (source["requests"], source["bytes"], source["retries"], source["failovers"]) == \
        (ok + retry, got, retry, failovers)


MiB = 1 << 20


def _direct_read_errno(path, offset: int, size: int) -> int | None:
    """One O_DIRECT read of ``size`` bytes at ``offset`` into an aligned buffer: None, or its errno."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, size)
    try:
        os.preadv(fd, [buf], offset)
        return None
    except OSError as exc:
        return exc.errno
    finally:
        os.close(fd)
        buf.close()


def test_origin_families_count_what_an_origin_answering_500s_cost(mounted, tmp_path):
    """A remote mount exports each origin's ``outages`` and ``deadlines_met`` under ``origin``: at 0 while it
    serves, 1 and 1 once one read met an origin answering every request with a 500 (the outage rule: one full
    --timeout for the read, however many kernel requests it was), equal to the stats."""
    require_nginx()
    root = tmp_path / "www"
    root.mkdir()
    rng = np.random.default_rng(13)
    write_gguf(root / "m.gguf", {"big": (rng.standard_normal((1536, 4096)).astype(np.float32), "F32")})  # 24 MiB
    outages, deadlines = "ckptfs_source_outages_total", "ckptfs_source_deadlines_met_total"
    with Nginx(root) as server, FaultProxy(server.url) as proxy:
        mnt = mounted(proxy.url + "/m.gguf", "--metrics", "127.0.0.1:0", "--timeout", "2")
        before = scrape(mnt)
        for name in (outages, deadlines):  # the origin asked at open: its series, at 0
            assert before[(name, (("origin", proxy.url),))] == 0, name
        proxy.always("500")
        failed = _direct_read_errno(mnt / "m.gguf", 16 * MiB, 4 * MiB)  # never read before: not cached
        proxy.always(None)
        after = scrape(mnt)
        figures = mount_stats(mnt)["source"]["origins"][proxy.url]
    assert failed == errno.EIO
    assert value(after, outages, origin=proxy.url) == figures["outages"] == 1
    assert value(after, deadlines, origin=proxy.url) == figures["deadlines_met"] == 1
    assert {labels for (name, labels) in after if name in (outages, deadlines)} == {(("origin", proxy.url),)}
