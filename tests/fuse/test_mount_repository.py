"""Repository mounts: a folder (local, ``s3://BUCKET/PREFIX/``, ``hf://ORG/REPO``) holding several checkpoints
mounts whole (docs/guide/local.md, "Repositories").

Every file of the folder is at the root, byte for byte (sha256 against the original); each checkpoint's views
are in a folder of its own named from it (a file's stem, a split set's prefix; a clash numbered ``~2``), with
values equal to gguf-py's and safetensors' reading of the originals. Checkpoints open lazily: after the mount
and an ``ls -l`` of the root none is open; reading one opens that one alone. A checkpoint's file at the root
and its views share one reader (one descriptor in the daemon). A damaged checkpoint costs its folder (EIO),
never the files. A folder with one checkpoint keeps the flat layout. ``ckptfs info`` lists the checkpoints
and ``ckptfs.open`` of such a folder still refuses, naming each.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import ckptfs_cli, cli_env, mount_stats, require_fuse
from multifile_sets import gguf_reference, gguf_tensors, write_gguf_by_hand, write_split_gguf
from safetensors.numpy import load_file, save_file
from mount_expect import check_same_file, descriptors_on, npy_bytes

import ckptfs
from ckptfs.core.errors import CheckpointError

README = b"# several quantizations\n"
CONFIG = b'{"architectures": ["LlamaForCausalLM"]}\n'


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_repository(folder: Path) -> dict[str, list[Path]]:
    """Two quantizations, a split set, an mmproj file, a safetensors model, README and config: the
    checkpoints' folder names -> their files."""
    folder.mkdir(parents=True, exist_ok=True)
    write_gguf_by_hand(folder / "m-Q4_0.gguf", gguf_tensors(3, seed=1), split=None)
    write_gguf_by_hand(folder / "m-Q8_0.gguf", gguf_tensors(4, seed=2), split=None)
    shards = write_split_gguf(folder, gguf_tensors(5, seed=3), per_shard=2, prefix="m-F16")
    write_gguf_by_hand(folder / "mmproj-m-f16.gguf", gguf_tensors(1, seed=4), split=None)
    rng = np.random.default_rng(5)
    save_file({"lm_head.weight": rng.standard_normal((8, 16)).astype(np.float32),
               "embed.weight": rng.integers(-5, 5, (4, 4)).astype(np.int32)}, str(folder / "model.safetensors"))
    (folder / "README.md").write_bytes(README)
    (folder / "config.json").write_bytes(CONFIG)
    return {"m-Q4_0": [folder / "m-Q4_0.gguf"], "m-Q8_0": [folder / "m-Q8_0.gguf"], "m-F16": shards,
            "mmproj-m-f16": [folder / "mmproj-m-f16.gguf"], "model": [folder / "model.safetensors"]}


def tensor_names(names) -> set[str]:
    return {f"{n}{s}" for n in names for s in (".npy", ".raw", ".meta.json")}


def check_member(mnt: Path, name: str, files: list[Path], base: str | None = None) -> None:
    """The member folder holds that checkpoint's views, equal to the reference libraries' values; each
    meta.json names the file it came from (``base`` + its name for a remote repository)."""
    sub = mnt / name
    if files[0].suffix == ".safetensors":
        ref = load_file(str(files[0]))
        assert set(os.listdir(sub)) == tensor_names(ref) | {"metadata.json"}
        for tensor, values in ref.items():
            assert (sub / f"{tensor}.npy").read_bytes() == npy_bytes(values), tensor
            assert (sub / f"{tensor}.raw").read_bytes() == values.tobytes(), tensor
        return
    ref = gguf_reference([str(p) for p in files])
    expected = tensor_names(t for t, _, _, _ in ref) | {"metadata.json"}
    if len(files) > 1:
        expected.add("model.gguf")  # a split set's shards merged
    assert set(os.listdir(sub)) == expected
    for tensor, values, stored, shard in ref:
        assert (sub / f"{tensor}.npy").read_bytes() == npy_bytes(values), tensor
        assert (sub / f"{tensor}.raw").read_bytes() == stored, tensor
        source = shard if base is None else base + os.path.basename(shard)
        assert json.loads((sub / f"{tensor}.meta.json").read_bytes())["source"] == source


