"""One fetch per chunk in a process, one version check per fetch at most, and warm-ups that keep out of the
readers' memory.

Debian's nginx on loopback serves random bytes; its access log (with each request's Range) is what the origin
saw. What is proved:

- two sources of one URL in a process (the header reader of an open and a warm-up started before it, as
  ``ckptfs prefetch`` runs them) share their fetches: a reader of chunks another source is fetching waits for
  that fetch instead of sending its own request, and gets the same bytes;
- a fetch from a server whose validator is weak waits for one re-check of the file's last bytes at most: a
  check sent after its bytes arrived if one is under way, else its own, sent at once beside the others;
- a warm-up's chunks go to the ``--cache-dir`` store only, not into the process's memory LRU, so warming a
  whole checkpoint does not evict the chunks readers are using; every byte read back from the store is the
  file's.
"""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

pytest.importorskip("urllib3")

from ckptfs.cache.chunks import CHUNK, MEMORY, chunk_key  # noqa: E402
from ckptfs.sources import Opener  # noqa: E402
from ckptfs.sources.remote.transport import RemoteOptions, RemoteSource  # noqa: E402
from ckptfs.sources.remote.warmup import warm  # noqa: E402
from servers import Nginx, require_nginx  # noqa: E402

MiB = 1 << 20
TAIL = 4096  # nginx's ETag is weak: opens and fetches check the file's last 4 KiB
_RANGE = re.compile(r'"GET /(?P<path>\S+) [^"]*" 206 (\d+) .*range="bytes=(\d+)-(\d+)"')


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    require_nginx()
    root = tmp_path_factory.mktemp("www")
    data = os.urandom(12 * MiB)
    for name in ("shared.bin", "warm.bin"):
        (root / name).write_bytes(data)  # each test its own file: its own log lines
    with Nginx(root) as server:
        yield server, data


def _data_ranges(server: Nginx, before: int, name: str, size: int) -> list[tuple[int, int]]:
    """The ranges nginx answered for ``name`` since log line ``before``, less the opens' one-byte probes and
    the weak ETag's tail checks."""
    out = []
    for line in server.access_log()[before:]:
        m = _RANGE.search(line)
        if m and m["path"] == name:
            span = (int(m[3]), int(m[4]) + 1)
            if span != (0, 1) and span != (size - TAIL, size):
                out.append(span)
    return out


def _source(url: str, **options):
    # a RemoteOptions of its own per source: nothing memoized between them (an open and a warm-up each probe)
    return Opener(RemoteOptions(timeout=20, stall_timeout=5, **options)).source(url)


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
    assert _data_ranges(server, before, "shared.bin", len(data)) == []
    assert waiting.is_alive()  # waiting for the fetcher's chunks
    assert fetcher.fetch_claimed(runs) is None
    waiting.join(20)
    assert got["head"] == data[4 * MiB:6 * MiB]
    time.sleep(0.2)  # nginx logs a request once its answer is sent
    assert _data_ranges(server, before, "shared.bin", len(data)) == [(4 * MiB, 6 * MiB)]  # one request, not two


def test_a_warm_up_stores_its_chunks_without_filling_the_memory_cache(origin, tmp_path):
    server, data = origin
    url = f"{server.url}/warm.bin"
    source = _source(url, cache_dir=str(tmp_path / "cache"))
    chunks = -(-len(data) // CHUNK)
    report = warm([source])
    assert report.ok and report.fetched == len(data), report.summary()
    keys = [chunk_key(source.content_id(), i) for i in range(chunks)]
    assert not any(key in MEMORY for key in keys)  # the readers' LRU holds none of the warm-up's chunks
    assert source.unstored_chunks() == []  # every one is in the store
    assert source.pread(0, len(data)) == data  # and each reads back as the file's bytes, from the store


class _GatedSource(RemoteSource):
    """A remote source whose requests (here only version checks) each wait for the test to let them through."""

    scheme = "gated"

    def __init__(self, tail: bytes):
        super().__init__("gated://file", RemoteOptions(timeout=20, stall_timeout=5))
        self.tail = tail
        self.gates: list[threading.Event] = []
        self.lock = threading.Lock()
        self._set_identity(len(tail) * 4, "W/weak", "gated://file", sample=tail)

    def _attempt(self, start: int, end: int, deadline: float) -> bytes:
        gate = threading.Event()
        with self.lock:
            self.gates.append(gate)
        assert gate.wait(20)
        return self.tail


def test_a_fetch_waits_for_one_version_check_at_most():
    source = _GatedSource(os.urandom(TAIL))
    deadline = time.monotonic() + 20
    done: list[str] = []

    def confirm(name: str, fetched_at: float) -> None:
        source._confirm_version(fetched_at, deadline, 0)
        done.append(name)

    first = threading.Thread(target=confirm, args=("first", time.monotonic()))
    first.start()
    assert _until(lambda: len(source.gates) == 1)  # its check is on its way
    # bytes that arrived after that check was sent: it proves nothing for them, so their own check goes out
    # now, beside the first (not after it, behind a lock: two round trips)
    second = threading.Thread(target=confirm, args=("second", time.monotonic()))
    second.start()
    assert _until(lambda: len(source.gates) == 2)
    # bytes that arrived before the second check was sent: they wait for it, no third request
    third = threading.Thread(target=confirm, args=("third", source._checks[-1].sent - 1e-6))
    third.start()
    time.sleep(0.2)
    assert len(source.gates) == 2 and done == []
    source.gates[1].set()  # the second check passes: the second and the third fetch are proved
    second.join(10), third.join(10)
    assert sorted(done) == ["second", "third"] and first.is_alive()
    source.gates[0].set()
    first.join(10)
    assert sorted(done) == ["first", "second", "third"] and len(source.gates) == 2


def _until(predicate, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False
