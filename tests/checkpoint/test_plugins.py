"""The plug-in seams: a new byte source or file kind is one module plus registration, and nothing else
changes.

- ``memsource.py`` (a dict of bytes registered as ``mem://``) drives the GGUF, safetensors and multi-file
  readers and a real mount; values are checked against gguf-py and safetensors, not against ckptfs.
- A file-kind provider adds a folder to a mount tree.
- An unknown URL scheme is one line.
"""

from __future__ import annotations

import os
import sys

import memsource
import numpy as np
import pytest
from conftest import REPO
from fixtures import write_mixed_gguf
from multifile_sets import (gguf_reference, gguf_tensors, safetensors_reference, safetensors_tensors,
                            write_model_files, write_safetensors_set, write_split_gguf)

import ckptfs
from ckptfs.core.errors import CheckpointError
from ckptfs.engine.views import BytesView
from ckptfs.fuse.operations import CkptOperations
from ckptfs.tree.mount_tree import Entry, MountTree


@pytest.fixture
def mem_store(tmp_path):
    """A folder of real checkpoints written by the references, then loaded into the in-memory store."""
    root = tmp_path / "objects"
    root.mkdir()
    memsource.STORE.clear()
    memsource.register()
    yield root
    memsource.STORE.clear()


def _assert_same(ck, reference):
    """``reference``: (name, values, file) triples written by a reference library."""
    assert sorted(ck) == sorted(name for name, *_ in reference)
    for name, values, *_ in reference:
        _assert_equal(np.asarray(ck[name]), values, name)


def _assert_equal(got, values, name):
    """Bit for bit where the dtypes agree (NaNs included); else value for value in ckptfs's dtype."""
    assert got.shape == values.shape, name
    if got.dtype == values.dtype:
        assert got.tobytes() == np.ascontiguousarray(values).tobytes(), name
    else:
        np.testing.assert_array_equal(got, values.astype(got.dtype), err_msg=name)


def test_a_gguf_from_memory_reads_as_gguf_py_wrote_it(mem_store):
    written = write_mixed_gguf(mem_store / "model.gguf")
    memsource.load_dir(str(mem_store))
    with ckptfs.open("mem://model.gguf") as ck:
        assert ck.format == "gguf"
        assert ck.files == ("mem://model.gguf",)
        for name, ref in written.tensors.items():
            t = ck[name]
            assert t.raw() == ref.raw, name
            if ref.array is not None:
                np.testing.assert_array_equal(np.asarray(t), ref.array, err_msg=name)
        assert ck.metadata.keys() >= written.metadata.keys()
        assert ck.content_id.startswith("sha256:")


def test_a_safetensors_folder_from_memory_is_discovered_through_the_folder_protocol(mem_store):
    folder = mem_store / "model"
    shards = safetensors_tensors(3)
    write_safetensors_set(folder, shards)
    write_model_files(folder)
    memsource.load_dir(str(mem_store))
    paths = sorted(str(p) for p in folder.glob("*.safetensors"))
    with ckptfs.open("mem://model") as ck:
        assert ck.format == "safetensors"
        assert all(f.startswith("mem://model/") for f in ck.files) and len(ck.files) == 3
        assert "config.json" in ck.passthrough and "model.safetensors.index.json" in ck.passthrough
        _assert_same(ck, safetensors_reference(paths))


def test_a_split_gguf_from_memory_brings_its_siblings(mem_store):
    folder = mem_store / "split"
    tensors = gguf_tensors(7)
    write_split_gguf(folder, tensors, per_shard=3)
    memsource.load_dir(str(mem_store))
    paths = sorted(str(p) for p in folder.glob("*.gguf"))
    first = "mem://split/" + os.path.basename(paths[0])
    with ckptfs.open(first) as ck:
        assert len(ck.files) == len(paths)
        _assert_same(ck, [(name, values, path) for name, values, _raw, path in gguf_reference(paths)])


def test_a_real_mount_serves_a_memory_source(mem_store, mounted):
    folder = mem_store / "model"
    shards = safetensors_tensors(2)
    write_safetensors_set(folder, shards)
    write_model_files(folder)
    reference = safetensors_reference(sorted(str(p) for p in folder.glob("*.safetensors")))
    cli = [sys.executable, "-m", "memsource", str(mem_store)]
    mnt = mounted("mem://model", cli=cli, env={"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])})
    for path in folder.iterdir():  # the daemon loaded the bytes at start: the files may go
        path.unlink()
    for name, values, _ in reference:
        _assert_equal(np.load(mnt / f"{name}.npy"), values, name)
    assert (mnt / "config.json").read_bytes() == memsource_model_file("config.json")


def memsource_model_file(name: str) -> bytes:
    from multifile_sets import MODEL_FILES
    return MODEL_FILES[name]


def test_a_file_kind_is_one_provider_and_may_add_a_folder(tmp_path):
    write_mixed_gguf(tmp_path / "model.gguf")

    def names_file(ck):
        yield Entry("extra/names.txt", "file", lambda: BytesView(lambda: "\n".join(ck).encode()))

    with ckptfs.open(tmp_path / "model.gguf") as ck:
        tree = MountTree(ck, extra=[names_file])
        ops = CkptOperations(tree)
        assert "extra" in ops.readdir("/", 0)
        assert ops.readdir("/extra", 0) == [".", "..", "names.txt"]
        assert ops.getattr("/extra")["st_mode"] & 0o040000
        fh = ops.open("/extra/names.txt", os.O_RDONLY)
        assert ops.read("/extra/names.txt", 1 << 20, 0, fh).decode().split("\n") == list(ck)
        assert tree.kind("extra/names.txt") == "file" and tree.kind("metadata.json") == "json"
        with pytest.raises(OSError):
            ops.open("/extra", os.O_RDONLY)


def test_an_unknown_scheme_is_one_line():
    with pytest.raises(CheckpointError, match="unknown source scheme 'nope'"):
        ckptfs.open("nope://x/model.gguf")
