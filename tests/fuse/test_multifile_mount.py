"""Real FUSE mounts of multi-file checkpoints: one tree per set, every file byte-exact.

A 4-shard safetensors model folder (index, config and tokenizer files) and a 3-way split GGUF (mounted by
naming its middle shard) are mounted with the real CLI; every ``.npy`` must equal ``np.save`` of the
reference array, every ``.raw`` the stored bytes, every pass-through file the original.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from mount_expect import npy_bytes
from multifile_sets import (MODEL_FILES, gguf_reference, gguf_tensors, safetensors_reference, safetensors_tensors,
                            shard_name, write_model_files, write_safetensors_set, write_split_gguf)

INDEX = "model.safetensors.index.json"


def read(path: Path) -> bytes:
    data = path.read_bytes()
    assert os.stat(path).st_size == len(data), path
    return data


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stmodel")
    write_safetensors_set(folder, safetensors_tensors(4))
    write_model_files(folder)
    return folder


@pytest.fixture(scope="module")
def split_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("split")
    write_split_gguf(folder, gguf_tensors(7), per_shard=3)
    return folder


def test_safetensors_model_folder_mounts_as_one_tree(st_folder, module_mounted):
    mnt = module_mounted(st_folder)
    shards = [str(st_folder / shard_name("model", i, 4, "safetensors")) for i in range(1, 5)]
    ref = safetensors_reference(shards)
    expected = {"metadata.json", INDEX, *MODEL_FILES, *(os.path.basename(s) for s in shards)}
    for name, _, _ in ref:
        expected |= {f"{name}.npy", f"{name}.raw", f"{name}.meta.json"}
    assert set(os.listdir(mnt)) == expected
    for name, array, shard in ref:
        assert read(mnt / f"{name}.npy") == npy_bytes(array), name
        assert read(mnt / f"{name}.raw") == array.tobytes(), name
        meta = json.loads(read(mnt / f"{name}.meta.json"))
        assert meta["name"] == name and meta["source"] == shard and meta["damaged"] is None
    for name, data in MODEL_FILES.items():
        assert read(mnt / name) == data, name
    assert read(mnt / INDEX) == (st_folder / INDEX).read_bytes()
    for shard in shards:  # the original shards pass through too: the mount is a loadable model folder
        assert read(mnt / os.path.basename(shard)) == Path(shard).read_bytes()
    metadata = json.loads(read(mnt / "metadata.json"))
    assert metadata["total_size"] == json.loads((st_folder / INDEX).read_text())["metadata"]["total_size"]
    assert metadata["format"] == "np"
    loaded = np.load(mnt / f"{ref[1][0]}.npy", mmap_mode="r")
    assert np.array_equal(loaded, ref[1][1])


def test_split_gguf_mounts_as_one_tree_from_any_shard(split_folder, module_mounted):
    shards = [str(split_folder / shard_name("model", i, 3, "gguf")) for i in (1, 2, 3)]
    mnt = module_mounted(shards[1])
    ref = gguf_reference(shards)
    assert len(ref) == 7
    expected = {"metadata.json", "model.gguf"}  # model.gguf: the set as one GGUF (tests/ggufmerge/test_gguf_merge.py)
    expected |= {os.path.basename(s) for s in shards}  # and the shards themselves, passed through
    for name, _, _, _ in ref:
        expected |= {f"{name}.npy", f"{name}.raw", f"{name}.meta.json"}
    assert set(os.listdir(mnt)) == expected
    for shard in shards:
        assert read(mnt / os.path.basename(shard)) == Path(shard).read_bytes()
    for name, values, stored, shard in ref:
        assert read(mnt / f"{name}.npy") == npy_bytes(values), name
        assert read(mnt / f"{name}.raw") == stored, name
        assert json.loads(read(mnt / f"{name}.meta.json"))["source"] == shard
    metadata = json.loads(read(mnt / "metadata.json"))
    assert metadata["general.name"] == "split test" and metadata["split.count"] == 3
