"""``ckptfs manifest``: every hash against hashlib/zlib over the bytes the reference readers locate; loading
checks every field and says what is wrong in one line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import zlib

import numpy as np
import pytest
from conftest import ckptfs_cli, cli_env
from fixtures import write_gguf, write_mixed_gguf
from integrity_fixtures import big_safetensors, expected_entry, file_sha256, point_gguf_tensor_at, reference_tensors

import ckptfs
from ckptfs.core.errors import CheckpointError
from ckptfs.integrity import manifest as manifest_module
from ckptfs.integrity.crc import crc32_combine
from ckptfs.integrity.manifest import FORMAT, build_manifest, load_manifest, parse_manifest


def check_against_reference(manifest, path, name=None) -> None:
    name = name or os.path.basename(path)
    (f,) = [f for f in manifest.files if f.name == name]
    assert (f.size, f.sha256) == (os.path.getsize(path), file_sha256(path))
    expected = sorted((expected_entry(*t) for t in reference_tensors(path)), key=lambda e: (e["offset"], e["name"]))
    mine = [t for t in manifest.tensors if t.file == name]
    got = sorted(({"name": t.name, "offset": t.offset, "stored_nbytes": t.stored_nbytes, "crc32": t.crc32,
                   "sha256": t.sha256, "chunks_crc32": list(t.chunks_crc32)} for t in mine),
                 key=lambda e: (e["offset"], e["name"]))
    assert got == expected


def test_gguf_every_storage_type(tmp_path):
    written = write_mixed_gguf(tmp_path / "mixed.gguf")
    with ckptfs.open(written.path) as ck:
        manifest = build_manifest(ck)
    check_against_reference(manifest, written.path)
    assert len(manifest.tensors) == len(written.tensors)


@pytest.mark.parametrize("read_size", [1 << 16, 3 << 19, manifest_module.READ_SIZE])
def test_multi_chunk_tensors_across_read_boundaries(tmp_path, monkeypatch, read_size):
    """Chunks and reads that do not line up: tensors of several chunks, one ending inside a chunk, reads of
    64 KiB, 1.5 MiB and the default size."""
    path = tmp_path / "big.safetensors"
    big_safetensors(path)
    monkeypatch.setattr(manifest_module, "READ_SIZE", read_size)
    with ckptfs.open(path) as ck:
        manifest = build_manifest(ck)
    check_against_reference(manifest, path)
    assert {t.name: len(t.chunks_crc32) for t in manifest.tensors} == {
        "big.weight": 3, "mid.weight": 1, "norm.weight": 1, "ids": 1, "empty": 0}


def test_shard_folder_files_named_relative_to_the_folder(tmp_path):
    """A sharded safetensors folder (index + two shards written by the reference writer): each file by its
    name in the folder, files hashed in parallel."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    a = {"a.weight": rng.standard_normal((256, 300)).astype(np.float32)}
    b = {"b.weight": rng.standard_normal((512, 700)).astype(np.float32), "b.bias": np.ones(7, np.float32)}
    save_file(a, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(b, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {**{k: "model-00001-of-00002.safetensors" for k in a}, **{k: "model-00002-of-00002.safetensors" for k in b}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with ckptfs.open(tmp_path) as ck:
        manifest = build_manifest(ck, workers=2)
    # the shards, then the folder's other files the mount serves (here the index), hashed whole
    assert [f.name for f in manifest.files] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                                "model.safetensors.index.json"]
    for f in manifest.files[:2]:
        check_against_reference(manifest, tmp_path / f.name, f.name)
    index = manifest.files[2]
    whole = hashlib.sha256((tmp_path / index.name).read_bytes()).hexdigest()
    assert (index.size, index.sha256, index.header_sha256) == ((tmp_path / index.name).stat().st_size, whole, whole)


def test_tensors_sharing_bytes_each_listed(tmp_path):
    """Tensors whose bytes overlap (a header pointing two tensors at one offset) are each listed, in file
    order, with the hashes of their own byte ranges (gguf-py's offsets and sizes as the reference)."""
    rng = np.random.default_rng(2)
    path = tmp_path / "shared.gguf"
    write_gguf(path, {"x": (rng.standard_normal((4, 64)).astype(np.float32), "F32"),
                      "y": (rng.standard_normal((2, 64)).astype(np.float32), "Q8_0"),
                      "z": (rng.standard_normal((2, 32)).astype(np.float32), "F32")})
    point_gguf_tensor_at(path, "y", "x")
    with ckptfs.open(path) as ck:
        manifest = build_manifest(ck)
    check_against_reference(manifest, path)
    by_name = {t.name: t for t in manifest.tensors}
    assert by_name["x"].offset == by_name["y"].offset


def test_crc32_combine_is_zlib_over_the_concatenation():
    rng = np.random.default_rng(0)
    for n_a, n_b in [(0, 0), (0, 5), (5, 0), (1, 1), (1000, 1 << 20), (3, 12345), (1 << 20, 1 << 20)]:
        a, b = rng.bytes(n_a), rng.bytes(n_b)
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), n_b) == zlib.crc32(a + b)


