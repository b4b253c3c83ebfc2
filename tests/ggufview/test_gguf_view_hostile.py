"""A Hugging Face folder with one hostile file, mounted by a daemon held to 1 GiB of address space
(``RLIMIT_AS``, inherited from the CLI by the daemon it forks).

Each variant of a tiny BERT sentence-embedding folder changes one file: a layer count of 10**9 (and 1e9, a
float, and 30 where the tensors hold 2 layers), a vocabulary of 10**8, a ``config.json`` or ``tokenizer.json`` nested 200,000 deep, the Pooling
module's ``config.json`` a FIFO, ``modules.json`` naming a Pooling module by an absolute path or through
``..`` (a ``config.json`` planted outside the folder). Whatever the file says, the plain mount serves every
tensor as the ``safetensors`` library reads it; ``--gguf`` is refused with one line (exit 1), within a
bounded time. A folder whose embedding has o200k's 201,088 rows still gets its ``gguf/`` under the same
limit, its vocabulary padded to that length as gguf-py reads it.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_runs import one_error_line, run_cli
from conftest import force_unmount, is_mounted, mount_stats, pid_alive, wait_until
from gguf_view_models import make_bert

pytest.importorskip("transformers")
pytest.importorskip("gguf")

ADDRESS_SPACE = 1 << 30
WALL_CLOCK = 120  # generous: a refusal takes well under a second; a hang or a runaway loop never ends


def _mount(src: Path, mnt: Path, *args: str):
    """``ckptfs mount SRC MNT ARGS`` with the CLI and its daemon under RLIMIT_AS (fails the test on a hang)."""
    return run_cli("mount", str(src), str(mnt), *args, address_space=ADDRESS_SPACE, timeout=WALL_CLOCK)


def _unmount(mnt: Path) -> None:
    if not is_mounted(mnt):
        return
    pid = mount_stats(mnt)["pid"]
    force_unmount(mnt)
    assert wait_until(lambda: not pid_alive(pid), timeout=10)


def _config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _deep(path: Path) -> None:
    path.write_text("[" * 200_000 + "]" * 200_000)


def _fifo(folder: Path) -> None:
    pooling = folder / "1_Pooling" / "config.json"
    pooling.unlink()
    os.mkfifo(pooling)


def _modules(folder: Path, pooling_path: str) -> None:
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": pooling_path, "type": "sentence_transformers.models.Pooling"}]))


def _outside(folder: Path) -> None:
    planted = folder.parent / f"{folder.name}-planted"
    planted.mkdir()
    (planted / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    _modules(folder, f"../{planted.name}")


#: variant -> (how the folder is changed, words of the one line --gguf is refused with)
VARIANTS = {
    "layers-1e9": (lambda f: _config(f, num_hidden_layers=1e9), "num_hidden_layers is 1000000000.0, not a count"),
    "layers-10**9": (lambda f: _config(f, num_hidden_layers=10**9), "1000000000, more than the 39 tensors"),
    "layers-30": (lambda f: _config(f, num_hidden_layers=30), "no tensor belongs to a block 29"),
    "vocab-10**8": (lambda f: _config(f, vocab_size=10**8), "vocab_size 100000000 is larger than any tensor"),
    "config-deep": (lambda f: _deep(f / "config.json"), "config.json is nested too deeply"),
    "tokenizer-deep": (lambda f: _deep(f / "tokenizer.json"), "tokenizer.json is nested too deeply"),
    "pooling-fifo": (_fifo, "1_Pooling/config.json is not a regular file"),
    "pooling-absolute": (lambda f: _modules(f, "/etc"), "'/etc' leads outside the folder"),
    "pooling-climbs": (_outside, "leads outside the folder"),
}


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return make_bert(tmp_path_factory.mktemp("hostile") / "tiny-bert")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_one_hostile_file(bert, tmp_path, mountpoint, variant):
    from safetensors.numpy import load_file

    change, words = VARIANTS[variant]
    folder = tmp_path / "model"
    shutil.copytree(bert, folder)
    change(folder)
    expected = load_file(folder / "model.safetensors")

    refused = _mount(folder, mountpoint, "--gguf")
    one_error_line(refused, 1, "no gguf/ folder", words)
    assert not is_mounted(mountpoint)

    plain = _mount(folder, mountpoint)
    assert plain.returncode == 0, plain.stderr
    try:
        for name, values in expected.items():
            assert np.array_equal(np.load(mountpoint / f"{name}.npy"), values), name
        assert not (mountpoint / "gguf").exists()
    finally:
        _unmount(mountpoint)


def test_a_vocabulary_as_long_as_o200k_is_served(bert, tmp_path, mountpoint):
    """201,088 embedding rows (o200k_base's padded vocabulary) and that vocab_size: a count the tensors bear
    out, however large, is served; the vocabulary is padded to it as the converter pads it."""
    from gguf import GGUFReader
    from safetensors.numpy import load_file, save_file

    rows = 201_088
    folder = tmp_path / "wide"
    shutil.copytree(bert, folder)
    tensors = load_file(folder / "model.safetensors")
    hidden = tensors["embeddings.word_embeddings.weight"].shape[1]
    tensors["embeddings.word_embeddings.weight"] = np.random.default_rng(0).normal(
        size=(rows, hidden)).astype(np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    _config(folder, vocab_size=rows)

    mounted = _mount(folder, mountpoint, "--gguf")
    assert mounted.returncode == 0, mounted.stderr
    try:
        reader = GGUFReader(mountpoint / "gguf" / "model.gguf")
        tokens = len(reader.fields["tokenizer.ggml.tokens"].data)
        shape = next(t for t in reader.tensors if t.name == "token_embd.weight").data.shape
        del reader  # its memory map holds the file open
        gc.collect()
        assert tokens == rows
        assert shape == (rows, hidden)
    finally:
        _unmount(mountpoint)
