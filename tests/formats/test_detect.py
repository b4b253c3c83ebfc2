"""Format detection by content, and ``read_file`` dispatching on it.

Files are written by the references (gguf-py, safetensors) under misleading names, so only their bytes can
identify them; non-checkpoint files must be refused with a message that names the file and what it starts
with.
"""

from __future__ import annotations

import json
import pickle
import struct
import zipfile

import numpy as np
import pytest
import safetensors.numpy
from fixtures import write_gguf, write_safetensors

from ckptfs.core.errors import CheckpointError
from ckptfs.formats import detect, read_file


@pytest.fixture
def gguf_file(tmp_path):
    return write_gguf(tmp_path / "model.safetensors", {"w": (np.ones(4, np.float32), "F32")}).path


@pytest.fixture
def safetensors_file(tmp_path):
    path = tmp_path / "model.gguf"
    safetensors.numpy.save_file({"w": np.ones(4, np.float32)}, str(path))
    return path


def test_detect_by_content_not_name(gguf_file, safetensors_file):
    assert detect(str(gguf_file)) == "gguf"
    assert detect(str(safetensors_file)) == "safetensors"
    assert read_file(str(gguf_file)).format == "gguf"
    assert read_file(str(safetensors_file)).format == "safetensors"
    assert detect(gguf_file) == "gguf"  # os.PathLike works too


def test_big_endian_gguf(tmp_path):
    path = write_gguf(tmp_path / "be.bin", {"w": (np.ones(4, np.float32), "F32")}, big_endian=True).path
    assert detect(str(path)) == "gguf"
    assert read_file(str(path)).tensors[0].byte_order == ">"


@pytest.mark.parametrize("padding", [1, 60, 5000])
def test_safetensors_with_leading_whitespace(tmp_path, padding):
    header = b" " * (padding - 1) + b"\n" + json.dumps({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}).encode()
    path = tmp_path / "ws"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x01\x02")
    assert detect(str(path)) == "safetensors"
    assert read_file(str(path)).tensors[0].offset == 8 + len(header)


def test_safetensors_header_longer_than_file_is_still_recognised(tmp_path):
    path = tmp_path / "cut"
    path.write_bytes(struct.pack("<Q", 5000) + b'{"w": {"dtype"')
    assert detect(str(path)) == "safetensors"
    with pytest.raises(CheckpointError, match="header cut short"):
        read_file(str(path))


def _zip(path):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"x")
    return path.read_bytes()


NOT_CHECKPOINTS = {
    "zip": (None, "a zip archive"),
    "pickle": (pickle.dumps({"a": 1}, protocol=4), "a Python pickle"),
    "legacy ggjt": (b"tjgg" + bytes(60), "legacy GGJT"),
    "legacy ggml": (b"lmgg" + bytes(60), "legacy GGML"),
    "index json": (json.dumps({"metadata": {}, "weight_map": {}}).encode(), "JSON text"),
    "text": (b"hello world, this is not a model\n", "starts with b'hello wo'"),
    "short": (b"GGU", "starts with b'GGU'"),
    "8 bytes": (struct.pack("<Q", 2), "not a GGUF or safetensors file"),
    "length 1": (struct.pack("<Q", 1) + b"{", "not a GGUF or safetensors file"),
    "length over cap, no JSON after it": (struct.pack("<Q", 100_000_001) + b"xy", "not a GGUF or safetensors file"),
    "whitespace then not object": (struct.pack("<Q", 4) + b"  []", "not a GGUF or safetensors file"),
    "all whitespace": (struct.pack("<Q", 70) + b" " * 70, "not a GGUF or safetensors file"),
    "empty": (b"", "empty file"),
}


@pytest.mark.parametrize("case", list(NOT_CHECKPOINTS))
def test_not_a_checkpoint(tmp_path, case):
    data, expected = NOT_CHECKPOINTS[case]
    path = tmp_path / f"file-{case.replace(' ', '-')}"
    if data is None:
        data = _zip(path)
    path.write_bytes(data)
    for call in (detect, read_file):
        with pytest.raises(CheckpointError) as info:
            call(str(path))
        assert str(path) in str(info.value)
        assert expected in str(info.value)
        assert "not a GGUF or safetensors file" in str(info.value)


def test_safetensors_header_length_over_the_cap_says_so(tmp_path):
    """A JSON object after an absurd length field is a safetensors file the format's 100 MB cap forbids."""
    path = tmp_path / "huge-header"
    path.write_bytes(struct.pack("<Q", 100_000_001) + b"{}")
    for call in (detect, read_file):
        with pytest.raises(CheckpointError, match="header length 100000001 exceeds the safetensors limit of "
                                                  "100000000 bytes") as info:
            call(str(path))
        assert "not a GGUF or safetensors file" not in str(info.value)


def test_zip_message_shows_the_magic(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    _zip(path)
    with pytest.raises(CheckpointError, match=r"starts with b'PK\\x03\\x04"):
        detect(str(path))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(CheckpointError, match="cannot open"):
        detect(str(tmp_path / "nope"))
    with pytest.raises(CheckpointError) as info:
        read_file(str(tmp_path))
    assert str(tmp_path) in str(info.value)


def test_written_safetensors_fixture_is_detected(tmp_path):
    written = write_safetensors(tmp_path / "x", {"a": np.zeros(3, np.int16)})
    assert detect(str(written.path)) == "safetensors"
