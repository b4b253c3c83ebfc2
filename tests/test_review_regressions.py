"""Regressions found by a pre-release review of the read path, each compared against a reference
(gguf-py's reader and dequantizer, numpy indexing of the reference array, np.save)."""

from __future__ import annotations

import io
import os
import struct

import numpy as np
import pytest
from fixtures import write_gguf
from gguf import GGUFReader
from gguf.quants import dequantize

import ckptfs
from ckptfs.core.errors import CheckpointError

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


@pytest.fixture(scope="module")
def index_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("index") / "index.gguf"
    written = write_gguf(path, {"q3": (RNG.standard_normal((3, 4, 64)).astype(np.float32), "Q8_0"),
                                "f3": (RNG.standard_normal((3, 4, 64)).astype(np.float32), "F32"),
                                "q1": (RNG.standard_normal(64).astype(np.float32), "Q4_0")})
    return path, {name: ref.array for name, ref in written.tensors.items()}


def _assert_indexes_like_numpy(tensor, reference: np.ndarray, key) -> None:
    expected = reference[key]
    got = tensor[key]
    assert type(got) is type(expected), key
    assert np.shape(got) == np.shape(expected), key
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name", ["q3", "f3", "q1"])
@pytest.mark.parametrize("key", [True, False, (True,), (True, 0)], ids=repr)
def test_a_python_bool_index_is_a_mask_not_row_one(index_gguf, name, key):
    """numpy reads a Python bool as a 0-d mask (a new axis of length 1 or 0), not as the integer 1 or 0,
    although ``bool`` is a subclass of ``int``."""
    path, refs = index_gguf
    with ckptfs.open(path) as ck:
        _assert_indexes_like_numpy(ck[name], refs[name], key)


@pytest.mark.parametrize("name", ["q3", "f3"])
@pytest.mark.parametrize("key", [(0, slice(None), [1, 2]), (-1, Ellipsis, [3]), (1, slice(None), np.array([0, 5])),
                                 (2, slice(1, 3), np.array([True] * 32 + [False] * 32))],
                         ids=["0,:,list", "-1,...,list", "1,:,array", "2,1:3,mask"])
def test_an_integer_first_index_with_a_later_array_index_orders_axes_like_numpy(index_gguf, name, key):
    """An integer is an advanced index too: with an array index beyond a slice, numpy puts the broadcast
    axes first (``a[0, :, [1, 2]]`` has shape (2, 4)), which indexing the row ``a[0]`` afterwards does not."""
    path, refs = index_gguf
    with ckptfs.open(path) as ck:
        _assert_indexes_like_numpy(ck[name], refs[name], key)


@pytest.mark.parametrize("name, key", [("q1", 0), ("q1", -1), ("q3", (0, 1, 2)), ("f3", (2, -1, 63)),
                                       ("q1", (5, Ellipsis)), ("f3", (0, 1, 2, Ellipsis))], ids=repr)
def test_a_full_integer_index_gives_a_numpy_scalar(index_gguf, name, key):
    """numpy returns a scalar (hashable, ``isinstance(x, np.floating)``) for one element, and a 0-d array
    only where an Ellipsis is in the key."""
    path, refs = index_gguf
    with ckptfs.open(path) as ck:
        _assert_indexes_like_numpy(ck[name], refs[name], key)


def test_a_tensor_of_a_relative_path_unpickles_after_a_chdir(index_gguf, tmp_path, monkeypatch):
    """The open checkpoint keeps reading its relative path after a ``chdir`` (its sources remember where
    they were opened); a pickled tensor must too (spawned workers start in the parent's current directory,
    which tools such as Hydra move)."""
    import pickle

    path, refs = index_gguf
    monkeypatch.chdir(path.parent)
    with ckptfs.open(path.name) as ck:
        pickled = pickle.dumps(ck["q3"])
    monkeypatch.chdir(tmp_path)
    clone = pickle.loads(pickled)
    assert clone.name == "q3"
    np.testing.assert_array_equal(np.asarray(clone), refs["q3"])


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


def test_a_closed_checkpoint_read_again_still_refuses_a_replaced_file(tmp_path):
    """Reading after ``close()`` is refused (issue 11: a reopened descriptor had no owner to close it), so a
    replacement's bytes are never served at the old header's offsets either."""
    path = tmp_path / "model.gguf"
    old = write_gguf(path, {"w": (RNG.standard_normal((4, 64)).astype(np.float32), "Q8_0")})
    ck = ckptfs.open(path)
    np.testing.assert_array_equal(ck["w"][:], old.tensors["w"].array)
    new = write_gguf(tmp_path / "new.gguf", {"w": (RNG.standard_normal((4, 64)).astype(np.float32), "Q8_0")})
    assert new.tensors["w"].raw != old.tensors["w"].raw
    (tmp_path / "new.gguf").replace(path)
    ck.close()
    with pytest.raises(CheckpointError, match="checkpoint is closed"):
        ck["w"][:]
    with pytest.raises(CheckpointError, match="checkpoint is closed"):
        ck["w"].raw()
