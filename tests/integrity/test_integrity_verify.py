"""``ckptfs verify``: a flipped byte anywhere in any kind of tensor is named, a same-size same-mtime rewrite is
caught, a manifest of another checkpoint and a malformed one are told apart, structure checks without a
manifest; exit codes and ``--json`` as docs/integrity.md fixes them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from conftest import ckptfs_cli, cli_env
from fixtures import _FP16_FIELDS, GGML_GEOMETRY, write_gguf, write_mixed_gguf
from integrity_fixtures import big_safetensors, file_sha256, flip, point_gguf_tensor_at, reference_tensors

import ckptfs
from ckptfs.checkpoint.api import Checkpoint
from ckptfs.core.errors import CheckpointError, IntegrityError
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.formats.multi import read_checkpoint
from ckptfs.integrity.manifest import build_manifest, load_manifest
from ckptfs.integrity.verify import verify
from ckptfs.sources.base import ByteSource


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixed")
    written = write_mixed_gguf(folder / "mixed.gguf")
    with ckptfs.open(written.path) as ck:
        (folder / "mixed.manifest.json").write_text(build_manifest(ck).dumps())
    return written, folder / "mixed.manifest.json"


def flip_positions(storage_type: str, nbytes: int) -> dict[str, int]:
    """First and last byte; a byte inside a block (not its scale); a byte of a block's scale field."""
    block_elements, block_bytes = GGML_GEOMETRY[storage_type]
    n_blocks = nbytes // block_bytes
    last_block = (n_blocks - 1) * block_bytes
    if block_elements == 1:  # plain types: a middle byte of the middle element
        inside = n_blocks // 2 * block_bytes + block_bytes // 2
    else:  # past the scale fields at the start of the last block
        inside = last_block + block_bytes // 2 + 1
    positions = {"first": 0, "last": nbytes - 1, "inside a block": inside}
    scales = _FP16_FIELDS.get(storage_type) or ((0,) if storage_type == "MXFP4" else ())
    if scales:
        positions["inside a scale"] = last_block + scales[-1] + 1 if storage_type != "MXFP4" else last_block
    return positions


def mixed_cases():
    from fixtures import mixed_tensors

    cases = []
    for name, (_, storage_type) in mixed_tensors().items():
        cases += [(name, storage_type, where) for where in ("first", "last", "inside a block", "inside a scale")
                  if where != "inside a scale" or _FP16_FIELDS.get(storage_type) or storage_type == "MXFP4"]
    return cases


@pytest.mark.parametrize("name,storage_type,where", mixed_cases())
def test_flipped_byte_in_every_kind_of_tensor(tmp_path, mixed, name, storage_type, where):
    written, manifest_path = mixed
    path = tmp_path / "mixed.gguf"
    shutil.copyfile(written.path, path)
    offsets = {n: (offset, len(data)) for n, offset, data in reference_tensors(path)}  # gguf-py's reader
    offset, nbytes = offsets[name]
    flip(path, offset + flip_positions(storage_type, nbytes)[where])
    manifest = load_manifest(str(manifest_path))
    with ckptfs.open(path) as ck:
        mismatches = verify(ck, manifest)
    assert [(m.file, m.tensor) for m in mismatches] == [("mixed.gguf", None), ("mixed.gguf", name)]
    assert "sha256" in mismatches[0].what and "1 of 1 chunks differ" in mismatches[1].what
    # checked reads: the flipped tensor fails naming itself; every other tensor still reads its exact bytes
    with ckptfs.open(path, manifest=manifest_path) as ck:
        with pytest.raises(IntegrityError, match=f"tensor '{name}': stored bytes"):
            ck[name].raw()
        if ck[name].decodable:
            with pytest.raises(IntegrityError):
                ck[name].numpy()
        for other, ref in written.tensors.items():
            if other != name:
                assert ck[other].raw() == ref.raw


