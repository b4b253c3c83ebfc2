"""A read's deadline against an origin that stops answering: the application's read ends within ``--timeout``.

Debian's nginx on loopback, throttled (``limit_rate``, and four requests in flight) so that a read is still
under way when the test freezes the server (SIGSTOP: connections stay open, nothing more comes, as a hung
origin behaves). Reads go through real FUSE mounts, as an application makes them: a buffered stream of 1 MiB
reads (the kernel reads a failed read-ahead's pages again one at a time), one 64 MiB O_DIRECT read (64
requests of 1 MiB on libfuse's threads), an mmap fault loop (in a child, which SIGBUS ends). Each must end
within ``--timeout`` + 1 s (the outage rule, ``ckptfs/sources/remote/outage.py``) of the freeze; the bounds
asserted add slack for a loaded machine and stay below what a deadline per kernel request took. After the
server resumes, the same bytes read exact, every file keeps its size, the daemon never sent a short reply.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import mmap
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("urllib3")

from ckptfs.cache.tiered import BlockCache, TieredCache
from ckptfs.core.descriptors import TensorInfo
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.engine import blocks
from ckptfs.engine.blocks import TensorData
from ckptfs.engine.parallel import spread
from ckptfs.quant import codec_for
from ckptfs.workers.scheduler import Scheduler
from ckptfs.sources import FileSource, SourcePool
from ckptfs.sources.remote.outage import Admission, Outage
from conftest import mount_stats, nginx_origin, pid_alive, wait_until
from fixtures import quantized, write_gguf
from loopback.servers import Nginx

MiB = 1 << 20
TIMEOUT = 5
#: --timeout, the probe's second, and slack for a loaded machine (what the rule promises ends 1 s before);
#: with a deadline per kernel request these reads took 9-34 s.
BOUND = TIMEOUT + 1 + 2
SLOW = {"CKPTFS_REMOTE_IN_FLIGHT": "4"}  # with nginx's 512 KiB/s a request: 2 MiB/s in all


@contextlib.contextmanager
def frozen(server: Nginx):
    """The server stopped (SIGSTOP) inside, resumed at exit."""
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield time.monotonic()
    finally:
        os.kill(server.pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    """A GGUF with a Q8_0 embedding (17 MiB stored, a 64 MiB .npy) and a 64 MiB F32 tensor, behind nginx
    capped at 512 KiB/s per request."""
    def fill(root):
        rng = np.random.default_rng(3)
        write_gguf(root / "m.gguf", {"token_embd.weight": (quantized("Q8_0", (4096, 4096), rng), "Q8_0"),
                                     "big": (rng.standard_normal((4096, 4096)).astype(np.float32), "F32")})

    with nginx_origin(tmp_path_factory, fill, "outage-www", limit_rate="512k") as (server, root, _):
        yield server, root


def _npy_reference(root) -> bytes:
    import gguf

    tensor = next(t for t in gguf.GGUFReader(str(root / "m.gguf")).tensors if t.name == "token_embd.weight")
    values = gguf.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    out = io.BytesIO()
    np.save(out, values.reshape(4096, 4096))
    return out.getvalue()


def _raw_reference(root) -> bytes:
    import gguf

    tensor = next(t for t in gguf.GGUFReader(str(root / "m.gguf")).tensors if t.name == "big")
    return bytes(tensor.data.tobytes())


def _stream(path, outcome: dict) -> None:
    """Read ``path`` sequentially in 1 MiB reads, as a loader streams a tensor; note how it ended and when."""
    try:
        with open(path, "rb", buffering=0) as fh:
            while fh.read(MiB):
                pass
        outcome["error"] = None
    except OSError as exc:
        outcome["error"] = exc.errno
    outcome["ended"] = time.monotonic()


def _direct_read(path, outcome: dict) -> None:
    """One 64 MiB O_DIRECT read from the start (llama.cpp's load pattern)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 64 * MiB)
    try:
        outcome["got"] = os.preadv(fd, [buf], 0)
        outcome["error"] = None
    except OSError as exc:
        outcome["error"] = exc.errno
    finally:
        outcome["ended"] = time.monotonic()
        os.close(fd)
        buf.close()


#: A child that touches one byte of every page of a mapped file in order, as a loader's mmap faults do.
_FAULT_LOOP = """
import mmap, sys
with open(sys.argv[1], "rb") as fh:
    m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    total = 0
    for at in range(0, len(m), 4096):
        total += m[at]
print(total)
"""


#: What is read again after the outage: the file's start, past what was read before the freeze (1 s of a
#: 2 MiB/s origin) and the read-ahead beyond it.
AGAIN = 6 * MiB


def _after_outage(mnt, name: str, want: bytes) -> None:
    """With the server back: the file keeps its size, the bytes read before and at the freeze read exact (once
    a probe found the origin answering again: about once a second), and the daemon never sent a short
    reply."""
    assert os.stat(mnt / name).st_size == len(want)

    def exact() -> bool:
        try:
            with open(mnt / name, "rb") as fh:
                return fh.read(AGAIN) == want[:AGAIN] or pytest.fail(f"{name}: other bytes after the outage")
        except OSError as exc:
            assert exc.errno == errno.EIO, exc
            return False

    assert wait_until(exact, timeout=30, interval=0.2)
    stats = mount_stats(mnt)
    assert stats["short_replies"] == 0 and pid_alive(stats["pid"])


def _run_frozen(server, target, path, outcome: dict, into: float = 1.0) -> float:
    """Start ``target(path, outcome)``, freeze the server ``into`` seconds later, wait for the reader; the
    seconds from the freeze to the read's end."""
    reader = threading.Thread(target=target, args=(path, outcome))
    reader.start()
    time.sleep(into)  # the read under way when the server stops
    assert "ended" not in outcome, "the read ended before the server stopped: the origin is not slow enough"
    with frozen(server) as stopped:
        reader.join(120)
        assert not reader.is_alive(), "the read never ended"
    return outcome["ended"] - stopped


def test_the_outage_rule():
    """A fetch that used its whole --timeout: deadlines cut to the outage's start (that fetch's arrival) +
    --timeout, new fetches refused but for one probe at a time (an hour apart here); the fetches that arrive
    while it is in flight wait for its answer; only a success ends the outage."""
    outage = Outage(probe_interval=3600)
    now = time.monotonic()
    assert outage.admit(5) is Admission.ASK and outage.bound(now + 30, 5) == now + 30
    assert outage.timed_out(now - 7, 5, "HTTP 500")
    assert outage.since == now - 7 and outage.reason == "HTTP 500"
    assert outage.bound(now + 30, 5) == now - 2  # a fetch under way ends at once
    assert not outage.timed_out(now - 6, 5)  # a later fetch running out does not move the start
    assert outage.since == now - 7
    assert outage.tally.stats() == {"outages": 1, "deadlines_met": 1}  # side by side: one wait
    assert outage.admit(5) is Admission.PROBE  # the first fetch past the start + --timeout probes
    assert outage.admit(5) is Admission.WAIT  # the others wait for its answer meanwhile
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(outage.wait_probe(30)))
    waiter.start()
    outage.probed(False)
    waiter.join(10)
    assert waited == [False]  # the probe failed: the fetch that waited fails
    assert outage.admit(5) is Admission.REFUSE  # and the next probe waits for its interval
    outage.probe_interval = 0
    assert outage.admit(5) is Admission.PROBE and outage.admit(5) is Admission.WAIT
    waiter = threading.Thread(target=lambda: waited.append(outage.wait_probe(30)))
    waiter.start()
    outage.probed(True)  # answered: the outage is over, the fetch that waited goes on
    waiter.join(10)
    assert waited == [False, True]
    assert outage.since is None and outage.admit(5) is Admission.ASK and outage.bound(now + 30, 5) == now + 30


