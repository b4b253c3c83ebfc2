"""Multi-file checkpoints: shard folders, index files, split GGUF, model folders, HF cache snapshots, damage.

Every tensor is compared with the references (safetensors.numpy.load_file, gguf-py's GGUFReader and
dequantize) shard by shard; the decisions checked here are the ones docs/multifile.md states.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from multifile_sets import (MODEL_FILES, gguf_reference, gguf_tensors, hf_cache_layout, safetensors_reference,
                            safetensors_tensors, shard_name, write_gguf_by_hand, write_model_files,
                            write_safetensors_set, write_split_gguf)

import ckptfs
from ckptfs.commands.cli import main as cli_main
from ckptfs.core.errors import CheckpointError
from ckptfs.formats.multi import read_checkpoint
from ckptfs.tree.mount_tree import MountTree
from mount_expect import npy_bytes

INDEX = "model.safetensors.index.json"


def st_paths(folder: Path, n: int = 4, prefix: str = "model") -> list[str]:
    return [str(folder / shard_name(prefix, i, n, "safetensors")) for i in range(1, n + 1)]


def assert_safetensors_equal(ck: ckptfs.Checkpoint, paths: list[str]) -> None:
    """Every tensor, in shard order, equals the reference, points at its own shard and has its stored bytes."""
    ref = safetensors_reference(paths)
    assert [(t.name, t.info.source) for t in ck.tensors] == [(name, path) for name, _, path in ref]
    for tensor, (name, array, _) in zip(ck.tensors, ref):
        got = np.asarray(tensor)
        assert got.dtype == array.dtype and got.shape == array.shape, name
        assert got.tobytes() == array.tobytes(), name
        assert tensor.raw() == array.tobytes(), name


def assert_gguf_equal(ck: ckptfs.Checkpoint, paths: list[str]) -> None:
    ref = gguf_reference(paths)
    assert [(t.name, t.info.source) for t in ck.tensors] == [(name, path) for name, _, _, path in ref]
    for tensor, (name, values, stored, _) in zip(ck.tensors, ref):
        got = np.asarray(tensor)
        assert got.shape == values.shape, name
        assert got.tobytes() == values.astype(got.dtype).tobytes(), name
        assert tensor.raw() == stored, name


def info_text(src: str) -> str:
    result = CliRunner().invoke(cli_main, ["info", str(src)])
    assert result.exit_code == 0, result.output
    return result.output


def refusal(src) -> str:
    """The one-line error ``ckptfs info`` prints for ``src`` (exit 1, no traceback)."""
    result = CliRunner().invoke(cli_main, ["info", str(src)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1, result.output
    return lines[0]


def several(src) -> str:
    """The one-line refusal ``ckptfs.open`` raises for a folder of several checkpoints; ``ckptfs info`` lists
    them instead (exit 0: tests/fuse/test_mount_repository.py)."""
    with pytest.raises(CheckpointError) as info:
        ckptfs.open(src)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- sharded safetensors -------------------------------------------------------------------------------------

@pytest.fixture
def st_folder(tmp_path):
    folder = tmp_path / "model"
    write_safetensors_set(folder, safetensors_tensors(4))
    write_model_files(folder)
    return folder


def test_safetensors_folder_with_index(st_folder):
    with ckptfs.open(st_folder) as ck:
        assert ck.format == "safetensors"
        assert list(ck.files) == st_paths(st_folder)
        assert_safetensors_equal(ck, st_paths(st_folder))
        assert ck.notes == []
        index = json.loads((st_folder / INDEX).read_text())
        assert ck.metadata["total_size"] == index["metadata"]["total_size"]
        assert ck.metadata["format"] == "np"
        assert [ck.metadata[f"shard{i}"] for i in range(1, 5)] == ["1", "2", "3", "4"]
        expected = {name: str(st_folder / name) for name in MODEL_FILES} | {INDEX: str(st_folder / INDEX)}
        assert ck.passthrough == expected


def test_tensors_of_a_folder_pickle(st_folder):
    with ckptfs.open(st_folder) as ck:
        tensor = ck.tensors[-1]
        back = pickle.loads(pickle.dumps(tensor))  # reopens the folder, as a DataLoader worker would
        assert back.info == tensor.info
        assert np.asarray(back).tobytes() == np.asarray(tensor).tobytes()


def test_index_file_named_directly(st_folder):
    with ckptfs.open(st_folder / INDEX) as ck:
        assert list(ck.files) == st_paths(st_folder)
        assert_safetensors_equal(ck, st_paths(st_folder))
        assert set(ck.passthrough) == set(MODEL_FILES) | {INDEX}


def test_safetensors_folder_without_index(tmp_path):
    folder = tmp_path / "noindex"
    write_safetensors_set(folder, safetensors_tensors(4), index=False)
    with ckptfs.open(folder) as ck:
        assert list(ck.files) == st_paths(folder)
        assert_safetensors_equal(ck, st_paths(folder))
        assert ck.notes == [] and ck.passthrough == {}
        assert "total_size" not in ck.metadata and ck.metadata["shard3"] == "3"


def test_one_safetensors_shard_named_is_served_alone(st_folder):
    path = st_paths(st_folder)[1]
    with ckptfs.open(path) as ck:
        assert list(ck.files) == [path]
        assert_safetensors_equal(ck, [path])
        assert ck.passthrough == {}
        assert any("shard 2 of 4" in note and "folder" in note for note in ck.notes)


def test_index_metadata_wins_and_conflicts_are_noted(tmp_path):
    folder = tmp_path / "m"
    write_safetensors_set(folder, safetensors_tensors(2), index=False)
    weight_map = {name: os.path.basename(path) for name, _, path in safetensors_reference(st_paths(folder, 2))}
    index = {"metadata": {"format": "pt", "total_size": 1}, "weight_map": weight_map}
    (folder / INDEX).write_text(json.dumps(index))
    with ckptfs.open(folder) as ck:
        assert ck.metadata["format"] == "pt"
        assert any("'format'" in note and INDEX in note for note in ck.notes)


# --- split GGUF ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def split_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("split")
    paths = write_split_gguf(folder, gguf_tensors(7), per_shard=3)
    assert [p.name for p in paths] == [shard_name("model", i, 3, "gguf") for i in (1, 2, 3)]
    return folder


def split_paths(folder: Path, n: int = 3, prefix: str = "model") -> list[str]:
    return [str(folder / shard_name(prefix, i, n, "gguf")) for i in range(1, n + 1)]


@pytest.mark.parametrize("which", [0, 1, 2, "folder"])
def test_split_gguf_any_shard_or_folder_opens_the_set(split_folder, which):
    src = split_folder if which == "folder" else split_paths(split_folder)[which]
    with ckptfs.open(src) as ck:
        assert ck.format == "gguf" and ck.version == 3
        assert list(ck.files) == split_paths(split_folder)
        assert_gguf_equal(ck, split_paths(split_folder))
        assert len(ck.tensors) == 7 and ck.notes == []
        assert ck.metadata["general.name"] == "split test"  # shard 0's metadata, whichever shard was named
        assert ck.metadata["split.no"] == 0 and ck.metadata["split.count"] == 3
        assert ck.metadata["split.tensors.count"] == 7
        assert ck.passthrough == {}


def test_split_gguf_with_an_empty_first_shard(tmp_path):
    paths = write_split_gguf(tmp_path, gguf_tensors(4), per_shard=2, small_first_shard=True)
    assert len(paths) == 3
    with ckptfs.open(paths[2]) as ck:
        assert list(ck.files) == [str(p) for p in paths]
        assert_gguf_equal(ck, [str(p) for p in paths])
        assert ck.metadata["general.name"] == "split test" and ck.notes == []


def test_split_gguf_folder_with_model_files_passes_them_through(tmp_path):
    write_split_gguf(tmp_path, gguf_tensors(4), per_shard=2)
    write_model_files(tmp_path)
    (tmp_path / ".hidden").write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "config.json").write_text("{}")
    with ckptfs.open(tmp_path) as ck:
        assert ck.passthrough == {name: str(tmp_path / name) for name in MODEL_FILES}
    with ckptfs.open(tmp_path / shard_name("model", 1, 2, "gguf")) as ck:
        assert ck.passthrough == {}


# --- model folders, pass-through, HF cache snapshots ---------------------------------------------------------

def test_passthrough_names_in_the_tree_and_clashes(st_folder):
    (st_folder / "metadata.json").write_text('{"mine": 1}')
    with ckptfs.open(st_folder) as ck:
        tree = MountTree(ck)
        for name in MODEL_FILES:
            view = tree.view(name)
            data = MODEL_FILES[name]
            assert view.size == len(data) and view.read(0, len(data) + 10) == data
        clash = tree.view("metadata~2.json")
        assert clash.read(0, 100) == b'{"mine": 1}'
        assert json.loads(tree.view("metadata.json").read(0, 1 << 20))["total_size"] > 0
        assert tree.view(INDEX).read(0, 1 << 20) == (st_folder / INDEX).read_bytes()


def test_hf_cache_snapshot_safetensors(st_folder, tmp_path):
    snapshot = hf_cache_layout(tmp_path / "cache", st_folder)
    assert os.path.islink(snapshot / INDEX)
    with ckptfs.open(snapshot) as ck:
        paths = st_paths(snapshot)
        assert list(ck.files) == paths
        assert_safetensors_equal(ck, paths)  # sources are the snapshot's link paths, not the blobs
        assert ck.passthrough == {name: str(snapshot / name) for name in list(MODEL_FILES) + [INDEX]}
        assert ck.notes == []


def test_hf_cache_snapshot_split_gguf_found_by_link_names(split_folder, tmp_path):
    snapshot = hf_cache_layout(tmp_path / "cache", split_folder)
    for shard in split_paths(snapshot):
        with ckptfs.open(shard) as ck:
            assert list(ck.files) == split_paths(snapshot)
            assert_gguf_equal(ck, split_paths(snapshot))


def test_relative_paths_stay_relative(split_folder, monkeypatch):
    monkeypatch.chdir(split_folder)
    with ckptfs.open(shard_name("model", 2, 3, "gguf")) as ck:
        assert list(ck.files) == [shard_name("model", i, 3, "gguf") for i in (1, 2, 3)]
    with ckptfs.open(".") as ck:
        assert list(ck.files) == [os.path.join(".", shard_name("model", i, 3, "gguf")) for i in (1, 2, 3)]


def test_trailing_slashes_on_a_folder(split_folder, st_folder):
    with ckptfs.open(f"{split_folder}//") as ck:
        assert list(ck.files) == split_paths(split_folder) and ck.notes == []
    with ckptfs.open(f"{st_folder}/") as ck:
        assert list(ck.files) == st_paths(st_folder) and ck.notes == []


# --- choosing among candidates -------------------------------------------------------------------------------

def test_several_quantizations_and_mmproj_are_refused_with_the_list(tmp_path):
    for name in ("model-Q4_K_M.gguf", "model-Q8_0.gguf", "mmproj-model-f16.gguf"):
        write_gguf_by_hand(tmp_path / name, gguf_tensors(1), split=None)
    write_split_gguf(tmp_path / "x", gguf_tensors(4), per_shard=2, prefix="model-F16")
    for p in (tmp_path / "x").iterdir():
        p.rename(tmp_path / p.name)
    line = several(tmp_path)
    for label in ("model-Q4_K_M.gguf", "model-Q8_0.gguf", "mmproj-model-f16.gguf",
                  "model-F16-NNNNN-of-00002.gguf (2 of 2 files)", "name one file"):
        assert label in line
    with ckptfs.open(tmp_path / "model-Q8_0.gguf") as ck:
        assert len(ck.tensors) == 1 and ck.passthrough == {}


def test_consolidated_beside_shards_without_index_is_refused(tmp_path):
    write_safetensors_set(tmp_path, safetensors_tensors(2), index=False)
    shutil.copy(st_paths(tmp_path, 2)[0], tmp_path / "consolidated.safetensors")
    line = several(tmp_path)
    assert "consolidated.safetensors" in line and "model-NNNNN-of-00002.safetensors (2 of 2 files)" in line


def test_index_wins_over_other_checkpoint_files(st_folder):
    shutil.copy(st_paths(st_folder)[0], st_folder / "consolidated.safetensors")
    write_gguf_by_hand(st_folder / "model-Q4_0.gguf", gguf_tensors(1), split=None)
    with ckptfs.open(st_folder) as ck:
        assert list(ck.files) == st_paths(st_folder)
        assert "consolidated.safetensors" not in ck.passthrough and "model-Q4_0.gguf" not in ck.passthrough
        assert any("consolidated.safetensors" in n and "model-Q4_0.gguf" in n for n in ck.notes)


def test_two_index_files_are_refused(st_folder):
    shutil.copy(st_folder / INDEX, st_folder / "other.safetensors.index.json")
    line = several(st_folder)
    assert INDEX in line and "other.safetensors.index.json" in line
    with ckptfs.open(st_folder / INDEX) as ck:  # naming one works; the other is noted, not passed through
        assert "other.safetensors.index.json" not in ck.passthrough
        assert any("other.safetensors.index.json" in n for n in ck.notes)


def test_folder_without_checkpoint_and_missing_path(tmp_path):
    write_model_files(tmp_path)
    assert "holds no checkpoint" in refusal(tmp_path)
    assert "no such file" in refusal(tmp_path / "nope.gguf")


def test_single_file_folder(tmp_path):
    write_gguf_by_hand(tmp_path / "only.gguf", gguf_tensors(3), split=None)
    write_model_files(tmp_path)
    with ckptfs.open(tmp_path) as ck:
        assert list(ck.files) == [str(tmp_path / "only.gguf")]
        assert_gguf_equal(ck, [str(tmp_path / "only.gguf")])
        assert set(ck.passthrough) == set(MODEL_FILES)


# --- damage: sharded safetensors ----------------------------------------------------------------------------

def test_shard_named_by_index_missing_is_served_around(st_folder):
    missing = st_paths(st_folder)[2]
    lost = sorted(name for name, file in json.loads((st_folder / INDEX).read_text())["weight_map"].items()
                  if file == os.path.basename(missing))
    os.remove(missing)
    present = [p for p in st_paths(st_folder) if p != missing]
    with ckptfs.open(st_folder) as ck:
        assert list(ck.files) == present
        assert_safetensors_equal(ck, present)
        assert not set(lost) & set(ck)
        [note] = [n for n in ck.notes if "missing" in n]
        assert os.path.basename(missing) in note and f"{len(lost)} tensor(s)" in note
        assert all(repr(name) in note for name in lost)
    text = info_text(st_folder)
    assert f"note: shard {os.path.basename(missing)} named by the index is missing" in text


def test_all_shards_missing_is_refused(st_folder):
    for path in st_paths(st_folder):
        os.remove(path)
    assert "none of the 4 shard files exist" in refusal(st_folder)


def test_index_claims_that_shards_contradict(tmp_path):
    shards = safetensors_tensors(3)
    names = [list(s) for s in shards]
    files = [shard_name("model", i, 3, "safetensors") for i in (1, 2, 3)]
    weight_map = {name: files[i] for i, group in enumerate(names) for name in group}
    weight_map["ghost.weight"] = files[1]                 # named, stored nowhere
    weight_map[names[2][0]] = files[0]                    # stored in shard 3, index says shard 1
    del weight_map[names[1][1]]                           # stored, not named
    write_safetensors_set(tmp_path, shards, weight_map=weight_map)
    with ckptfs.open(tmp_path) as ck:
        assert_safetensors_equal(ck, st_paths(tmp_path, 3))
        notes = "\n".join(ck.notes)
        assert "1 tensor(s) named by the index are not in their shard" in notes and "'ghost.weight'" in notes
        assert f"{names[2][0]!r} (index: {files[0]}; stored in {files[2]})" in notes
        assert f"not named by the index (served): {names[1][1]!r} ({files[1]})" in notes
        assert len(ck.notes) == 3


def test_tensor_in_two_shards_is_listed_twice(tmp_path):
    shards = safetensors_tensors(2)
    dup = next(iter(shards[0]))
    shards[1][dup] = np.arange(6, dtype=np.int16)
    write_safetensors_set(tmp_path, shards, index=False)
    with ckptfs.open(tmp_path) as ck:
        assert_safetensors_equal(ck, st_paths(tmp_path, 2))
        copies = [t for t in ck.tensors if t.name == dup]
        assert [t.info.source for t in copies] == st_paths(tmp_path, 2)
        assert ck[dup] is copies[0]
        assert np.array_equal(np.asarray(copies[1]), np.arange(6, dtype=np.int16))
        [note] = ck.notes
        assert "more than one shard" in note and repr(dup) in note
        tree = MountTree(ck)
        stem = dup.replace("/", "%2F")
        assert tree.view(f"{stem}~2.npy").read(0, 1 << 16) == npy_bytes(np.arange(6, dtype=np.int16))


def test_missing_numbered_shard_without_index(tmp_path):
    write_safetensors_set(tmp_path, safetensors_tensors(4), index=False)
    os.remove(st_paths(tmp_path)[0])
    with ckptfs.open(tmp_path) as ck:
        assert list(ck.files) == st_paths(tmp_path)[1:]
        assert ck.notes == [f"shard {shard_name('model', 1, 4, 'safetensors')} is missing: its tensors are not served"]


@pytest.mark.parametrize("doc, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"metadata": {}}', 'no "weight_map"'),
    ('{"weight_map": {}}', "is empty"),
    ('{"weight_map": {"a": 3}}', "is not a file name"),
    ('{"weight_map": {"a": "../../etc/passwd"}}', "outside the index's folder"),
    ('{"weight_map": {"a": "/etc/passwd"}}', "outside the index's folder"),
])
def test_bad_index_is_refused(tmp_path, doc, message):
    (tmp_path / INDEX).write_text(doc)
    line = refusal(tmp_path / INDEX)
    assert message in line and INDEX in line


def test_index_naming_a_gguf_file_is_refused(tmp_path):
    write_gguf_by_hand(tmp_path / "w.gguf", gguf_tensors(1), split=None)
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {"blk.0.weight": "w.gguf"}}))
    assert "is a gguf file, but the sharded checkpoint is safetensors" in refusal(tmp_path)


def test_bad_index_metadata_is_noted(st_folder):
    doc = json.loads((st_folder / INDEX).read_text())
    doc["metadata"] = [1, 2]
    (st_folder / INDEX).write_text(json.dumps(doc))
    with ckptfs.open(st_folder) as ck:
        assert ck.notes == ['index "metadata" is a list, not an object: ignored']


# --- damage: split GGUF -------------------------------------------------------------------------------------

@pytest.fixture
def split_copy(split_folder, tmp_path):
    folder = tmp_path / "split"
    shutil.copytree(split_folder, folder)
    return folder


def test_split_gguf_missing_middle_shard(split_copy):
    paths = split_paths(split_copy)
    os.remove(paths[1])
    with ckptfs.open(paths[2]) as ck:
        assert list(ck.files) == [paths[0], paths[2]]
        assert_gguf_equal(ck, [paths[0], paths[2]])
        assert ck.notes == [f"split GGUF shard {os.path.basename(paths[1])} is missing: its tensors are not served",
                            "split.tensors.count says 7 tensors, the 2 present shards hold 4"]
    assert "note: split GGUF shard" in info_text(paths[0])


def test_split_gguf_missing_first_shard(split_copy):
    paths = split_paths(split_copy)
    os.remove(paths[0])
    with ckptfs.open(split_copy) as ck:
        assert list(ck.files) == paths[1:]
        assert_gguf_equal(ck, paths[1:])
        assert "general.name" not in ck.metadata and ck.metadata["split.no"] == 1
        assert any("first shard" in n and "holds the model's metadata" in n for n in ck.notes)


def test_split_gguf_shard_from_another_set_is_refused(split_copy, tmp_path):
    other = write_split_gguf(tmp_path / "other", gguf_tensors(8), per_shard=3)  # also 3 shards, 8 tensors
    shutil.copy(other[1], split_paths(split_copy)[1])
    line = refusal(split_paths(split_copy)[0])
    assert "says 8 tensors in all" in line and "different split sets" in line


def test_split_gguf_count_mismatch_is_refused(split_copy):
    paths = split_paths(split_copy)
    write_gguf_by_hand(Path(paths[1]), gguf_tensors(2), split=(1, 4, 7))
    assert "split keys say shard 2 of 4" in refusal(paths[0])


def test_split_gguf_wrong_number_is_refused(split_copy):
    paths = split_paths(split_copy)
    write_gguf_by_hand(Path(paths[1]), gguf_tensors(2), split=(2, 3, 7))
    assert "is named shard 2 of 3 but its split keys say shard 3 of 3" in refusal(paths[2])


def test_split_gguf_sibling_without_split_keys_or_not_gguf(split_copy, tmp_path):
    paths = split_paths(split_copy)
    write_gguf_by_hand(Path(paths[2]), gguf_tensors(2), split=None)
    assert "no split.count key" in refusal(paths[0])
    write_safetensors_set(tmp_path / "st", safetensors_tensors(1), index=False)
    shutil.copy(st_paths(tmp_path / "st", 1)[0], paths[2])
    assert "is a safetensors file, but a split GGUF is gguf" in refusal(paths[0])


def test_split_tensors_count_disagreeing_is_noted(tmp_path):
    tensors = gguf_tensors(5)
    paths = [tmp_path / shard_name("m", i, 2, "gguf") for i in (1, 2)]
    write_gguf_by_hand(paths[0], tensors[:2], split=(0, 2, 9), extra={"general.name": "hand"})
    write_gguf_by_hand(paths[1], tensors[2:], split=(1, 2, 9))
    with ckptfs.open(paths[1]) as ck:
        assert_gguf_equal(ck, [str(p) for p in paths])
        assert ck.notes == ["split.tensors.count says 9 tensors, all shards hold 5"]
        assert ck.metadata["general.name"] == "hand"


def test_split_gguf_duplicate_across_shards(tmp_path):
    tensors = gguf_tensors(3)
    paths = [tmp_path / shard_name("m", i, 2, "gguf") for i in (1, 2)]
    write_gguf_by_hand(paths[0], tensors[:2], split=(0, 2, 4))
    write_gguf_by_hand(paths[1], [tensors[0], tensors[2]], split=(1, 2, 4))
    with ckptfs.open(tmp_path) as ck:
        assert_gguf_equal(ck, [str(p) for p in paths])
        assert [t.name for t in ck.tensors].count(tensors[0][0]) == 2
        assert len(ck.notes) == 1 and "more than one shard" in ck.notes[0]
        assert f"{tensors[0][0]}~2.raw" in MountTree(ck)


def test_renamed_split_shard_is_served_alone(split_copy):
    renamed = split_copy / "renamed.gguf"
    os.rename(split_paths(split_copy)[1], renamed)
    with ckptfs.open(renamed) as ck:
        assert list(ck.files) == [str(renamed)]
        assert_gguf_equal(ck, [str(renamed)])
        assert any("siblings cannot be found" in n for n in ck.notes)


def test_shard_name_without_split_keys(tmp_path):
    path = tmp_path / shard_name("m", 1, 2, "gguf")
    write_gguf_by_hand(path, gguf_tensors(2), split=None)
    with ckptfs.open(path) as ck:
        assert list(ck.files) == [str(path)] and any("no split keys" in n for n in ck.notes)
    write_gguf_by_hand(tmp_path / shard_name("m", 2, 2, "gguf"), gguf_tensors(2), split=None)
    assert "does not form a split set" in refusal(tmp_path)


@pytest.mark.parametrize("keys, message", [((3, 3, 7), "split.no = 3 with split.count = 3 is impossible"),
                                           ((0, 0, 7), "split.no = 0 with split.count = 0 is impossible")])
def test_impossible_split_keys_are_refused(tmp_path, keys, message):
    path = tmp_path / "x.gguf"
    write_gguf_by_hand(path, gguf_tensors(1), split=keys)
    assert message in refusal(path)


# --- bounded resources ---------------------------------------------------------------------------------------

def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to count descriptors")
def test_two_hundred_shards_bounded_descriptors(tmp_path):
    rng = np.random.default_rng(7)
    shards = [{f"layer.{i}.w": rng.standard_normal((2, 3)).astype(np.float32)} for i in range(200)]
    write_safetensors_set(tmp_path, shards)
    before = open_fds()
    parsed = read_checkpoint(str(tmp_path))
    assert open_fds() == before  # headers read, every file closed again
    assert len(parsed.files) == 200 and len(parsed.tensors) == 200
    with ckptfs.open(tmp_path, max_open_files=16) as ck:
        for tensor, shard in zip(ck.tensors, shards):
            assert np.asarray(tensor).tobytes() == shard[tensor.name].tobytes()
            assert ck.sources.open_count() <= 16
        assert open_fds() <= before + 16
    assert open_fds() == before
