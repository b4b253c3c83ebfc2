"""A packed view's ``.npy`` read as the mount reads it (``View.read_into`` into a reply buffer): the tiles a
request covers whole are decoded straight into the reply by the layout, the rows of the tiles its ends cut
decoded there too, and with ``keep=False`` (a stream) nothing is left in the cache; every byte equals
``np.save`` of the FP8 block formula (checked against compressed-tensors' dequantizer in test_packed_fp8)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from fp8_fixtures import block_quantize, expected_blocks, write_model
from packed_fixtures import same_bits

import ckptfs
from ckptfs.engine.blocks import DECODE_TASKS
from ckptfs.tree.mount_tree import MountTree

P = "model.layers.0.self_attn.kv_a_proj_with_mqa"
SHAPE, BLOCK = (576, 7168), (128, 128)  # a float32 row is 28 KiB: a tile is 9 rows (252 KiB)
KIB, MIB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    rng = np.random.default_rng(7)
    codes, scales = block_quantize(rng, SHAPE, BLOCK, np.float32)
    config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)}
    path = write_model(tmp_path_factory.mktemp("into") / "m", {P + ".weight": codes, P + ".weight_scale_inv": scales},
                       config)
    return path, expected_blocks(codes, scales, BLOCK)


def streamed(view, request: int, keep: bool) -> bytes:
    """The file as a sequence of ``read_into`` calls of ``request`` bytes, each into a buffer of its own."""
    out = bytearray(view.size)
    for offset in range(0, view.size, request):
        buf = bytearray(request)
        done = view.read_into(offset, memoryview(buf), keep)
        assert done == min(request, view.size - offset)
        out[offset: offset + done] = buf[:done]
    return bytes(out)


def counted(data) -> list[tuple[int, int, bool]]:
    """Each decode of the view's rows from now on: ``(first row, end row, into a given buffer)``."""
    calls: list[tuple[int, int, bool]] = []
    decode = data._decode

    def spy(o0, o1, out=None, **kw):  # kw: the read's scope
        calls.append((o0, o1, out is not None))
        return decode(o0, o1, out, **kw)

    data._decode = spy
    return calls


def tiles_cached(ck, data) -> int:
    return sum(ck.cache.memory.peek(data._key(t)) is not None for t in range(data.n_tiles))