def test_flipped_byte_in_one_chunk_of_a_big_tensor(tmp_path):
    path = tmp_path / "big.safetensors"
    tensors = big_safetensors(path)
    with ckptfs.open(path) as ck:
        manifest = build_manifest(ck)
    offset = {n: o for n, o, _ in reference_tensors(path)}["big.weight"]
    flip(path, offset + 2 * (1 << 20) + 7)  # chunk 2 of 3
    with ckptfs.open(path) as ck:
        mismatches = verify(ck, manifest)
    assert [m.tensor for m in mismatches] == [None, "big.weight"]
    assert f"1 of 3 chunks differ: 2 (bytes {offset + 2 * (1 << 20)}..{offset + 640 * 1024 * 4})" in mismatches[1].what
    with ckptfs.open(path, manifest=manifest) as ck:
        big = ck["big.weight"]
        np.testing.assert_array_equal(big[:512], tensors["big.weight"][:512])  # chunks 0 and 1 are intact
        with pytest.raises(IntegrityError, match=r"chunk 2 of 3"):
            big[600]


def test_rewrite_keeping_size_and_mtime_is_caught(tmp_path):
    """The rewrite a file's size and mtime cannot show (``rsync --inplace -t`` of other bytes): another
    file's bytes copied in, mtime restored. Without a manifest it reads as the new bytes; with one it is
    named by verify and refused by checked reads."""
    rng = np.random.default_rng(3)
    tensors = {"w": (rng.standard_normal((8, 64)).astype(np.float32), "Q8_0"), "b": (np.ones(16, np.float32), "F32")}
    path = write_gguf(tmp_path / "m.gguf", tensors).path
    other = write_gguf(tmp_path / "other.gguf", {**tensors, "w": (rng.standard_normal((8, 64)).astype(np.float32), "Q8_0")}).path
    assert os.path.getsize(path) == os.path.getsize(other)
    with ckptfs.open(path) as ck:
        manifest = build_manifest(ck)
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(other.read_bytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(path).st_size, os.stat(path).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    with ckptfs.open(path) as ck:
        assert [m.tensor for m in verify(ck, manifest)] == [None, "w"]
    with ckptfs.open(path, manifest=manifest) as ck:
        with pytest.raises(IntegrityError, match="tensor 'w'"):
            ck["w"].numpy()
        with pytest.raises(IntegrityError, match=r"^[^']*tensor 'w': stored"):  # named once, still an IntegrityError
            ckptfs.load_batch(ck, ["b", "w"])
        np.testing.assert_array_equal(ck["b"].numpy(), np.ones(16, np.float32))


def test_manifest_of_another_checkpoint(tmp_path, mixed):
    _, manifest_path = mixed
    rng = np.random.default_rng(4)
    path = write_gguf(tmp_path / "mixed.gguf", {"only": (rng.standard_normal(32).astype(np.float32), "F32")}).path
    with ckptfs.open(path) as ck:
        mismatches = verify(ck, load_manifest(str(manifest_path)))
    whats = {(m.tensor, m.what.split(":")[0]) for m in mismatches}
    assert (None, f"size {os.path.getsize(path)} bytes, the manifest says {os.path.getsize(mixed[0].path)}") in whats
    assert ("only", "not in the manifest") in whats and ("q4_k.mat", "missing") in whats
    with pytest.raises(CheckpointError, match="the manifest does not describe this checkpoint") as info:
        ckptfs.open(path, manifest=manifest_path)
    assert "\n" not in str(info.value)


def run_verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ckptfs_cli(), "verify", *args], env=cli_env(), capture_output=True, text=True,
                          timeout=120)


