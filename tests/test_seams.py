"""The seams the second wave plugs into: a new byte source, cache tier and file kind are each one module plus
registration, and nothing else changes.

- ``memsource.py`` (a dict of bytes registered as ``mem://``) drives the GGUF, safetensors and multi-file
  readers and a real mount; values are checked against gguf-py and safetensors, not against ckptfs.
- A fake lower cache tier (a dict) is used by the block engine: decoded groups go to it keyed by content
  identity, and a second checkpoint is served from it without decoding.
- A file-kind provider adds a folder to a mount tree.
- Pickled tensors carry the checkpoint's content identity; lifecycle: ``destroy`` closes everything.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import ckptfs
import memsource
from ckptfs.cache.tiered import BlockCache, CacheTier, TieredCache
from ckptfs.checkpoint.api import Checkpoint
from ckptfs.core.errors import CheckpointError
from ckptfs.formats.multi import read_checkpoint
from ckptfs.fs.operations import CkptOperations
from ckptfs.tree.mount_tree import Entry, MountTree
from ckptfs.engine.views import BytesView
from conftest import REPO
from fixtures import write_mixed_gguf
from multifile_sets import (gguf_reference, gguf_tensors, safetensors_reference, safetensors_tensors,
                            write_model_files, write_safetensors_set, write_split_gguf)


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


class DictTier(CacheTier):
    """A fake shared tier: a dict, with the counters the protocol asks for."""

    name = "fake"

    def __init__(self):
        self.entries: dict[str, np.ndarray] = {}
        self.hits = self.misses = 0

    def get(self, key):
        value = self.entries.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key, value):
        self.entries[key] = np.array(value)

    def contains(self, key):
        return key in self.entries

    def stats(self):
        return {"hits": self.hits, "misses": self.misses, "bytes": sum(v.nbytes for v in self.entries.values())}


def _open_with_tiers(path, *tiers) -> Checkpoint:
    """A checkpoint whose cache is built outside it, as the tier factories do."""
    return Checkpoint(read_checkpoint(str(path)), str(path), cache=TieredCache([BlockCache(1 << 20), *tiers]))


def test_a_lower_tier_gets_decoded_groups_and_serves_another_checkpoint_without_decoding(tmp_path):
    written = write_mixed_gguf(tmp_path / "model.gguf")
    name = next(n for n, r in written.tensors.items() if r.storage_type == "Q4_K")
    shared = DictTier()
    with _open_with_tiers(tmp_path / "model.gguf", shared) as ck:
        rows = ck[name].shape[0]
        ck[name].data.read(0, ck[name].size)  # through the cache, group by group
        assert shared.entries and all(key.startswith(ck.content_id + "|") for key in shared.entries)
        assert ck.cache.decoded_bytes > 0
    with _open_with_tiers(tmp_path / "model.gguf", shared) as again:
        data = again[name].data
        values = data.read(0, again[name].size)
        assert again.cache.decoded_bytes == 0 and shared.hits > 0
        assert again.cache.tier_stats()["fake"]["hits"] == shared.hits
        np.testing.assert_array_equal(values.reshape(rows, -1), written.tensors[name].array.reshape(rows, -1))
        # promoted: the same read again is a memory hit, not another lower-tier lookup
        hits = shared.hits
        data.read(0, again[name].size)
        assert shared.hits == hits


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


def test_destroy_closes_the_sources_and_the_tiers(tmp_path):
    write_mixed_gguf(tmp_path / "model.gguf")
    closed = []
    tier = DictTier()
    tier.close = lambda: closed.append(True)
    ck = _open_with_tiers(tmp_path / "model.gguf", tier)
    ops = CkptOperations(MountTree(ck))
    assert ck.sources.open_count() == 1
    ops.destroy("/")
    assert ck.sources.open_count() == 0 and closed == [True]


def test_a_pickled_tensor_refuses_a_checkpoint_replaced_since(tmp_path):
    """Issue 11 item 3: the pickle carries the content identity; a replaced file is an error, not another
    tensor served silently under the old index."""
    path = tmp_path / "model.gguf"
    write_mixed_gguf(path)
    with ckptfs.open(path) as ck:
        blob = pickle.dumps(ck.tensors[1])
    replaced = tmp_path / "other.gguf"
    tensors = gguf_tensors(3, seed=9)
    from multifile_sets import write_gguf_by_hand
    write_gguf_by_hand(replaced, tensors, split=None)
    os.replace(replaced, path)
    code = ("import pickle, sys\n"
            "try:\n    pickle.loads(sys.stdin.buffer.read())\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc); sys.exit(3)\n")
    result = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 3, result.stdout + result.stderr
    assert b"CheckpointError" in result.stdout and b"changed since this tensor was pickled" in result.stdout


def test_a_pickled_tensor_still_unpickles_while_the_checkpoint_is_unchanged(tmp_path):
    path = tmp_path / "model.gguf"
    written = write_mixed_gguf(path)
    with ckptfs.open(path) as ck:
        t = ck.tensors[1]
        blob = pickle.dumps(t)
    back = pickle.loads(blob)
    assert back.name == t.name
    ref = written.tensors[t.name]
    if ref.array is not None:
        np.testing.assert_array_equal(np.asarray(back), ref.array)


def test_an_unknown_scheme_is_one_line():
    with pytest.raises(CheckpointError, match="unknown source scheme 'nope'"):
        ckptfs.open("nope://x/model.gguf")


def test_decode_backends_are_chosen_per_call_and_decode_into_writes_in_place():
    from ckptfs.quant import codec_for, known_types
    from ckptfs.quant.native import native_types
    from fixtures import GGML_GEOMETRY, random_blocks

    rng = np.random.default_rng(3)
    if not native_types():
        pytest.skip("the C kernels are not built here")  # setup.sh builds them; the numpy path is tested anyway
    for name in sorted(native_types()):
        codec = codec_for(name)
        blocks = random_blocks(name, 5, rng)
        reference = codec.dequantize(blocks, backend="numpy")
        native = codec.dequantize(blocks, backend="native")
        assert reference.tobytes() == native.tobytes(), name
        out = np.full(5 * codec.block_elements, np.nan, codec.dtype)
        assert codec.dequantize_into(blocks, out) is out and out.tobytes() == reference.tobytes(), name
    plain = next(t for t in known_types()
                 if t in GGML_GEOMETRY and t not in native_types() and not codec_for(t).exact)
    with pytest.raises(ValueError, match="no native kernel"):
        codec_for(plain).dequantize(random_blocks(plain, 1, rng), backend="native")
    with pytest.raises(ValueError, match="unknown decode backend"):
        codec_for("Q8_0").dequantize(random_blocks("Q8_0", 1, rng), backend="gpu")
