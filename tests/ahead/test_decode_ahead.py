"""Read-ahead (ckptfs/ahead/decode.py) without FUSE: the hooks the FUSE operations call, driven by hand.

A sequential reader gets the groups ahead of it decoded into the cache (so its next reads are hits), within
the cache fraction; random access, a disabled prefetcher and direct types decode nothing ahead; raw streams
and stored ranges are advised to the kernel; the mount's device is found in /proc/self/mountinfo.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import ckptfs
from ckptfs.ahead import decode as decode_ahead
from ckptfs.fuse import kernel
from ckptfs.fuse.mountinfo import unescape
from ckptfs.ahead.decode import DecodeAhead
from ckptfs.sources import FileSource
from ckptfs.tree.mount_tree import MountTree

from fixtures import quantized, write_gguf

pytest.importorskip("gguf")

ROWS, COLS = 1024, 512  # Q8_0 -> 2 MiB of float32 = 8 groups of 256 KiB
GROUP = 256 * 1024


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    rng = np.random.default_rng(3)
    path = tmp_path_factory.mktemp("prefetch") / "p.gguf"
    write_gguf(path, {"q": (quantized("Q8_0", (ROWS, COLS), rng), "Q8_0"),
                      "f": (rng.standard_normal((256, 1024)).astype(np.float32), "F32")})
    return path


def setup(path, cache_size=32 << 20, enabled=True):
    ck = ckptfs.open(path, cache_size=cache_size)
    tree = MountTree(ck)
    return ck, tree, DecodeAhead(ck.sources, ck.cache.capacity, enabled=enabled)


def test_sequential_reads_decode_the_next_groups(gguf_path):
    ck, tree, pf = setup(gguf_path)
    view = tree.view("q.npy")
    pf.opened(1, view)
    step = 128 * 1024
    pf.on_read(1, 0, step)
    view.read(0, step)
    # one read is not a stream yet: nothing ahead (the read's own group, cut by it, is decoded into the
    # reply and not kept)
    assert ck.cache.stats().entries == 0
    pf.on_read(1, step, step)
    view.read(step, step)
    pf.close(wait=True)
    # 4 MiB ahead (1/8 of 32 MiB) covers the rest of the 2 MiB tensor: every group is now cached
    assert ck.cache.stats().entries == -(-ROWS * COLS * 4 // GROUP)
    misses = ck.cache.stats().misses
    expected = np.asarray(ck["q"]).tobytes()
    header = len(view.header)
    assert view.read(header, len(expected)) == expected  # what was decoded ahead is what is served
    assert ck.cache.stats().misses == misses


def test_read_ahead_stays_within_the_cache_fraction(gguf_path):
    ck, tree, pf = setup(gguf_path, cache_size=1 << 20)  # 1/4 in flight = 256 KiB: one group at a time
    view = tree.view("q.npy")
    pf.opened(1, view)
    for i in range(3):
        pf.on_read(1, i * 4096, 4096)
    pf.close(wait=True)
    assert ck.cache.stats().entries <= 1


def test_random_access_and_disabled_prefetch_decode_nothing_ahead(gguf_path):
    ck, tree, pf = setup(gguf_path)
    view = tree.view("q.npy")
    pf.opened(1, view)
    for offset in (1_500_000, 200_000, 900_000, 40_000):
        pf.on_read(1, offset, 4096)
    pf.close(wait=True)
    assert ck.cache.stats().entries == 0
    ck, tree, off = setup(gguf_path, enabled=False)
    off.opened(1, tree.view("q.npy"))
    for i in range(4):
        off.on_read(1, i * 65536, 65536)
    off.close(wait=True)
    assert ck.cache.stats().entries == 0 and ck.cache.stats().misses == 0


def test_released_handle_is_forgotten(gguf_path):
    ck, tree, pf = setup(gguf_path)
    pf.opened(7, tree.view("q.npy"))
    pf.released(7)
    for i in range(4):
        pf.on_read(7, i * 65536, 65536)
    pf.close(wait=True)
    assert ck.cache.stats().entries == 0


def test_streams_are_advised_to_the_kernel(gguf_path, monkeypatch):
    calls = []
    monkeypatch.setattr(FileSource, "advise", lambda self, offset, size, sequential=False, **kw:
                        calls.append((offset, size, sequential)))
    ck, tree, pf = setup(gguf_path)
    raw = tree.view("f.raw")
    pf.opened(1, raw)
    pf.on_read(1, 0, 65536)
    pf.on_read(1, 65536, 65536)
    info = raw.info
    assert calls and calls[0][2] is True  # SEQUENTIAL once, when the stream is recognized
    assert all(info.offset <= o and o + n <= info.offset + info.stored_nbytes for o, n, _ in calls)
    assert calls[0][0] == info.offset + 2 * 65536  # from where the reader will be next
    calls.clear()
    npy = tree.view("q.npy")
    pf.opened(2, npy)
    pf.on_read(2, 0, 65536)
    pf.on_read(2, 65536, 65536)
    pf.close(wait=True)
    q, f = ck["q"].info, ck["f"].info
    # the stream's own stored bytes first; its window reaches past q.npy's end, so tensor-aware read-ahead
    # also advises the start of f, the tensor stored next (what a reader of every .npy in turn opens next)
    assert calls and q.offset <= calls[0][0] and calls[0][0] + calls[0][1] <= q.offset + q.stored_nbytes
    assert all((q.offset <= o and o + n <= q.offset + q.stored_nbytes) or (f.offset <= o and o + n <= f.offset + f.stored_nbytes)
               for o, n, _ in calls)


@pytest.fixture(scope="module")
def three_tensors(tmp_path_factory):
    """Three Q8_0 tensors stored one after the other, their names not in file order."""
    rng = np.random.default_rng(5)
    path = tmp_path_factory.mktemp("follow") / "three.gguf"
    write_gguf(path, {name: (quantized("Q8_0", (ROWS, COLS), rng), "Q8_0") for name in ("b", "c", "a")})
    return path


def _stream_whole(pf, fh, view):
    pf.opened(fh, view)
    for offset in range(0, view.size, 1 << 20):  # the whole file, in 1 MiB reads
        pf.on_read(fh, offset, 1 << 20)
        view.read(offset, 1 << 20)
    pf.released(fh)  # the reader closes it before opening the next file: the work ahead goes on


def _first_rows_are_cached(ck, view, name):
    """Whether reading the first rows of ``name`` through ``view`` needs no decode (they were decoded ahead)."""
    misses = ck.cache.stats().misses
    expected = np.asarray(ck[name])[:64].tobytes()
    assert view.read(len(view.header), len(expected)) == expected
    return ck.cache.stats().misses == misses


def test_a_reader_in_file_order_finds_the_next_tensor_decoded(three_tensors):
    ck, tree, pf = setup(three_tensors)
    b, c, a = (tree.view(f"{name}.npy") for name in ("b", "c", "a"))
    assert b.following().slot == c.slot and c.following().slot == a.slot and a.following() is None
    _stream_whole(pf, 1, b)  # one file read: nothing says yet that the reader goes on in file order
    _stream_whole(pf, 2, c)  # it went on to the file stored next: from now on read-ahead continues into a
    pf.close(wait=True)
    assert _first_rows_are_cached(ck, a, "a")  # decoded before a.npy was opened


def test_a_reader_in_name_order_gets_no_work_for_the_file_stored_next(three_tensors):
    ck, tree, pf = setup(three_tensors)
    _stream_whole(pf, 1, tree.view("b.npy"))  # b is stored first, c after it
    _stream_whole(pf, 2, tree.view("a.npy"))  # name order goes on to a, not to c
    _stream_whole(pf, 3, tree.view("b.npy"))
    pf.close(wait=True)
    # b's and a's groups were decoded (the reader's and ahead of it), nothing of c: every one of c's groups
    # is a miss when c is read whole
    assert _first_rows_are_cached(ck, tree.view("a.npy"), "a") and _first_rows_are_cached(ck, tree.view("b.npy"), "b")
    c, misses = tree.view("c.npy"), ck.cache.stats().misses
    assert c.read(len(c.header), c.size) == np.asarray(ck["c"]).tobytes()
    assert ck.cache.stats().misses - misses == -(-ROWS * COLS * 4 // GROUP)


def test_direct_types_are_only_advised(gguf_path):
    ck, tree, pf = setup(gguf_path)
    view = tree.view("f.npy")  # F32 served as float32: bytes straight from the file, nothing to decode
    pf.opened(1, view)
    for i in range(4):
        pf.on_read(1, i * 65536, 65536)
    pf.close(wait=True)
    assert ck.cache.stats().misses == 0


def test_mount_device_of_root_matches_stat():
    st = os.stat("/")
    assert kernel.mount_device("/") == f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    assert unescape(r"/tmp/a\040b\134c") == "/tmp/a b\\c"
    assert kernel.mount_device("/no/such/mount/point") is None


def test_kernel_only_mode_advises_without_decoding(gguf_path, monkeypatch):
    calls = []
    monkeypatch.setattr(FileSource, "advise", lambda self, offset, size, sequential=False, **kw:
                        calls.append((offset, size)))
    ck = ckptfs.open(gguf_path, cache_size=32 << 20)
    pf = DecodeAhead(ck.sources, ck.cache.capacity, decode_ahead=False)
    pf.opened(1, MountTree(ck).view("q.npy"))
    for i in range(4):
        pf.on_read(1, i * 65536, 65536)
    pf.close(wait=True)
    assert calls and ck.cache.stats().misses == 0


@pytest.mark.parametrize("value, enabled, decode", [("0", False, False), ("off", False, False), ("1", True, True),
                                                    ("", True, True), ("kernel", True, False)])
@pytest.mark.parametrize("name", ["CKPTFS_DECODE_AHEAD", "CKPTFS_PREFETCH"])
def test_env_switch(monkeypatch, value, enabled, decode, name):
    """``CKPTFS_DECODE_AHEAD``, and its older name ``CKPTFS_PREFETCH`` when it is not set."""
    monkeypatch.delenv(decode_ahead.DECODE_AHEAD_ENV, raising=False)
    monkeypatch.delenv(decode_ahead.PREFETCH_ENV, raising=False)
    monkeypatch.setenv(name, value)
    assert decode_ahead.enabled_from_env() is enabled
    assert decode_ahead.decode_ahead_from_env() is decode


def test_the_new_name_wins_over_the_alias(monkeypatch):
    monkeypatch.setenv(decode_ahead.PREFETCH_ENV, "0")
    monkeypatch.setenv(decode_ahead.DECODE_AHEAD_ENV, "kernel")
    assert decode_ahead.enabled_from_env() and not decode_ahead.decode_ahead_from_env()


def test_a_found_stream_has_the_rest_of_its_file_advised_as_one_unit(gguf_path, monkeypatch):
    """Tensor-aware read-ahead: once a reader is seen streaming a .raw, the stored bytes of the rest of the
    tensor are advised at once (a remote source then fetches them over parallel ranges), not window by window."""
    calls = []
    monkeypatch.setattr(FileSource, "advise", lambda self, offset, size, sequential=False, **kw:
                        calls.append((offset, size, sequential)))
    monkeypatch.setattr(decode_ahead, "MAX_AHEAD_BYTES", 65536)  # the decode window: far short of the file's end
    ck, tree, pf = setup(gguf_path)
    raw = tree.view("f.raw")
    assert raw.size > 4 * 65536
    pf.opened(1, raw)
    pf.on_read(1, 0, 65536)
    assert not calls  # one read is not a stream
    pf.on_read(1, 65536, 65536)
    info = raw.info
    assert max(o + n for o, n, _ in calls) == info.offset + info.stored_nbytes


def test_a_long_file_has_its_rest_advised_in_steps_to_its_end(gguf_path, monkeypatch):
    """The rest of a file longer than one advice is advised again as its reader moves on, up to its end: a
    remote source's window then stays full to the end of a large tensor instead of falling back to the decode
    window's few MiB after the first advice."""
    calls = []
    monkeypatch.setattr(FileSource, "advise", lambda self, offset, size, sequential=False, **kw:
                        calls.append((offset, size)))
    monkeypatch.setattr(FileSource, "fetches_ahead", property(lambda self: True))  # as a remote source's
    monkeypatch.setattr(decode_ahead, "MAX_AHEAD_BYTES", 16384)
    monkeypatch.setattr(decode_ahead, "WHOLE_ADVICE_BYTES", 131072)
    monkeypatch.setattr(decode_ahead, "ADVICE_STEP", 32768)
    ck, tree, pf = setup(gguf_path)
    raw = tree.view("f.raw")
    info = raw.info
    assert raw.size == info.stored_nbytes > 4 * 131072
    pf.opened(1, raw)
    furthest = []
    for offset in range(0, raw.size, 16384):
        pf.on_read(1, offset, 16384)
        furthest.append(max((o + n for o, n in calls), default=0) - info.offset)
        # never more than one advice ahead of the reader, and always (once found) at least a step ahead
        assert furthest[-1] <= offset + 16384 + 131072
        if offset >= 16384 and offset + 16384 + 131072 - 32768 < raw.size:
            assert furthest[-1] >= offset + 16384 + 131072 - 32768, (offset, furthest[-1])
    assert furthest[-1] == raw.size  # up to the file's end
    pf.close(wait=True)


