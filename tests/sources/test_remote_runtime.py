"""The state remote sources share lives in the runtime they are handed (``ckptfs.core.runtime``), from a real
nginx on loopback:

- a source opened with a runtime of its own counts its requests, keeps its connections and chunks, learns its
  origin's limit and hands work to worker pools there, not in the process's default runtime;
- a child forked while a parent's threads hold the runtime's locks reads on: its own connections (a new
  pool), the parent's counters and fetched chunks kept (a chunk the parent fetched is served from memory,
  asked of nginx by nobody), each under a fresh lock;
- a part's ``in_child`` that fails costs that part only: the child builds it afresh.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

pytest.importorskip("urllib3")

from conftest import require_nginx
from forking import WAIT_S, in_child
from loopback.servers import Nginx, requests_since

from ckptfs.ahead.limits import ORIGINS
from ckptfs.sources.remote.store.chunks import CHUNK, MEMORY_CHUNKS
from ckptfs.core.options import OpenOptions
from ckptfs.core.runtime import Part, Runtime, runtime
from ckptfs.sources import Opener
from ckptfs.sources.netstats import SOURCE_COUNTERS
from ckptfs.sources.remote.http import HTTP_POOL
from ckptfs.sources.remote.options import RemoteOptions
from ckptfs.workers.scheduler import WORKERS


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    require_nginx()
    root = tmp_path_factory.mktemp("www")
    data = np.random.default_rng(50).integers(0, 256, 64 * CHUNK, dtype=np.uint8).tobytes()
    (root / "blob.bin").write_bytes(data)
    with Nginx(root) as server:
        yield server, data


def _ports(pool) -> set[int]:
    """The ports a urllib3 pool manager holds connection pools for."""
    return {key.key_port for key in pool.pools.keys()}


def test_a_source_counts_and_connects_in_the_runtime_it_is_handed(site):
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
    assert port in _ports(mine.get(HTTP_POOL))
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
