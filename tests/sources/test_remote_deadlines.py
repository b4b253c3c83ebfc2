"""The outage rule against an origin that keeps answering badly, not only one that falls silent.

Debian's nginx on loopback behind the project's fault proxy (``loopback/faultproxy.py``), read through a real FUSE
mount with ``--timeout 2`` the way llama.cpp loads a model: one 64 MiB O_DIRECT read of the mount's own file
(64 kernel requests of 1 MiB on libfuse's threads). Against each misbehaviour — a body trickling one byte a
second, headers and then nothing, every answer a 500, every body cut short — the read ends in EIO having met one
full ``--timeout`` (``outages`` and ``deadlines_met`` under ``source.origins`` in the mount's stats; a deadline
per kernel request took 30-35 s at ``--timeout 5``), the daemon logs one EIO line for it, and once the origin
answers again the first read is exact. Also: the origin frozen (SIGSTOP) and resumed, the first read a second
later is exact (a probe's answer lets the requests that waited for it go on).
"""

from __future__ import annotations

import errno
import mmap
import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("urllib3")

from ckptfs.sources.remote.outage import PROBE_INTERVAL_S, PROBE_SECONDS
from conftest import mount_stats, nginx_origin, pid_alive
from loopback.faultproxy import FaultProxy
from fixtures import write_gguf

MiB = 1 << 20
TIMEOUT = 2
READ = 64 * MiB
#: No hang: one --timeout and a probe's second as the rule promises, three more deadlines of slack for a loaded
#: machine (a deadline per kernel request took 16 or more).
BOUND = 4 * TIMEOUT + PROBE_SECONDS + 4
FAULTS = ["trickle:30", "headers:30", "500", "short"]


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    """A GGUF of 72 MiB (one F32 tensor) behind nginx."""
    def fill(root):
        rng = np.random.default_rng(7)
        write_gguf(root / "m.gguf", {"big": (rng.standard_normal((4608, 4096)).astype(np.float32), "F32")})

    with nginx_origin(tmp_path_factory, fill, "deadlines-www") as (server, root, _):
        yield server, root


def _direct_read(path) -> tuple[bytes | None, int | None, float]:
    """One ``READ``-byte O_DIRECT read from the start into an aligned buffer: (bytes, None) or (None, errno), and
    the seconds it took."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, READ)
    start = time.monotonic()
    try:
        got = os.preadv(fd, [buf], 0)
        return bytes(buf[:got]), None, time.monotonic() - start
    except OSError as exc:
        return None, exc.errno, time.monotonic() - start
    finally:
        os.close(fd)
        buf.close()


def _origin_stats(mnt, url: str) -> dict:
    origins = mount_stats(mnt)["source"]["origins"]
    return origins[url]


def _eio_lines(log) -> list[str]:
    return [line for line in log.read_text().splitlines() if "EIO:" in line]


@pytest.mark.parametrize("fault", FAULTS)
def test_an_origin_answering_badly_costs_one_deadline_and_the_first_read_after_it_is_exact(origin, mounted, fault,
                                                                                            tmp_path):
    server, root = origin
    want = (root / "m.gguf").read_bytes()[:READ]
    log = tmp_path / "daemon.log"
    with FaultProxy(server.url) as proxy:
        mnt = mounted(proxy.url + "/m.gguf", "--timeout", str(TIMEOUT), "--log-file", str(log))
        proxy.always(fault)
        got, error, took = _direct_read(mnt / "m.gguf")
        proxy.always(None)
        assert (got is None, error) == (True, errno.EIO), (fault, error)
        assert took < BOUND, (fault, took)
        stats = _origin_stats(mnt, proxy.url)
        assert stats["outages"] == 1 and stats["deadlines_met"] == 1, (fault, stats)
        lines = _eio_lines(log)
        assert len(lines) == 1 and "not answering" in lines[0], lines
        # a probe sent before the origin recovered (by read-ahead) may still fail; past its second and the
        # interval after it, the next request probes, and the requests beside it wait for its answer
        time.sleep(PROBE_SECONDS + PROBE_INTERVAL_S + 0.5)
        got, error, _ = _direct_read(mnt / "m.gguf")
        assert error is None and got == want, (fault, error)
        stats = mount_stats(mnt)
        assert stats["short_replies"] == 0 and pid_alive(stats["pid"])


def test_the_first_read_after_a_frozen_origin_resumes_is_exact(origin, mounted, tmp_path):
    """nginx frozen (SIGSTOP) under a 64 MiB O_DIRECT read: EIO within the bound; a second after it resumes, one
    read of the same range is exact (the probe's answer lets the requests that waited for it go on)."""
    server, root = origin
    want = (root / "m.gguf").read_bytes()[:READ]
    mnt = mounted(server.url + "/m.gguf", "--timeout", str(TIMEOUT))
    os.kill(server.pid, signal.SIGSTOP)
    try:
        got, error, took = _direct_read(mnt / "m.gguf")
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert (got is None, error) == (True, errno.EIO)
    assert took < BOUND, took
    time.sleep(PROBE_INTERVAL_S + 0.5)  # a probe that failed during the freeze: its second is over
    got, error, _ = _direct_read(mnt / "m.gguf")
    assert error is None and got == want, error