def test_only_a_success_ends_an_outage():
    """Bytes trickling in or errors answered do not end an outage (the origin serves nothing a read can use);
    a fetch that got its bytes does. A fetch that runs out after an outage ended starts the next."""
    outage = Outage()
    now = time.monotonic()
    outage.timed_out(now - 30, 30)
    assert outage.since == now - 30 and outage.admit(30) is not Admission.ASK
    outage.succeeded()
    assert outage.since is None and outage.admit(30) is Admission.ASK
    assert outage.timed_out(now, 30)
    assert outage.tally.stats() == {"outages": 2, "deadlines_met": 2}


class _ScopeSeen(FileSource):
    """A local file recording the thread and the deadline of every read asked of it; the first read waits until a
    read has come from another thread (so one of a request's tasks surely ran on a decode worker)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.seen: list[tuple[int, float | None]] = []
        self.elsewhere = threading.Event()

    def pread(self, offset: int, size: int, *, scope: ReadScope = NOTHING_SAID) -> bytes:
        me = threading.get_ident()
        self.seen.append((me, scope.deadline))
        if any(thread != me for thread, _ in self.seen):
            self.elsewhere.set()
        if len(self.seen) == 1:
            assert self.elsewhere.wait(10), "no decode worker took a task"
        return super().pread(offset, size, scope=scope)


def test_decode_workers_carry_the_readers_deadline(tmp_path, monkeypatch):
    """A .npy read's block groups decoded on the decode pool's workers read their bytes under the reader's
    deadline, not one each worker's task starts afresh (that made one FUSE read last several --timeouts): the
    scope a mount's read passes to ``bytes_into`` reaches every source read, on whichever thread it runs."""
    monkeypatch.setattr(blocks, "spread", functools.partial(spread, scheduler=Scheduler(concurrency={"decode": 2})))
    monkeypatch.setattr(blocks, "DECODE_TASKS", 2)
    codec = codec_for("Q8_0")
    stored = quantized("Q8_0", (64 * codec.block_elements,), np.random.default_rng(3)).tobytes()
    path = tmp_path / "q8.bin"
    path.write_bytes(stored)
    source = _ScopeSeen(str(path))
    info = TensorInfo(name="t", storage_type="Q8_0", shape=(64 * codec.block_elements,), source=str(path), offset=0,
                      stored_nbytes=len(stored), block_elements=codec.block_elements, block_bytes=codec.block_bytes)
    data = TensorData(info, codec, np.dtype(np.float32), SourcePool(opener=lambda name, base: source),
                      TieredCache([BlockCache(1 << 20)]))
    data.group_blocks = 8  # eight groups: two runs of groups decoded at once
    target = np.empty(data.n_elements * 4, np.uint8)
    scope = NOTHING_SAID.within(5)
    data.bytes_into(0, target, keep=False, scope=scope)
    assert len({thread for thread, _ in source.seen}) == 2  # one task ran on a worker
    assert {deadline for _, deadline in source.seen} == {scope.deadline}, source.seen
    expected = codec.dequantize(np.frombuffer(stored, np.uint8).reshape(64, codec.block_bytes)).reshape(-1)
    assert target.view(np.float32).tobytes() == expected.astype(np.float32).tobytes()


