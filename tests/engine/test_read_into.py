"""Reads that decode straight into the reply: ``View.read_into`` of a ``.npy`` writes whole block
groups where they belong, spread over the cores, groups cut by the request's ends from the cache.

Every byte is compared with gguf-py's dequantization (through ``np.load`` of what the reads assembled) and
with ``View.read``; the cache's contents and counters say what was decoded where; failures release their
single flight; :func:`ckptfs.engine.parallel.spread` runs each task once whatever the pool is doing.
"""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest

import ckptfs
from ckptfs.core.errors import CheckpointError
from ckptfs.engine.parallel import spread
from ckptfs.workers.scheduler import Scheduler
from ckptfs.tree.mount_tree import MountTree

from fixtures import quantized, write_gguf

gguf = pytest.importorskip("gguf")

GROUP = 256 * 1024
MIB = 1 << 20
TYPES = {"q8": "Q8_0", "q5": "Q5_0", "q4k": "Q4_K", "q6k": "Q6_K"}


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("decode_into") / "d.gguf"
    tensors = {name: (quantized(t, (640, 1024), rng), t) for name, t in TYPES.items()}  # 2.5 MiB of float32
    tensors["norm"] = (rng.standard_normal(640).astype(np.float32), "F32")
    tensors["cut"] = (quantized("Q8_0", (96, 1024), rng), "Q8_0")
    write_gguf(path, tensors)
    return path


def reference(path, name: str) -> np.ndarray:
    tensor = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)


def assembled(view, size: int, offsets_sizes, keep: bool) -> bytearray:
    """The file written by ``read_into`` calls (each into a buffer of its own, as libfuse's)."""
    out = bytearray(view.size)
    for offset, n in offsets_sizes:
        buf = bytearray(n)
        done = view.read_into(offset, memoryview(buf), keep)
        assert done == max(0, min(n, view.size - offset))
        out[offset: offset + done] = buf[:done]
    return out


@pytest.mark.parametrize("name", [*TYPES, "norm"])
@pytest.mark.parametrize("keep", [True, False])
def test_one_mib_requests_equal_gguf_py(gguf_path, name, keep):
    ck = ckptfs.open(gguf_path, cache_size=64 << 20)
    view = MountTree(ck).view(f"{name}.npy")
    data = assembled(view, view.size, [(o, MIB) for o in range(0, view.size, MIB)], keep)
    np.testing.assert_array_equal(np.load(io.BytesIO(bytes(data))), reference(gguf_path, name))
    assert bytes(data) == view.read(0, view.size)


def test_odd_ranges_equal_read(gguf_path):
    ck = ckptfs.open(gguf_path, cache_size=64 << 20)
    rng = np.random.default_rng(5)
    for name in (*TYPES, "norm"):
        view = MountTree(ck).view(f"{name}.npy")
        whole = view.read(0, view.size)
        ck.cache.clear()
        for _ in range(40):
            offset, n = int(rng.integers(0, view.size)), int(rng.integers(1, 3 * MIB))
            buf = bytearray(n)
            done = view.read_into(offset, memoryview(buf), bool(rng.integers(0, 2)))
            assert bytes(buf[:done]) == whole[offset: offset + n], (name, offset, n)


def test_whole_groups_are_decoded_into_the_reply_and_kept_only_when_asked(gguf_path):
    ck = ckptfs.open(gguf_path, cache_size=64 << 20)
    view = MountTree(ck).view("q8.npy")
    assert len(view.header) == 128
    buf = memoryview(bytearray(MIB))
    # file bytes [GROUP, GROUP + 1 MiB) are body bytes [GROUP - 128, ...): groups 1-3 whole, 0 and 4 cut
    view.read_into(GROUP, buf, keep=False)
    assert ck.cache.stats().entries == 0  # nothing kept: a stream's bytes stay in the page cache
    assert ck.cache.decoded_bytes == 3 * GROUP  # the whole groups, decoded straight into the reply ...
    assert ck.cache.stats().misses == 5  # ... and the cut ones only where the reply needs them
    assert bytes(buf) == view.read(GROUP, MIB)
    ck.cache.clear()
    decoded = ck.cache.decoded_bytes
    view.read_into(GROUP, buf, keep=True)
    assert ck.cache.stats().entries == 3  # the whole groups kept (a cut one cannot be: it is not all there)
    assert ck.cache.decoded_bytes == decoded + 3 * GROUP
    hits = ck.cache.stats().hits
    view.read_into(GROUP, buf, keep=True)
    assert ck.cache.decoded_bytes == decoded + 3 * GROUP  # from the cache now
    assert ck.cache.stats().hits == hits + 3
    assert bytes(buf) == view.read(GROUP, MIB)