@pytest.fixture(scope="module")
def small_tensors(tmp_path_factory):
    """Forty F32 tensors of 4 KiB stored one after the other (norms), then a larger one."""
    rng = np.random.default_rng(9)
    path = tmp_path_factory.mktemp("small") / "small.gguf"
    tensors = {f"n{i:02d}": (rng.standard_normal(1024).astype(np.float32), "F32") for i in range(40)}
    tensors["w"] = (rng.standard_normal((64, 1024)).astype(np.float32), "F32")
    write_gguf(path, tensors)
    return path


def test_a_reader_in_file_order_has_the_small_files_ahead_advised_as_merged_ranges(small_tensors, monkeypatch):
    """A reader in file order (``cp -r``, a loader) of many small files from a source that fetches what is
    advised (remote): the stored bytes of the files after the one it reads are advised as a few merged ranges
    ahead of it (fetched as whole pieces, not one request per file), and each file read extends that chain
    from its end instead of walking it again."""
    calls = []
    monkeypatch.setattr(FileSource, "advise", lambda self, offset, size, sequential=False, **kw:
                        calls.append((offset, size)))
    monkeypatch.setattr(FileSource, "fetches_ahead", property(lambda self: True))  # as a remote source's
    ck, tree, pf = setup(small_tensors)
    order = sorted(ck.tensors, key=lambda t: t.info.offset)
    views = [tree.view(f"{t.name}.raw") for t in order]

    for k, view in enumerate(views[:10]):
        pf.opened(k + 1, view)
        pf.on_read(k + 1, 0, 1 << 20)  # each small file whole in one read, as `cp` reads it
        view.read(0, 1 << 20)
        pf.released(k + 1)
    pf.close(wait=True)
    ends = {t.info.offset: t.info.offset + t.info.stored_nbytes for t in order}
    # some advised range spans several tensors stored one after another (the gaps are alignment padding)
    spans = [sum(1 for start in ends if o <= start and ends[start] <= o + n) for o, n in calls]
    assert max(spans) >= 8, spans
    # everything advised belongs to the files after the ones read, in file order
    assert min(o for o, _ in calls) >= order[1].info.offset
    # the chain is extended, not walked again: far fewer advice calls than files ahead times files read
    assert len(calls) <= 3 * 10, len(calls)


def test_a_local_file_read_in_file_order_gets_no_advice_past_the_file_read(small_tensors, monkeypatch):
    """A local file's kernel reads ahead on its own: advising it far ahead only adds work to the reader's
    path, so a local reader in file order gets no advice of the files after the one it reads."""
    calls = []
    monkeypatch.setattr(FileSource, "advise", lambda self, offset, size, sequential=False, **kw:
                        calls.append((offset, size)))
    ck, tree, pf = setup(small_tensors)
    order = sorted(ck.tensors, key=lambda t: t.info.offset)
    for k, tensor in enumerate(order[:10]):
        view = tree.view(f"{tensor.name}.raw")
        pf.opened(k + 1, view)
        pf.on_read(k + 1, 0, 1 << 20)
        view.read(0, 1 << 20)
        pf.released(k + 1)
    pf.close(wait=True)
    assert all(o + n <= order[10].info.offset for o, n in calls), calls