@pytest.mark.parametrize("read", [_stream, _direct_read], ids=["buffered-1MiB-reads", "one-64MiB-O_DIRECT-read"])
def test_a_read_ends_in_eio_within_the_timeout(origin, mounted, read, tmp_path):
    server, root = origin
    log = tmp_path / "daemon.log"
    mnt = mounted(server.url + "/m.gguf", "--timeout", str(TIMEOUT), "--log-file", str(log), env=SLOW)
    outcome: dict = {}
    took = _run_frozen(server, read, mnt / "big.raw", outcome)
    assert outcome["error"] == errno.EIO, outcome
    assert took < BOUND, took
    # the requests in flight when the origin froze say what each saw (at most the origin's four in flight),
    # the refused ones one message per probe interval: a handful per file, not one per kernel request (a
    # 64 MiB direct read is 64). How many probe intervals the read spans depends on the machine's load.
    eio = [line for line in log.read_text().splitlines() if "EIO:" in line]
    assert len(eio) <= 12, eio
    _after_outage(mnt, "big.raw", _raw_reference(root))


def test_an_mmap_fault_loop_ends_in_sigbus_within_the_timeout(origin, mounted):
    server, root = origin
    mnt = mounted(server.url + "/m.gguf", "--timeout", str(TIMEOUT), env=SLOW)

    def fault_loop(path, outcome: dict) -> None:
        done = subprocess.run([sys.executable, "-c", _FAULT_LOOP, str(path)], capture_output=True, timeout=120)
        outcome["returncode"] = done.returncode
        outcome["ended"] = time.monotonic()

    outcome: dict = {}
    took = _run_frozen(server, fault_loop, mnt / "big.raw", outcome)
    assert outcome["returncode"] == -signal.SIGBUS, outcome
    assert took < BOUND, took
    _after_outage(mnt, "big.raw", _raw_reference(root))


def test_a_throttled_origin_frozen_mid_npy_stream_is_eio_within_the_default_timeout(origin, mounted):
    server, root = origin
    mnt = mounted(server.url + "/m.gguf", env=SLOW)
    outcome: dict = {}
    took = _run_frozen(server, _stream, mnt / "token_embd.weight.npy", outcome)
    assert outcome["error"] == errno.EIO, outcome
    assert took < 45, took  # --timeout 30 s, and slack
    _after_outage(mnt, "token_embd.weight.npy", _npy_reference(root))