def test_cli_exit_codes_and_json(tmp_path, mixed):
    written, manifest_path = mixed
    good = run_verify(str(written.path), "--manifest", str(manifest_path))
    assert (good.returncode, good.stdout) == (0, "") and "ok" in good.stderr
    path = tmp_path / "mixed.gguf"
    shutil.copyfile(written.path, path)
    offset = {n: o for n, o, _ in reference_tensors(path)}["q6_k.cube"]
    flip(path, offset + 3)
    bad = run_verify(str(path), "--manifest", str(manifest_path))
    assert bad.returncode == 3
    lines = bad.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("mixed.gguf: sha256 ")
    assert lines[1].startswith("mixed.gguf: tensor 'q6_k.cube': stored bytes differ from the manifest")
    as_json = run_verify(str(path), "--manifest", str(manifest_path), "--json")
    assert as_json.returncode == 3
    data = json.loads(as_json.stdout)
    assert data["ok"] is False
    assert [(m["file"], m["tensor"]) for m in data["mismatches"]] == [("mixed.gguf", None), ("mixed.gguf", "q6_k.cube")]
    assert json.loads(run_verify(str(written.path), "--manifest", str(manifest_path), "--json").stdout) == \
        {"ok": True, "mismatches": []}


def test_cli_errors_are_one_line(tmp_path, mixed):
    written, _ = mixed
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "ckptfs-manifest/1", "chunk_size": 1048576, "files": 3, "tensors": []}')
    result = run_verify(str(written.path), "--manifest", str(broken))
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "not a valid ckptfs manifest: files must be a list" in result.stderr
    missing = run_verify(str(tmp_path / "nope.gguf"))
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    usage = run_verify(str(written.path), "--no-such-option")
    assert usage.returncode == 2


def test_structure_without_a_manifest(tmp_path):
    rng = np.random.default_rng(6)
    tensors = {"x": (rng.standard_normal((4, 64)).astype(np.float32), "F32"),
               "y": (rng.standard_normal((2, 64)).astype(np.float32), "Q8_0"),
               "z": (rng.standard_normal(64).astype(np.float32), "F32")}
    path = write_gguf(tmp_path / "ok.gguf", tensors).path
    assert run_verify(str(path)).returncode == 0
    point_gguf_tensor_at(path, "y", "x")
    with ckptfs.open(path) as ck:
        (overlap,) = verify(ck)
    other = "x" if overlap.tensor == "y" else "y"  # both start at one offset: the shorter one is met first
    assert overlap.tensor in ("x", "y") and f"overlap those of tensor {other!r}" in overlap.what
    cut = write_gguf(tmp_path / "cut.gguf", tensors).path
    os.truncate(cut, os.path.getsize(cut) - 10)
    result = run_verify(str(cut))
    assert result.returncode == 3 and "tensor 'z': stored bytes" in result.stdout
    assert "lie past the end of the file" in result.stdout


class KnownHash(ByteSource):
    """A source that knows its content's sha256, as a Hub file knows its LFS oid (``content_id``)."""

    def __init__(self, inner: ByteSource, sha256: str):
        self.inner, self.name, self.size, self.identity = inner, inner.name, inner.size, inner.identity
        self._sha256 = sha256

    def pread(self, offset: int, size: int, *, scope: ReadScope = NOTHING_SAID) -> bytes:
        return self.inner.pread(offset, size, scope=scope)

    def content_id(self) -> str:
        return f"sha256:{self._sha256}"


@pytest.mark.parametrize("recorded", ["right", "wrong"])
def test_structure_checks_a_sha256_the_source_knows(tmp_path, recorded):
    path = write_mixed_gguf(tmp_path / "m.gguf").path
    truth = file_sha256(path)
    oid = truth if recorded == "right" else hashlib.sha256(b"other").hexdigest()
    ck = Checkpoint(read_checkpoint(str(path)), str(path), source_wrapper=lambda s: KnownHash(s, oid))
    with ck:
        mismatches = verify(ck)
    if recorded == "right":
        assert mismatches == []
    else:
        (m,) = mismatches
        assert (m.file, m.tensor) == ("m.gguf", None)
        assert m.what == f"sha256 {truth}, the source's recorded sha256 (LFS oid) is {oid}"