def test_a_local_repository_mounts_every_file_and_each_checkpoint_in_its_folder(mounted, tmp_path):
    folder = tmp_path / "repo"
    members = write_repository(folder)
    mnt = mounted(folder)
    on_disk = sorted(p.name for p in folder.iterdir())
    assert set(os.listdir(mnt)) == set(on_disk) | set(members)
    assert mount_stats(mnt)["checkpoints"] == dict.fromkeys(members, False)  # nothing opened to mount
    for name in on_disk:  # ls -l: sizes from the folder listing, still nothing opened
        assert os.stat(mnt / name).st_size == (folder / name).stat().st_size
    for name in members:
        assert os.path.isdir(mnt / name)
    assert not any(mount_stats(mnt)["checkpoints"].values())

    check_member(mnt, "m-Q4_0", members["m-Q4_0"])  # one checkpoint read: that one opened alone
    assert mount_stats(mnt)["checkpoints"] == {**dict.fromkeys(members, False), "m-Q4_0": True}
    for name in on_disk:  # every file byte for byte
        check_same_file(mnt / name, folder / name)
    for name, files in members.items():
        check_member(mnt, name, files)
    pid = mount_stats(mnt)["pid"]
    assert descriptors_on(pid, folder / "m-Q8_0.gguf") == 1  # the file and its views: one reader
    for shard in members["m-F16"]:
        assert descriptors_on(pid, shard) == 1


def test_folder_names_that_clash_are_numbered(mounted, tmp_path):
    """model.gguf beside model.safetensors: "model" and "model~2" (folder order); a file of the folder named
    like a checkpoint's folder keeps its name, the folder gets ~2."""
    folder = tmp_path / "repo"
    folder.mkdir()
    write_gguf_by_hand(folder / "model.gguf", gguf_tensors(2), split=None)
    save_file({"w": np.arange(6, dtype=np.float32)}, str(folder / "model.safetensors"))
    write_gguf_by_hand(folder / "q.gguf", gguf_tensors(1), split=None)
    (folder / "q").write_bytes(b"a file named q\n")
    mnt = mounted(folder)
    names = set(os.listdir(mnt))
    assert names == {"model.gguf", "model.safetensors", "q.gguf", "q", "model", "model~2", "q~2"}
    assert (mnt / "q").read_bytes() == b"a file named q\n"
    assert "blk.0.weight.npy" in os.listdir(mnt / "model") and "w.npy" in os.listdir(mnt / "model~2")
    assert np.array_equal(np.load(mnt / "model~2" / "w.npy"), np.arange(6, dtype=np.float32))
    assert os.listdir(mnt / "q~2")


