"""The state remote sources share lives in the runtime they are handed (``ckptfs.core.runtime``), from a real
nginx on loopback:

- a source opened with a runtime of its own counts its requests, keeps its connections and chunks, learns its
  origin's limit and hands work to worker pools there, not in the process's default runtime;
- a child forked while a parent's threads hold the runtime's locks reads on: its own connections (a new
  pool), the parent's counters and fetched chunks kept (a chunk the parent fetched is served from memory,
  asked of nginx by nobody), each under a fresh lock;
- a runtime of the caller's own is renewed in a forked child as the default one is, and each object it
  keeps for the child (``LIVE``) is reset there, past one whose reset fails;
- a part's ``in_child`` that fails costs that part only: the child builds it afresh;
- a child forked while the parent's read-ahead fetches are under way reads the chunks they were fetching
  (the parent's fetches are failed over to the child's readers, not waited for).
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

pytest.importorskip("urllib3")

from conftest import require_nginx, wait_until
from forking import WAIT_S, in_child
from loopback.servers import Nginx, requests_since

from ckptfs.ahead.limits import ORIGINS
from ckptfs.sources.remote.store.chunks import CHUNK, MEMORY_CHUNKS
from ckptfs.core.options import OpenOptions
from ckptfs.core.runtime import LIVE, Part, Runtime, runtime
from ckptfs.sources import Opener
from ckptfs.sources.netstats import SOURCE_COUNTERS
from ckptfs.sources.remote import curl
from ckptfs.sources.remote.http import HTTP_POOL
from ckptfs.sources.remote.options import RemoteOptions
from ckptfs.workers.scheduler import WORKERS


def _blob_served(tmp_path_factory, seed: int, limit_rate: str | None = None):
    """(nginx serving ``/blob.bin``, its 64 chunks of random bytes)."""
    require_nginx()
    root = tmp_path_factory.mktemp(f"www{seed}")
    data = np.random.default_rng(seed).integers(0, 256, 64 * CHUNK, dtype=np.uint8).tobytes()
    (root / "blob.bin").write_bytes(data)
    with Nginx(root, limit_rate=limit_rate) as server:
        yield server, data


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    yield from _blob_served(tmp_path_factory, 50)


def _ports(pool) -> set[int]:
    """The ports a urllib3 pool manager holds connection pools for."""
    return {key.key_port for key in pool.pools.keys()}


@pytest.mark.parametrize("client", ["libcurl", "urllib3"])
def test_a_source_counts_and_connects_in_the_runtime_it_is_handed(site, client, monkeypatch):
    """Counters, caches, limits and workers are the handed runtime's; so are urllib3's connections where it
    carries the requests (``CKPTFS_CURL=0``). libcurl keeps its connections per thread, beside any runtime:
    through it, no urllib3 pool is touched at all (the open's GET included)."""
    if client == "urllib3":
        monkeypatch.setenv("CKPTFS_CURL", "0")
    elif not curl.enabled("http://127.0.0.1/"):
        pytest.skip("the libcurl extension is not built here")
    server, data = site
    port = server.port
    mine = Runtime()
    logged = len(server.access_log())
    source = Opener(RemoteOptions(OpenOptions(), read_ahead=False, runtime=mine)).source(f"{server.url}/blob.bin")
    assert source.pread(30 * CHUNK, 2 * CHUNK) == data[30 * CHUNK: 32 * CHUNK]
    server.wait_idle()
    answered = requests_since(server, logged, "/blob.bin")
    counted = mine.get(SOURCE_COUNTERS).snapshot()
    assert counted["requests"] == len(answered) and counted["by_scheme"]["http"]["requests"]["ok"] == len(answered)
    assert counted["bytes"] == sum(nbytes for _, _, nbytes in answered) >= 2 * CHUNK
    assert (port in _ports(mine.get(HTTP_POOL))) == (client == "urllib3")
    assert port not in _ports(runtime().get(HTTP_POOL))  # the process's runtime never talked to this server
    assert source.fetcher.cache.memory is mine.get(MEMORY_CHUNKS) is not runtime().get(MEMORY_CHUNKS)
    learnt = mine.get(ORIGINS).stats()[source.origin()]  # the origin's limit learnt from these requests
    assert learnt["in_flight"] == 0 and source.origin() not in runtime().get(ORIGINS).stats()
    assert source.fetcher.workers is mine.get(WORKERS) is not runtime().get(WORKERS)


def test_a_child_forked_while_the_runtime_is_in_use_connects_afresh_and_keeps_what_was_fetched(site):
    server, data = site
    source = Opener(RemoteOptions(OpenOptions(), read_ahead=False)).source(f"{server.url}/blob.bin")
    assert source.pread(0, CHUNK) == data[:CHUNK]
    shared = runtime()
    pool, counters, memory = shared.get(HTTP_POOL), shared.get(SOURCE_COUNTERS), shared.get(MEMORY_CHUNKS)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:  # a parent's thread inside the runtime at the fork
        with shared._lock, counters._lock, memory._lock:
            holding.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(WAIT_S)
    logged = len(server.access_log())
    try:
        def child() -> bytes:
            kept = source.pread(0, CHUNK) == data[:CHUNK]  # the parent's chunk, from memory
            fetched = source.pread(40 * CHUNK, CHUNK) == data[40 * CHUNK: 41 * CHUNK]  # asked on a new connection
            again = runtime()
            return json.dumps([kept, fetched, again is shared, again.get(HTTP_POOL) is pool,
                               again.get(SOURCE_COUNTERS) is counters, again.get(MEMORY_CHUNKS) is memory]).encode()

        got = in_child(child)
    finally:
        release.set()
        holder.join(WAIT_S)
    assert got, "the child hung on a lock a parent's thread held at the fork"
    assert json.loads(got) == [True, True, True, False, True, True]
    server.wait_idle()
    assert [r[0] for r in requests_since(server, logged, checks=False)] == ["/blob.bin"]  # the new chunk only


def test_a_part_the_child_cannot_keep_is_built_afresh():
    def broken(value: list[int]) -> list[int]:
        raise RuntimeError("cannot keep this")

    kept = Part("kept", lambda: [1], lambda value: value)
    lost = Part("lost", lambda: [2], broken)
    mine = Runtime()
    first, second = mine.get(kept), mine.get(lost)
    first.append(10)
    second.append(20)

    def child() -> bytes:
        mine.renew_in_child()
        return json.dumps([mine.get(kept), mine.get(lost), sorted(mine.built())]).encode()

    assert json.loads(in_child(child)) == [[1, 10], [2], ["kept", "lost"]]
    assert mine.get(lost) == [2, 20]  # the parent's own, untouched


def test_a_runtime_of_its_own_is_renewed_in_a_child_and_its_live_objects_reset():
    class Resets:
        def __init__(self, fails: bool = False) -> None:
            self.fails, self.reset = fails, False

        def in_child(self) -> None:
            if self.fails:
                raise RuntimeError("cannot reset")
            self.reset = True

    mine = Runtime()
    broken, kept = Resets(fails=True), Resets()
    mine.get(LIVE).add(broken)
    mine.get(LIVE).add(kept)
    counters = mine.get(SOURCE_COUNTERS)
    with counters._lock:  # held by the parent at the fork: the child's renewal gives a fresh one
        got = in_child(lambda: json.dumps([kept.reset, broken.reset, mine.get(SOURCE_COUNTERS) is counters,
                                           counters._lock.acquire(timeout=WAIT_S)]).encode())
    assert json.loads(got) == [True, False, True, True]
    assert not kept.reset  # the parent's untouched


@pytest.fixture(scope="module")
def slow_site(tmp_path_factory):
    yield from _blob_served(tmp_path_factory, 51, limit_rate="512k")  # a chunk's fetch lasts half a second at least


def test_a_child_forked_while_read_ahead_fetches_reads_what_they_were_fetching(slow_site):
    server, data = slow_site
    source = Opener(RemoteOptions(OpenOptions(), runtime=Runtime())).source(f"{server.url}/blob.bin")
    for i in range(4):  # a sequential reader: read-ahead fetches the chunks after these
        assert source.pread(i * CHUNK, CHUNK) == data[i * CHUNK: (i + 1) * CHUNK]
    flights = source.fetcher.flights
    assert wait_until(lambda: len(flights) > 0, WAIT_S), "read-ahead fetched nothing ahead of the reader"
    ahead = max(flights._flights)  # a chunk whose fetch is under way at the fork (the last one asked)

    def child() -> bytes:
        waited_for = flights.pending(ahead)  # the parent's fetch, whose thread the child does not have
        got = source.pread(ahead * CHUNK, CHUNK) == data[ahead * CHUNK: (ahead + 1) * CHUNK]
        return json.dumps([waited_for, got]).encode()

    assert flights.pending(ahead)
    assert json.loads(in_child(child)) == [False, True]
