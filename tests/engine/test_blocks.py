"""Block-range decoding: any element range equals the same slice of the whole-tensor decode, reads only
the bytes of the blocks it needs, and serves around missing data. Tensors sharing a data offset (files that
deduplicate data) each decode their own blocks, in the API and through a mount (gguf-py as the reference)."""

from __future__ import annotations

import io
import os
import struct

import numpy as np
import pytest
from fixtures import write_gguf
from quant_checks import raw_blocks
from gguf import GGUFReader
from gguf.quants import dequantize

import ckptfs

from ckptfs.engine.blocks import TensorData
from ckptfs.cache.tiered import BlockCache, TieredCache
from ckptfs.core.descriptors import TensorInfo
from ckptfs.core.errors import CheckpointError
from ckptfs.core.reads import NOTHING_SAID
from ckptfs.quant import codec_for, known_types, output_dtype
from ckptfs.sources import FileSource, SourcePool


class CountingPool(SourcePool):
    """A SourcePool whose sources record every (offset, size) they read."""

    def __init__(self):
        super().__init__()
        self.reads: list[tuple[int, int]] = []

    def get(self, path):
        src = super().get(path)
        if not isinstance(src, _Counting):
            src.__class__ = _Counting
            src.log = self.reads
        return src


class _Counting(FileSource):
    def pread(self, offset, size, *, scope=NOTHING_SAID):
        self.log.append((offset, size))
        return super().pread(offset, size, scope=scope)


def make_tensor(tmp_path, type_name, n_blocks, prefix=16, truncate_to=None, seed=0):
    codec = codec_for(type_name)
    blocks = raw_blocks(type_name, n_blocks, seed)
    path = tmp_path / f"{type_name}.bin"
    data = b"\0" * prefix + blocks.tobytes()
    if truncate_to is not None:
        data = data[:truncate_to]
    path.write_bytes(data)
    info = TensorInfo(name=f"t_{type_name}", storage_type=type_name, shape=(n_blocks * codec.block_elements,),
                      source=str(path), offset=prefix, stored_nbytes=blocks.nbytes,
                      block_elements=codec.block_elements, block_bytes=codec.block_bytes)
    return info, codec, blocks


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.tobytes() == b.tobytes()


@pytest.mark.parametrize("type_name", known_types())
def test_any_range_equals_slice_of_whole_decode(tmp_path, type_name):
    info, codec, blocks = make_tensor(tmp_path, type_name, n_blocks=37)
    dtype = output_dtype(codec)
    whole = codec.dequantize(blocks).reshape(-1)
    whole = whole.astype(dtype) if whole.dtype != dtype else whole
    pool = CountingPool()
    data = TensorData(info, codec, dtype, pool, TieredCache([BlockCache(1 << 20)]))
    data.group_blocks = 4  # small groups so ranges straddle group boundaries
    be, n = info.block_elements, info.n_elements
    ranges = [(0, n), (0, 1), (n - 1, n), (0, be), (be, 2 * be), (be - 1, be + 1), (3 * be + 1, 9 * be - 1),
              (4 * be * 4 - 1, 4 * be * 4 + 1), (n - be, n), (5, 5)]
    for e0, e1 in ranges:
        got = data.read(e0, e1)
        assert same(got, whole[e0:e1]), (type_name, e0, e1)
        assert same(data.read(e0, e1, use_cache=False), whole[e0:e1]), (type_name, e0, e1)


@pytest.mark.parametrize("type_name", ["Q8_0", "F32", "Q4_K"])
def test_reads_only_the_blocks_needed(tmp_path, type_name):
    if codec_for(type_name) is None:
        pytest.skip(f"{type_name} codec not registered")
    info, codec, _ = make_tensor(tmp_path, type_name, n_blocks=64)
    pool = CountingPool()
    data = TensorData(info, codec, output_dtype(codec), pool, TieredCache([BlockCache(1 << 20)]))
    data.group_blocks = 1 if not data.direct else data.group_blocks
    be, bb = info.block_elements, info.block_bytes
    e0, e1 = 10 * be + 1, 12 * be - 1
    b0, b1 = e0 // be, -(-e1 // be)
    data.read(e0, e1)
    start, stop = info.offset + b0 * bb, info.offset + b1 * bb
    assert sum(size for _, size in pool.reads) == stop - start
    assert all(start <= off and off + size <= stop for off, size in pool.reads)


def test_truncated_tensor_serves_what_is_present(tmp_path):
    codec = codec_for("Q8_0")
    n_blocks, prefix = 40, 16
    cut = prefix + 25 * codec.block_bytes + 7  # 25 whole blocks, then part of the 26th
    info, codec, blocks = make_tensor(tmp_path, "Q8_0", n_blocks, prefix=prefix, truncate_to=cut)
    data = TensorData(info, codec, np.dtype("<f4"), SourcePool(), TieredCache([BlockCache(1 << 20)]))
    data.group_blocks = 8
    whole = codec.dequantize(blocks[:25]).reshape(-1)
    assert data.available_blocks() == 25
    assert same(data.read(0, 25 * 32), whole)
    assert same(data.read(24 * 32, 25 * 32), whole[24 * 32:])
    with pytest.raises(CheckpointError, match="missing"):
        data.read(24 * 32, 25 * 32 + 1)
    with pytest.raises(CheckpointError, match="t_Q8_0"):
        data.read(30 * 32, 31 * 32)