def test_a_small_first_read_decodes_only_its_blocks(gguf_path):
    ck = ckptfs.open(gguf_path, cache_size=64 << 20)
    view = MountTree(ck).view("q4k.npy")  # Q4_K: 256 values (1 KiB of float32) a block
    seen = []
    data = view.data
    decode = data._decode_blocks
    data._decode_blocks = lambda b0, b1, out=None, **kw: (seen.append((b0, b1)), decode(b0, b1, out, **kw))[1]
    buf = bytearray(4096)
    view.read_into(0, memoryview(buf))
    assert seen == [(0, 3), (3, 4)]  # body bytes 0..3968: three whole blocks, then the one the end cuts
    assert ck.cache.stats().misses == 1 and ck.cache.stats().entries == 0
    assert bytes(buf) == view.read(0, 4096)


def test_concurrent_readers_of_one_range_decode_each_group_once(gguf_path):
    ck = ckptfs.open(gguf_path, cache_size=64 << 20)
    view = MountTree(ck).view("q6k.npy")
    expected = view.read(0, view.size)
    ck.cache.clear()
    ck.cache.decoded_bytes = 0
    results, barrier = [], threading.Barrier(6)

    def reader():
        buf = bytearray(2 * MIB)
        barrier.wait()
        view.read_into(4096, memoryview(buf), keep=True)
        results.append(bytes(buf))

    threads = [threading.Thread(target=reader) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [expected[4096: 4096 + 2 * MIB]] * 6
    # body bytes 3968 .. 3968 + 2 MiB: groups 1-7 whole, decoded once for all six (0 and 8 are cut: each
    # reader decodes its part of them)
    assert ck.cache.decoded_bytes == 7 * GROUP


def test_concurrent_streams_not_kept_still_get_every_byte(gguf_path):
    ck = ckptfs.open(gguf_path, cache_size=64 << 20)
    view = MountTree(ck).view("q5.npy")
    expected = view.read(0, view.size)
    ck.cache.clear()
    errors, barrier = [], threading.Barrier(4)

    def reader():
        barrier.wait()
        for offset in range(0, view.size, MIB):
            buf = bytearray(MIB)
            done = view.read_into(offset, memoryview(buf), keep=False)
            if bytes(buf[:done]) != expected[offset: offset + MIB]:
                errors.append(offset)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []


def test_a_truncated_tensor_fails_and_releases_its_groups(gguf_path, tmp_path):
    data = gguf_path.read_bytes()
    ck = ckptfs.open(gguf_path)
    info = ck["cut"].info
    short = tmp_path / "short.gguf"
    short.write_bytes(data[: info.offset + info.stored_nbytes // 2])
    ck = ckptfs.open(short, cache_size=64 << 20)
    view = MountTree(ck).view("cut.npy")
    for _ in range(2):  # the second time too: nothing waits for the first one's groups
        with pytest.raises(CheckpointError, match="cut"):
            view.read_into(0, memoryview(bytearray(view.size)), keep=False)
    buf = bytearray(64 << 10)  # its first 64 KiB are all there
    assert view.read_into(0, memoryview(buf)) == len(buf)
    assert bytes(buf) == view.read(0, len(buf))


def test_spread_runs_each_task_once_and_raises_the_first_error():
    scheduler = Scheduler(concurrency={"decode": 2})
    seen, lock = [], threading.Lock()

    def task(i):
        def run():
            time.sleep(0.002)
            with lock:
                seen.append(i)
        return run

    spread([task(i) for i in range(20)], scheduler)
    assert sorted(seen) == list(range(20))

    def boom():
        raise ValueError("group 3")

    seen.clear()
    with pytest.raises(ValueError, match="group 3"):
        spread([task(0), boom, task(2), task(3)], scheduler)
    assert sorted(seen) == [0, 2, 3]  # the others still ran, and ended before spread returned


def test_spread_does_not_wait_for_a_busy_pool():
    scheduler = Scheduler(concurrency={"decode": 2})
    release = threading.Event()
    for _ in range(2):  # both workers busy (read-ahead, say): the helper spread asks for waits behind them
        assert scheduler.submit("decode", release.wait, 0) is not None
    ran = []
    start = time.monotonic()
    spread([lambda i=i: ran.append(i) for i in range(8)], scheduler)
    assert sorted(ran) == list(range(8))  # the caller ran them all itself
    assert time.monotonic() - start < 5
    release.set()


def test_native_bfloat16_encoding_equals_numpy():
    from ckptfs.hffolder.safetensors_view import bfloat16_bits, bfloat16_bits_numpy
    from ckptfs.quant.native import native_types

    if not native_types():
        pytest.skip("C extension not built")
    rng = np.random.default_rng(2)
    special = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x7F7FFFFF,
               0x00008000, 0x00018000, 0x3F808000, 0x3F818000, 0x7FFF8000, 0x7F7F8000, 1]
    values = np.concatenate([rng.integers(0, 2**32, 1 << 16, dtype=np.uint32),
                             np.array(special, np.uint32)]).view(np.float32)
    expected = bfloat16_bits_numpy(values)
    assert np.array_equal(bfloat16_bits(values), expected)
    out = np.zeros(values.size + 3, np.uint16)
    bfloat16_bits(values, out[1:-2])
    assert np.array_equal(out[1:-2], expected) and (out[0], out[-2], out[-1]) == (0, 0, 0)


def test_the_read_path_is_warmed_once_per_storage_type_and_keeps_nothing(gguf_path):
    from ckptfs.fuse.counters import DecodeCounters, instrument_decoding
    from ckptfs.fuse.operations import prime_read_path

    ck = ckptfs.open(gguf_path, cache_size=64 << 20)
    counters = DecodeCounters(None)
    instrument_decoding(ck, counters)
    prime_read_path(MountTree(ck))
    # one block of each decoded type, past the cache: a fresh daemon's counters still say nothing was looked up
    assert counters.bytes.snapshot() == {"Q8_0": 128, "Q5_0": 128, "Q4_K": 1024, "Q6_K": 1024}
    stats = ck.cache.stats()
    assert (stats.misses, stats.hits, stats.entries) == (0, 0, 0)


def test_the_mounts_read_ahead_only_advises_views_that_decode_into_the_reply(gguf_path, monkeypatch):
    from ckptfs.ahead.decode import DecodeAhead
    from ckptfs.sources import FileSource

    advised = []
    monkeypatch.setattr(FileSource, "advise", lambda self, offset, size, sequential=False, **kw:
                        advised.append((offset, size)))
    for dtype, decodes_ahead in (("float32", False), ("float16", True)):  # float16: a cast, through the cache
        ck = ckptfs.open(gguf_path, dtype=dtype, cache_size=64 << 20)
        view = MountTree(ck).view("q8.npy")
        assert view.decodes_into_reply is not decodes_ahead
        pf = DecodeAhead(ck.sources, ck.cache.capacity, into_reply=True)
        pf.opened(1, view)
        advised.clear()
        for i in range(3):
            pf.on_read(1, i * GROUP, GROUP)
        pf.close(wait=True)
        assert advised  # the kernel is told what comes next either way
        assert (ck.cache.stats().entries > 0) is decodes_ahead


def test_a_mount_keeps_decoded_groups_only_for_readers_the_page_cache_does_not_serve(gguf_path, mounted):
    """A mount is kernel_cache: what a buffered read or an mmap fault is answered stays in the page cache, so
    the block cache keeps no second copy of it; an O_DIRECT reader's bytes are not in the page cache, so its
    whole groups are kept (a second O_DIRECT read of them is a hit). Every byte equals gguf-py's."""
    import mmap

    from conftest import mount_stats
    from mount_expect import read_direct

    mnt = mounted(gguf_path, "--cache-size", "64M")
    expected = {name: io.BytesIO() for name in ("q8", "q5")}
    for name, buffer in expected.items():
        np.save(buffer, reference(gguf_path, name).reshape(640, 1024))
    header = len(expected["q8"].getvalue()) - 640 * 1024 * 4

    def memory() -> dict:
        return mount_stats(mnt)["tiers"]["memory"]

    with open(mnt / "q8.npy", "rb") as f:  # a random (not sequential) buffered read of four whole groups
        f.seek(header + GROUP)
        assert f.read(MIB) == expected["q8"].getvalue()[header + GROUP: header + GROUP + MIB]
    with open(mnt / "q5.npy", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        row = 400 * 1024 * 4  # a fault in the middle of the file: the kernel reads around it
        assert mapped[header + row: header + row + 4096] == expected["q5"].getvalue()[header + row: header + row + 4096]
    after_buffered = memory()
    assert after_buffered["misses"] > 0 and after_buffered["bytes"] == 0 and after_buffered["entries"] == 0

    offset = header + 2 * GROUP - header % 4096 + 4096  # page-aligned, not on a group boundary
    want = expected["q8"].getvalue()[offset: offset + 3 * GROUP]
    assert read_direct(mnt / "q8.npy", [(offset, 3 * GROUP)]) == [want]
    kept = memory()
    assert kept["bytes"] >= 2 * GROUP and kept["entries"] >= 2  # the whole groups the read covered
    assert read_direct(mnt / "q8.npy", [(offset, 3 * GROUP)]) == [want]
    again = memory()
    assert again["hits"] >= kept["hits"] + 2 and again["bytes"] == kept["bytes"]