def test_dumps_round_trips_and_is_the_contract_format(tmp_path):
    path = tmp_path / "big.safetensors"
    big_safetensors(path)
    with ckptfs.open(path) as ck:
        manifest = build_manifest(ck)
    data = json.loads(manifest.dumps())
    assert data["format"] == FORMAT and data["chunk_size"] == 1048576
    assert set(data) == {"format", "chunk_size", "files", "tensors"}
    assert set(data["files"][0]) == {"name", "size", "sha256", "header_sha256"}
    assert set(data["tensors"][0]) == {"name", "file", "offset", "stored_nbytes", "crc32", "sha256", "chunks_crc32"}
    assert parse_manifest(data, "m") == manifest


def test_cli_writes_the_manifest(tmp_path):
    written = write_mixed_gguf(tmp_path / "mixed.gguf")
    out = tmp_path / "m.json"
    result = subprocess.run([*ckptfs_cli(), "manifest", str(written.path), "-o", str(out)], env=cli_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""  # no progress bar when stderr is not a terminal
    check_against_reference(load_manifest(str(out)), written.path)
    to_stdout = subprocess.run([*ckptfs_cli(), "manifest", str(written.path)], env=cli_env(),
                               capture_output=True, text=True, timeout=120)
    assert to_stdout.returncode == 0 and json.loads(to_stdout.stdout) == json.loads(out.read_text())


def test_cli_refuses_a_truncated_checkpoint_in_one_line(tmp_path):
    written = write_mixed_gguf(tmp_path / "cut.gguf")
    size = os.path.getsize(written.path)
    os.truncate(written.path, size - 100)
    result = subprocess.run([*ckptfs_cli(), "manifest", str(written.path), "-o", str(tmp_path / "m.json")],
                            env=cli_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "lie past the end of the file" in result.stderr
    assert not (tmp_path / "m.json").exists()


def _valid() -> dict:
    data = {"format": FORMAT, "chunk_size": 1048576,
            "files": [{"name": "m.gguf", "size": 100, "sha256": "a" * 64}],
            "tensors": [{"name": "t", "file": "m.gguf", "offset": 10, "stored_nbytes": 20, "crc32": 5,
                         "sha256": "b" * 64, "chunks_crc32": [5]}]}
    return data


def _edit(path, value):
    data = _valid()
    *parents, last = path
    node = data
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return json.dumps(data)


_DELETE = object()

MALFORMED = {
    "not JSON": ("{\"format\": ", "not JSON"),
    "a list": ("[]", "must be a JSON object"),
    "other format": (_edit(["format"], "ckptfs-manifest/2"), "format is 'ckptfs-manifest/2'"),
    "no format": (_edit(["format"], _DELETE), "format is None"),
    "chunk size 0": (_edit(["chunk_size"], 0), "chunk_size must be positive"),
    "chunk size string": (_edit(["chunk_size"], "1M"), "chunk_size must be a non-negative integer"),
    "files not a list": (_edit(["files"], {}), "files must be a list"),
    "file without sha": (_edit(["files", 0, "sha256"], _DELETE), "files[0].sha256 must be 64 lower-case hex"),
    "file sha upper case": (_edit(["files", 0, "sha256"], "A" * 64), "files[0].sha256 must be 64"),
    "file size negative": (_edit(["files", 0, "size"], -1), "files[0].size must be a non-negative integer"),
    "file size bool": (_edit(["files", 0, "size"], True), "files[0].size must be a non-negative integer"),
    "tensor of unknown file": (_edit(["tensors", 0, "file"], "other.gguf"), "file 'other.gguf' is not in files"),
    "tensor past the file": (_edit(["tensors", 0, "offset"], 90), "lie past the end of 'm.gguf'"),
    "crc32 too big": (_edit(["tensors", 0, "crc32"], 2**32), "crc32 must be a non-negative integer below 2^32"),
    "too few chunks": (_edit(["tensors", 0, "chunks_crc32"], []), "chunks_crc32 has 0 entries, 1 expected"),
    "chunk crc a string": (_edit(["tensors", 0, "chunks_crc32"], ["5"]), "chunks_crc32[0] must be"),
    "tensor name missing": (_edit(["tensors", 0, "name"], _DELETE), "tensors[0].name must be a string"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_manifest_is_one_line(tmp_path, case):
    text, phrase = MALFORMED[case]
    path = tmp_path / "m.json"
    path.write_text(text)
    with pytest.raises(CheckpointError) as info:
        load_manifest(str(path))
    message = str(info.value)
    assert message.startswith(str(path)) and phrase in message and "\n" not in message


def test_the_valid_base_of_the_malformed_cases_loads(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(_valid()))
    (t,) = load_manifest(str(path)).tensors
    assert (t.name, t.offset, t.stored_nbytes, t.chunks_crc32) == ("t", 10, 20, (5,))