def test_file_changed_after_open_is_an_error_not_other_bytes(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 16)
    src = FileSource(str(path))
    assert src.pread(0, 4) == bytes([0, 1, 2, 3])
    with open(path, "r+b") as f:  # rewritten in place, same size
        f.write(b"\xff" * 16)
    with pytest.raises(CheckpointError, match="changed"):
        src.pread(0, 4)


def test_truncated_file_after_open_is_an_error(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 8192)
    src = FileSource(str(path))
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(CheckpointError):
        src.pread(4000, 100)


def test_replaced_or_deleted_file_keeps_serving_old_bytes(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old!" * 1024)
    src = FileSource(str(path))
    replacement = tmp_path / "new.bin"
    replacement.write_bytes(b"new!" * 1024)
    replacement.replace(path)
    assert src.pread(0, 4) == b"old!"
    path.unlink()
    assert src.pread(4, 4) == b"old!"


def test_reopened_descriptor_refuses_a_replaced_file(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old!" * 1024)
    src = FileSource(str(path))
    assert src.close_if_idle()
    replacement = tmp_path / "new.bin"
    replacement.write_bytes(b"new!" * 1024)
    replacement.replace(path)
    with pytest.raises(CheckpointError, match="replaced"):
        src.pread(0, 4)


def test_pool_bounds_open_descriptors(tmp_path):
    pool = SourcePool(max_open=3)
    paths = []
    for i in range(10):
        p = tmp_path / f"s{i}.bin"
        p.write_bytes(bytes([i]) * 10)
        paths.append(str(p))
    for _ in range(2):
        for i, p in enumerate(paths):
            assert pool.get(p).pread(0, 1) == bytes([i])
            assert pool.open_count() <= 3
    pool.close()
    assert pool.open_count() == 0


def test_close_waits_for_reads_in_progress(tmp_path):
    """A descriptor is never closed under a pread (its number could be reused by another open)."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 4096)
    src = FileSource(str(path))
    fd = src._acquire_fd()  # a read in progress
    src.close()
    assert src.is_open and os.fstat(fd)
    src._release_fd()  # the read ends: now it closes
    assert not src.is_open
    with pytest.raises(OSError):
        os.fstat(fd)
    assert src.pread(0, 1) == b"x"  # reopened, identity-checked


RNG = np.random.default_rng(20240611)


def _gguf_tensor_offset_field(reader: GGUFReader, name: str) -> int:
    """File position of the u64 relative data offset in ``name``'s tensor-info record (GGUF layout: name as
    u64 length + bytes, u32 n_dims, n_dims u64 dims, u32 type, u64 offset)."""
    tensor = next(t for t in reader.tensors if t.name == name)
    return tensor.field.offset + 8 + len(name.encode()) + 4 + 8 * len(tensor.shape) + 4


def _gguf_reference(path) -> dict[str, np.ndarray]:
    reader = GGUFReader(str(path))
    return {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            .reshape(tuple(int(d) for d in reversed(t.shape))) for t in reader.tensors}


@pytest.fixture(scope="module")
def shared_offset_gguf(tmp_path_factory):
    """A GGUF whose tensor "long" starts at the same data offset as the shorter "short" (files that
    deduplicate data do this), so the two overlap: "long" covers "short" and more."""
    path = tmp_path_factory.mktemp("shared") / "shared.gguf"
    write_gguf(path, {"short": (RNG.standard_normal((2, 64)).astype(np.float32), "Q8_0"),
                      "long": (RNG.standard_normal((5, 64)).astype(np.float32), "Q8_0")})
    reader = GGUFReader(str(path))
    data = bytearray(path.read_bytes())
    short_offset = struct.unpack_from("<Q", data, _gguf_tensor_offset_field(reader, "short"))[0]
    struct.pack_into("<Q", data, _gguf_tensor_offset_field(reader, "long"), short_offset)
    del reader
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("first", ["short", "long"])
def test_tensors_sharing_a_data_offset_decode_their_own_blocks(shared_offset_gguf, first):
    """Both tensors' groups start at the same file offset; the shorter tensor's (shorter) group must not be
    served for the longer one, nor the other way round."""
    ref = _gguf_reference(shared_offset_gguf)
    assert next(t.data_offset for t in GGUFReader(str(shared_offset_gguf)).tensors if t.name == "long") == \
        next(t.data_offset for t in GGUFReader(str(shared_offset_gguf)).tensors if t.name == "short")
    second = "long" if first == "short" else "short"
    with ckptfs.open(shared_offset_gguf) as ck:
        for name in (first, second):
            np.testing.assert_array_equal(ck[name][:], ref[name])
            np.testing.assert_array_equal(ck[name][1], ref[name][1])


def test_a_mount_serves_tensors_sharing_a_data_offset(shared_offset_gguf, mounted):
    """Through FUSE: each .npy is np.save of gguf-py's values, whichever is read first; reads past the end
    and larger than the file are short only at the end."""
    ref = _gguf_reference(shared_offset_gguf)
    mnt = mounted(shared_offset_gguf)
    for name in ("short", "long", "short"):
        expected = io.BytesIO()
        np.save(expected, ref[name])
        data = expected.getvalue()
        with open(mnt / f"{name}.npy", "rb", buffering=0) as f:
            assert f.read(len(data) + (1 << 20)) == data
            assert os.pread(f.fileno(), 4096, len(data) + 10) == b""
            assert os.pread(f.fileno(), 1 << 20, len(data) - 7) == data[-7:]