@pytest.mark.parametrize("request_bytes", [128 * KIB, MIB, 3 * MIB + 4 * KIB])
def test_a_stream_decodes_every_row_once_into_the_reply_and_keeps_nothing(folder, request_bytes):
    path, expected = folder
    ck = ckptfs.open(path, cache_size=64 << 20)
    view = MountTree(ck).view(P + ".weight.npy")
    calls = counted(view.data)
    data = streamed(view, request_bytes, keep=False)
    assert same_bits(np.load(io.BytesIO(data)), expected)
    assert tiles_cached(ck, view.data) == 0  # nothing kept: a stream's bytes stay in the page cache
    rows = sum(o1 - o0 for o0, o1, _ in calls)
    requests = -(-view.size // request_bytes)
    assert SHAPE[0] <= rows <= SHAPE[0] + 2 * requests  # each row once, but the rows a request's end cuts
    # every row a request covers whole is decoded into that request's buffer, none through a scratch array
    assert sum(o1 - o0 for o0, o1, into in calls if not into) <= 2 * requests
    # and in few calls: the two rows its ends cut, and the rows between them in one part per core at most
    # (not two calls per tile its ends cut plus the whole tiles' own)
    assert len(calls) <= requests * (2 + DECODE_TASKS)


def test_a_stream_request_decodes_in_one_call_per_core_and_cut_row(folder):
    """A 1 MiB request of the stream (36 rows of 28 KiB: tiles of 9 rows, four of them whole, and one cut at
    each end) decodes the two rows its ends cut and the rows between them in at most one part per core."""
    path, _ = folder
    ck = ckptfs.open(path, cache_size=64 << 20)
    view = MountTree(ck).view(P + ".weight.npy")
    calls = counted(view.data)
    buf = memoryview(bytearray(MIB))
    assert view.read_into(3 * MIB, buf, False) == MIB
    made = list(calls)
    assert bytes(buf) == view.read(3 * MIB, MIB)
    assert len(made) <= 2 + DECODE_TASKS, made
    assert sum(o1 - o0 for o0, o1, into in made if into) >= 34  # the rows between the cut ones: into the reply


def test_whole_tiles_are_kept_when_asked_and_then_served_from_the_cache(folder):
    path, expected = folder
    ck = ckptfs.open(path, cache_size=64 << 20)
    view = MountTree(ck).view(P + ".weight.npy")
    data = view.data
    tile = data.info.block_elements * 4
    hlen = len(view.header)
    # body bytes [tile - 100, 4 tiles - 100): tiles 1 and 2 whole, 0 and 3 cut
    offset, size = hlen + tile - 100, 3 * tile
    buf = memoryview(bytearray(size))
    view.read_into(offset, buf, keep=True)
    assert [data._key(t) in ck.cache for t in range(5)] == [False, True, True, False, False]
    calls = counted(data)
    again = memoryview(bytearray(size))
    view.read_into(offset, again, keep=True)
    assert bytes(again) == bytes(buf) == view.read(offset, size)
    assert calls and all(o1 <= 9 or o0 >= 27 for o0, o1, _ in calls)  # tiles 1 and 2 (rows 9-27): cached
    tile1 = np.frombuffer(bytes(buf), np.uint8)[100: tile + 100]  # body bytes [1 tile, 2 tiles)
    assert same_bits(tile1.view(np.float32), expected[9:18].reshape(-1))


def test_odd_ranges_in_float16_equal_read(folder):
    path, _ = folder
    ck = ckptfs.open(path, dtype="float16", cache_size=64 << 20)
    view = MountTree(ck).view(P + ".weight.npy")
    whole = view.read(0, view.size)
    ck.cache.clear()
    rng = np.random.default_rng(5)
    for _ in range(40):
        offset, n = int(rng.integers(0, view.size)), int(rng.integers(1, 2 * MIB))
        buf = bytearray(n)
        done = view.read_into(offset, memoryview(buf), bool(rng.integers(0, 2)))
        assert bytes(buf[:done]) == whole[offset: offset + n], (offset, n)


def counted_windows(layout) -> list[tuple[int, int, int, int]]:
    """Each call of the layout's window kernel from now on: ``(first row, end row, skip, values)``."""
    calls: list[tuple[int, int, int, int]] = []
    window = layout.window

    def spy(reader, o0, o1, skip, out):
        calls.append((o0, o1, skip, out.size))
        return window(reader, o0, o1, skip, out)

    layout.window = spy
    return calls


def gptoss_view(tmp_path, dtype: str = "float32"):
    from fp4_fixtures import GPT_OSS_CONFIG, gptoss_experts, gptoss_formula
    from packed_fixtures import write_folder

    experts = "model.layers.0.mlp.experts.gate_up_proj"
    parts = gptoss_experts(np.random.default_rng(4), 2, 256, 320)
    path = write_folder(tmp_path / "m", {}, GPT_OSS_CONFIG,
                        extra_tensors={f"{experts}_{role}": value for role, value in parts.items()})
    ck = ckptfs.open(path, cache_size=64 << 20, dtype=dtype)
    return ck, MountTree(ck).view(experts + ".npy"), gptoss_formula(parts["blocks"], parts["scales"])


def test_a_gptoss_stream_decodes_only_the_rows_it_serves(tmp_path):
    """gpt-oss' tiles are whole 32-row block columns (256 rows of 1 KiB here); a request that cuts them, at
    rows that are no multiple of 32, decodes only the rows under it, not the block columns they lie in (each
    row once, plus the two rows each request's ends cut through), in place: the kernel writes the request's
    values straight into its buffer (the cut rows' other values left out), through no scratch rows, and
    every byte is the formula's."""
    _, view, expected = gptoss_view(tmp_path)
    assert view.data.rows_per_tile % 32 == 0 and view.data.info.block_elements * 4 > 20 * KIB
    calls, windows = counted(view.data), counted_windows(view.data.layout)
    request = 20 * KIB + 4  # every request cuts a tile at both ends, at rows that are no multiple of 32
    data = streamed(view, request, keep=False)
    assert same_bits(np.load(io.BytesIO(data)), expected)
    rows = sum(o1 - o0 for o0, o1, _ in calls) + sum(o1 - o0 for o0, o1, _, _ in windows)
    requests = -(-view.size // request)
    assert 2 * 320 <= rows <= 2 * 320 + 2 * requests
    assert not [c for c in calls if not c[2]]  # nothing decoded into a scratch array
    assert len(windows) >= requests - 2 and all(values * 4 <= request for *_, values in windows)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gptoss_reads_cut_anywhere_equal_the_formula(tmp_path, dtype):
    """Reads of gpt-oss' ``.npy`` at random offsets and lengths (inside one view row, across experts, cut
    inside a value, ending at the file's end), as a stream reads them (nothing at hand in the cache): every
    byte is the formula's, float32 and float16, and the bytes past each read are left as they were."""
    ck, view, expected = gptoss_view(tmp_path, dtype)
    with np.errstate(over="ignore"):
        whole = view.header + expected.astype(dtype).tobytes()
    assert len(whole) == view.size
    windows = counted_windows(view.data.layout)
    rng = np.random.default_rng(11)
    spans = [(len(view.header), 4), (len(view.header) + 2, 6), (view.size - 3000, 3000), (len(view.header), 320 * 2)]
    item = np.dtype(dtype).itemsize  # whole values (a stream's requests) by the window kernel, others cut
    spans += [(int(rng.integers(0, view.size // item)) * item, int(rng.integers(1, 75 * KIB)) * item)
              for _ in range(40)]
    spans += [(int(rng.integers(0, view.size)), int(rng.integers(1, 300 * KIB))) for _ in range(10)]
    for offset, n in spans:
        buf = bytearray(b"\xa5" * (n + 8))
        done = view.read_into(offset, memoryview(buf)[:n], False)
        assert bytes(buf[:done]) == whole[offset: offset + n], (offset, n)
        assert buf[done:] == b"\xa5" * (n + 8 - done)
    assert tiles_cached(ck, view.data) == 0 and len(windows) >= 30  # the window kernel served them
