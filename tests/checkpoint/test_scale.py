"""Scale: the columnar fast path of the safetensors reader and lazily made Tensor objects.

The fast path must give exactly what the exact (pair by pair) reader gives — itself checked against the
safetensors library in test_safetensors_reader.py — or step aside: every header here is read both ways and
compared field by field, and values are checked against safetensors' own loader.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import ckptfs
from ckptfs.core.descriptors import TensorTable
from ckptfs.formats import safetensors as st_reader
from ckptfs.formats.safetensors import read_safetensors


def _blob(header: dict, data: bytes, pad: bool = True) -> bytes:
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def _entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


HEADERS = {
    "plain": ({"__metadata__": {"format": "pt"}, "a": _entry("F32", [2, 2], 0, 16), "b": _entry("BF16", [3], 16, 22)},
              bytes(22)),
    "zero-size tensors": ({"e": _entry("F32", [0, 4], 0, 0), "f": _entry("I8", [0], 0, 0),
                           "g": _entry("U8", [2], 0, 2)}, bytes(2)),
    "metadata null": ({"__metadata__": None, "a": _entry("F16", [1], 0, 2)}, bytes(2)),
    "unknown dtype": ({"a": _entry("F32", [1], 0, 4), "z": _entry("Q9_X", [7], 4, 11)}, bytes(11)),
    "data cut short": ({"a": _entry("F32", [4], 0, 16), "b": _entry("F32", [4], 16, 32)}, bytes(20)),
    "trailing bytes": ({"a": _entry("F32", [1], 0, 4)}, bytes(12)),
    "name equal to a field": ({"dtype": _entry("F32", [1], 0, 4), "shape": _entry("F32", [1], 4, 8)}, bytes(8)),
    "packed F4": ({"p": _entry("F4", [4], 0, 2)}, bytes(2)),
    "unicode names": ({"ünï/cödé": _entry("F32", [1], 0, 4), "tab\tname": _entry("I32", [1], 4, 8)}, bytes(8)),
}


def _exact(path, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(st_reader._Header, "_fast_build", lambda self, text: None)
        return read_safetensors(str(path))


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_the_fast_path_reads_exactly_what_the_exact_path_reads(tmp_path, monkeypatch, case):
    header, data = HEADERS[case]
    path = tmp_path / "t.safetensors"
    path.write_bytes(_blob(header, data))
    fast, exact = read_safetensors(str(path)), _exact(path, monkeypatch)
    assert list(fast.tensors) == list(exact.tensors)
    assert dict(fast.metadata) == dict(exact.metadata) and fast.notes == exact.notes
    if case == "name equal to a field":
        assert not isinstance(fast.tensors, TensorTable)  # the text count cannot vouch for it: exact path
    else:
        assert isinstance(fast.tensors, TensorTable)


@pytest.mark.parametrize("text", [
    b'{"a": {"dtype": "F32", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',   # a repeated field
    b'{"__metadata__": {}, "__metadata__": {}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
    b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
    b'"a": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}',                    # last entry wins
    b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "extra": {"x": [[1]]}}}',
    b'{"a": {"dtype": "F32", "shape": [-0], "data_offsets": [0, 0]}}',
    b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',                    # a gap at the start
])
def test_unusual_headers_get_the_exact_paths_verdict(tmp_path, monkeypatch, text):
    path = tmp_path / "t.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(8))
    outcomes = []
    for read in (lambda: read_safetensors(str(path)), lambda: _exact(path, monkeypatch)):
        try:
            outcomes.append(("ok", list(read().tensors)))
        except ckptfs.CheckpointError as exc:
            outcomes.append(("refused", str(exc)))
    assert outcomes[0] == outcomes[1]


def test_a_checkpoint_makes_tensor_objects_only_when_asked(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {f"model.layers.{i}.w": rng.standard_normal((3, 5)).astype(np.float32) for i in range(3000)}
    save_file(arrays, str(tmp_path / "m.safetensors"))
    reference = load_file(str(tmp_path / "m.safetensors"))
    with ckptfs.open(tmp_path / "m.safetensors") as ck:
        assert isinstance(ck.parsed.tensors, TensorTable)
        assert sum(t is not None for t in ck.tensors._made) == 0 and len(ck) == 3000
        assert "model.layers.2999.w" in ck and "nope" not in ck
        np.testing.assert_array_equal(np.asarray(ck["model.layers.2999.w"]), reference["model.layers.2999.w"])
        assert sum(t is not None for t in ck.tensors._made) == 1
        assert ck.tensors[-1] is ck[max(reference)]  # stored in name order (one dtype), made once
        assert [t.name for t in ck.tensors] == ck.tensors.names() and sorted(ck) == sorted(reference)


def test_a_folder_of_many_names_lists_whole_and_once_each(tmp_path, mounted):
    """A listing spans many READDIR replies (libfuse's offset mode, names handed over from C): every name
    once, nothing lost at a reply's edge, the same again on a repeated listing."""
    rng = np.random.default_rng(1)
    names = [f"model.layers.{i}.mlp.experts.{j}.w" for i in range(10) for j in range(300)]
    arrays = {name: rng.standard_normal(2).astype(np.float32) for name in names}
    save_file(arrays, str(tmp_path / "m.safetensors"))
    mnt = mounted(tmp_path / "m.safetensors")
    expected = {f"{n}{suffix}" for n in names for suffix in (".npy", ".raw", ".meta.json")}
    expected |= {"metadata.json", "m.safetensors"}
    first = os.listdir(mnt)
    assert len(first) == len(set(first)) == len(expected) and set(first) == expected
    assert os.listdir(mnt) == first
    with os.scandir(mnt) as entries:  # a slow reader: one entry at a time over the same replies
        assert sorted(e.name for e in entries) == sorted(expected)
    name = names[-1]
    np.testing.assert_array_equal(np.load(mnt / f"{name}.npy"), arrays[name])