def test_a_damaged_checkpoint_costs_its_folder_not_its_file(mounted, tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    write_gguf_by_hand(folder / "good.gguf", gguf_tensors(2), split=None)
    (folder / "bad.gguf").write_bytes(b"GGUF" + b"\xff" * 60)  # a header that cannot be right
    mnt = mounted(folder)
    check_same_file(mnt / "bad.gguf", folder / "bad.gguf")
    with pytest.raises(OSError) as info:
        os.listdir(mnt / "bad")
    assert info.value.errno == errno.EIO
    check_member(mnt, "good", [folder / "good.gguf"])
    assert mount_stats(mnt)["checkpoints"] == {"bad": False, "good": True}


def test_a_folder_with_one_checkpoint_keeps_the_flat_layout(mounted, tmp_path):
    folder = tmp_path / "one"
    folder.mkdir()
    write_gguf_by_hand(folder / "only.gguf", gguf_tensors(2), split=None)
    (folder / "README.md").write_bytes(README)
    mnt = mounted(folder)
    ref = gguf_reference([str(folder / "only.gguf")])
    assert set(os.listdir(mnt)) == tensor_names(t for t, _, _, _ in ref) | {"metadata.json", "README.md",
                                                                             "only.gguf"}
    assert "checkpoints" not in mount_stats(mnt)


def test_a_manifest_with_a_repository_is_a_usage_error(tmp_path):
    require_fuse()  # the mount's checks come first
    folder = tmp_path / "repo"
    write_repository(folder)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run = subprocess.run([*ckptfs_cli(), "mount", str(folder), str(mnt), "--manifest", str(tmp_path / "m.json")],
                         env=cli_env(), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert run.returncode == 2 and "--manifest describes one checkpoint" in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and os.listdir(mnt) == []


def test_info_lists_the_checkpoints_and_open_names_them(tmp_path):
    folder = tmp_path / "repo"
    members = write_repository(folder)
    run = subprocess.run([*ckptfs_cli(), "info", str(folder), "--json"], env=cli_env(), capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    rows = {row["name"]: row for row in data["checkpoints"]}
    assert set(rows) == set(members)
    for name, files in members.items():
        assert rows[name]["files"] == [p.name for p in files]
        assert rows[name]["bytes"] == sum(p.stat().st_size for p in files)
        ckptfs.open(rows[name]["src"]).close()  # what info says to name opens that checkpoint alone
    assert set(data["other_files"]) == {"README.md", "config.json"}
    text = subprocess.run([*ckptfs_cli(), "info", str(folder)], env=cli_env(), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert text.returncode == 0 and text.stdout.startswith("repository: 5 checkpoints")
    for name in members:
        assert f"  {name}/  " in text.stdout
    with pytest.raises(CheckpointError) as refused:
        ckptfs.open(folder)
    message = str(refused.value)
    assert "name one file" in message and "\n" not in message
    for label in ("m-Q4_0.gguf", "m-Q8_0.gguf", "m-F16-NNNNN-of-00003.gguf", "mmproj-m-f16.gguf",
                  "model.safetensors"):
        assert label in message


def test_hf_folder_of_each_gguf_with_hf(mounted, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    from hf_models import sentencepiece_vocab, write_model

    folder = tmp_path / "repo"
    folder.mkdir()
    vocab = sentencepiece_vocab(tmp_path / "spm", gemma=False)
    for name, seed in (("tiny-Q8_0.gguf", 1), ("tiny-F32.gguf", 2)):
        write_model(folder / name, "llama", vocab, seed=seed)
    mnt = mounted(folder, "--hf")
    for member in ("tiny-Q8_0", "tiny-F32"):
        assert {"config.json", "model.safetensors"} <= set(os.listdir(mnt / member / "hf"))
        assert json.loads((mnt / member / "hf" / "config.json").read_bytes())["model_type"] == "llama"
    assert not (mnt / "hf").exists()


# ------------------------------------------------------------------------------------------ remote

def check_remote(mnt: Path, folder: Path, members: dict[str, list[Path]], base: str) -> None:
    on_disk = sorted(p.name for p in folder.iterdir())
    assert set(os.listdir(mnt)) == set(on_disk) | set(members)
    assert not any(mount_stats(mnt)["checkpoints"].values())
    for name in on_disk:
        assert sha256((mnt / name).read_bytes()) == sha256((folder / name).read_bytes()), name
    for name, files in members.items():
        check_member(mnt, name, files, base)


def test_an_s3_prefix_repository(tmp_path, mounted):
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto")
    from loopback.servers import MotoS3, environment

    folder = tmp_path / "repo"
    members = write_repository(folder)
    with MotoS3() as server, environment(server.env()):
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket="models")
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), "models", f"quants/{path.name}")
        mnt = mounted("s3://models/quants/", "--timeout", "10", "--stall-timeout", "2", env=server.env())
        check_remote(mnt, folder, members, "s3://models/quants/")


def test_an_hf_repository(tmp_path, mounted):
    pytest.importorskip("huggingface_hub")
    from loopback.servers import HubStandIn, Nginx, environment
    from conftest import require_nginx

    require_nginx()
    folder, cdn = tmp_path / "repo", tmp_path / "cdn"
    members = write_repository(folder)
    cdn.mkdir()
    with Nginx(cdn) as cdn_server, HubStandIn({"org/quants": folder}, cdn, cdn_server.url) as hub:
        with environment({"HF_ENDPOINT": hub.url}):
            mnt = mounted("hf://org/quants", "--timeout", "10", env={"HF_ENDPOINT": hub.url})
            check_remote(mnt, folder, members, "hf://org/quants/")
