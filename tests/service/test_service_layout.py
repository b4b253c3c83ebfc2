"""``--layout tree``: a tensor name's last two dot-separated parts are the file stem, the parts before them
folders (docs/reference/layout.md, "Layout tree"; ckptfs/tree/layout.py).

The expected paths come from the rule written out here, and every file's bytes from gguf-py and numpy
(``expected_gguf``), so the tree mount is checked against the references, not against the flat mount.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np

from fixtures import quantized, write_gguf, write_safetensors
from mount_expect import expected_gguf

from ckptfs.tree.layout import tree_stems

NAMES = {
    "token_embd.weight": "Q8_0",          # two parts: stays in the root
    "lone": "F32",                        # one part
    "blk.0.attn_q.weight": "Q4_K",
    "blk.0.attn_q.bias": "F32",
    "blk.12.ffn.down.weight": "Q6_K",     # deeper: blk/12/ffn/down.weight
    "a..b.weight": "F16",                 # an empty part cannot be a folder: stays flat in the root
    "model.layers.0.self_attn.q_proj.weight": "BF16",
}
SUFFIXES = (".npy", ".raw", ".meta.json")


def expected_path(name: str) -> str:
    parts = name.split(".")
    if len(parts) <= 2 or any(p in ("", ".", "..") for p in parts[:-2]):
        return name
    return "/".join(parts[:-2]) + "/" + ".".join(parts[-2:])


def files_under(mnt: Path) -> set[str]:
    found = set()
    for root, _dirs, files in os.walk(mnt):
        for f in files:
            found.add(os.path.relpath(os.path.join(root, f), mnt))
    return found


def test_tree_layout_serves_every_file_where_the_rule_puts_it(mounted, tmp_path):
    rng = np.random.default_rng(7)
    tensors = {}
    for name, storage_type in NAMES.items():
        if storage_type in ("Q4_K", "Q6_K"):
            tensors[name] = (quantized(storage_type, (4, 256), rng), storage_type)
        else:
            tensors[name] = (rng.standard_normal((8, 64)).astype(np.float32), storage_type)
    written = write_gguf(tmp_path / "m.gguf", tensors, {"general.name": "layout"})
    expected = expected_gguf(written, str(written.path))
    mnt = mounted(str(written.path), "--layout", "tree")

    want = {"metadata.json", "m.gguf"} | {expected_path(n) + s for n in NAMES for s in SUFFIXES}
    assert files_under(mnt) == want
    assert set(os.listdir(mnt / "blk")) == {"0", "12"} and set(os.listdir(mnt / "blk" / "12")) == {"ffn"}
    assert stat.S_ISDIR(os.stat(mnt / "model" / "layers" / "0" / "self_attn").st_mode)
    for name in NAMES:
        for suffix in (".npy", ".raw"):
            assert (mnt / (expected_path(name) + suffix)).read_bytes() == expected.data[name + suffix], name
        meta = json.loads((mnt / (expected_path(name) + ".meta.json")).read_bytes())
        assert meta["name"] == name  # meta.json keeps the original name
        assert {k: meta[k] for k in expected.json[name + ".meta.json"]} == expected.json[name + ".meta.json"]
    loaded = np.load(mnt / "blk" / "0" / "attn_q.weight.npy", mmap_mode="r")
    assert np.array_equal(loaded, expected.arrays["blk.0.attn_q.weight.npy"])


def test_a_passthrough_file_named_like_a_folder_is_renumbered(mounted, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", {"blk.0.attn.weight": np.ones((2, 3), np.float32)})
    (folder / "blk").write_bytes(b"a file the folder holds\n")
    (folder / "config.json").write_text("{}\n")
    mnt = mounted(str(folder), "--layout", "tree")
    assert stat.S_ISDIR(os.stat(mnt / "blk").st_mode) and os.listdir(mnt / "blk") == ["0"]
    assert (mnt / "blk~2").read_bytes() == b"a file the folder holds\n"
    assert (mnt / "config.json").read_bytes() == b"{}\n"
    assert np.array_equal(np.load(mnt / "blk" / "0" / "attn.weight.npy"), np.ones((2, 3), np.float32))


def test_duplicates_and_long_names_inside_a_folder():
    long_leaf = "x" * 300 + ".weight"
    stems = tree_stems(["blk.0.a.w", "blk.0.a.w", "blk.1.a.w", "blk.0." + long_leaf, "a.w", "a.w"])
    assert stems[:3] == ["blk/0/a.w", "blk/0/a.w~2", "blk/1/a.w"]
    assert stems[4:] == ["a.w", "a.w~2"]
    folder, _, leaf = stems[3].rpartition("/")
    assert folder == "blk/0" and len((leaf + ".meta.json").encode()) <= 255 and leaf.startswith("x" * 200 + "~")
