"""s3:// reads against moto's standalone S3 server through the fault proxy: a transient bad answer (a refused
If-Match, another ETag, size or range, a whole object to a ranged GET, a body cut short) is asked again on a
fresh connection within the deadline and the right bytes are served; the same wrong answer twice fails the
read with one line; the odd answer's bytes are never served nor mixed (every read is compared with the
object's bytes as uploaded)."""

from __future__ import annotations

import numpy as np
import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

from ckptfs.core.runtime import runtime  # noqa: E402
from ckptfs.sources.remote.store import chunks  # noqa: E402
from ckptfs.core.errors import CheckpointError  # noqa: E402
from ckptfs.core.options import OpenOptions  # noqa: E402
from ckptfs.sources import Opener  # noqa: E402
from ckptfs.sources.remote.options import RemoteOptions  # noqa: E402
from loopback.faultproxy import FaultProxy  # noqa: E402
from loopback.servers import MotoS3, environment  # noqa: E402

BUCKET, KEY = "faults", "blob.bin"
SIZE = 6 * 1024 * 1024 + 123
OFFSET, LENGTH = 4 * 1024 * 1024 + 17, 300_000  # past the first 2 MiB, which the open fetches
ODD = ["412", "etag", "total", "range", "norange"]


@pytest.fixture(scope="module")
def served():
    """(the fault proxy in front of moto, the object's bytes); the AWS environment points at the proxy."""
    data = np.random.default_rng(5).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    with MotoS3() as server, FaultProxy(server.endpoint) as proxy, environment(server.env()):
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key=KEY, Body=data)
        with environment({"AWS_ENDPOINT_URL": proxy.url}):
            yield proxy, data


@pytest.fixture
def proxy(served):
    proxy, _ = served
    yield proxy
    proxy.always(None)
    assert proxy.pending() == 0  # every fault planned was met


def _open():
    """A fresh source of the object (this process's chunk memory emptied: every read asks the origin)."""
    runtime().get(chunks.MEMORY_CHUNKS).clear()
    return Opener(RemoteOptions(OpenOptions.build(timeout=10.0, stall_timeout=2.0))).source(f"s3://{BUCKET}/{KEY}")


def _settled(proxy, quiet: float = 0.5, bound: float = 15.0) -> None:
    """Wait (at most ``bound`` seconds) until the proxy has been asked nothing for ``quiet`` seconds."""
    import time

    end = time.monotonic() + bound
    seen = sum(proxy.requests.values())
    while time.monotonic() < end:
        time.sleep(quiet)
        now = sum(proxy.requests.values())
        if now == seen:
            return
        seen = now


def _read_with(served, proxy, fault: str) -> tuple[int, int, list[int]]:
    """Read bytes OFFSET.. of a fresh source with ``fault`` met by its one request and check them: (the port of
    the connection that met the fault, the port of the one asked again, the ports seen before the fault)."""
    _, data = served
    src = _open()
    before, used = len(proxy.peers), len(proxy.faults_used)
    proxy.plan(fault)
    assert src.pread(OFFSET, LENGTH) == data[OFFSET:OFFSET + LENGTH]
    assert proxy.faults_used[used:] == [fault]
    return proxy.peers[before], proxy.peers[before + 1], proxy.peers[:before]


@pytest.mark.parametrize("fault", ODD)
def test_one_odd_answer_is_asked_again_on_a_fresh_connection(served, proxy, fault):
    """One node behind the endpoint answering wrongly once: its bytes dropped, the range asked again on a
    connection never used before, and the right bytes served."""
    odd, again, seen = _read_with(served, proxy, fault)
    assert again not in [*seen, odd], (odd, again)  # a fresh connection


@pytest.mark.parametrize("fault, message", [("412", "changed since it was opened: the object's ETag"),
                                            ("etag", "changed since it was opened: its ETag is now"),
                                            ("total", "changed since it was opened: its size is now"),
                                            ("range", "asked for bytes"),
                                            ("norange", "does not support Range")])
def test_the_same_odd_answer_twice_fails_that_read(served, proxy, fault, message):
    src = _open()
    used = len(proxy.faults_used)
    proxy.always(fault)
    with pytest.raises(CheckpointError, match=message) as info:
        src.pread(OFFSET, 1000)
    proxy.always(None)
    assert proxy.faults_used[used:] == [fault, fault]  # asked once more, and no more
    assert "\n" not in str(info.value)


def test_two_different_odd_answers_are_retried_within_the_deadline(served, proxy):
    _, data = served
    src = _open()
    used = len(proxy.faults_used)
    proxy.plan("etag", "range")
    assert src.pread(OFFSET, LENGTH) == data[OFFSET:OFFSET + LENGTH]
    assert proxy.faults_used[used:] == ["etag", "range"]


@pytest.mark.parametrize("fault", ["short", "reset"])
def test_a_body_cut_short_is_fetched_again_on_another_connection(served, proxy, fault):
    """Half the body, then the connection closed (or reset): those bytes thrown away, the range fetched again
    on another connection, and only the whole answer served."""
    cut, again, _ = _read_with(served, proxy, fault)
    assert again != cut


def test_many_bad_answers_in_a_row_never_give_wrong_bytes(served, proxy):
    _, data = served
    src = _open()
    for i, fault in enumerate(["short", "412", "range", "reset", "etag", "norange", "503", "total"]):
        proxy.plan(fault)
        offset = 2 * 1024 * 1024 + i * chunks.CHUNK + 1000  # a chunk not fetched before: one request each
        assert src.pread(offset, 80_000) == data[offset:offset + 80_000], fault


def test_a_trickling_body_ends_on_the_reads_deadline_and_a_silent_one_on_the_stall_timeout(served, proxy, libcurl):
    """Through libcurl: an answer whose body comes a byte a second ends when the read's deadline does (on
    boto3 it ran on for as long as the bytes kept coming: its reads wait for 64 KiB each), one that sends
    nothing after its headers on the stall timeout; the next request is served."""
    import time

    from ckptfs.sources.remote.context import ReadContext
    from ckptfs.sources.remote.origin import Retryable

    _, data = served
    src = _open()
    _settled(proxy)  # a request still under way from an earlier read (its read-ahead) would meet the fault
    proxy.plan("trickle:30")
    t0 = time.monotonic()
    with pytest.raises(Retryable) as caught:
        src.range.fetch(OFFSET, OFFSET + LENGTH, ReadContext(time.monotonic() + 1.0))
    assert caught.value.deadline and time.monotonic() - t0 < 6
    proxy.plan("headers:30")
    t0 = time.monotonic()
    with pytest.raises(Retryable) as caught:
        src.range.fetch(OFFSET, OFFSET + LENGTH, ReadContext(time.monotonic() + 30))
    assert caught.value.timeout and not caught.value.deadline and time.monotonic() - t0 < 10
    assert b"".join(src.range.fetch(OFFSET, OFFSET + LENGTH, ReadContext(time.monotonic() + 30))) == \
        data[OFFSET:OFFSET + LENGTH]
    assert src.range.target
