"""llama.cpp, built from source, loading GGUFs through real mounts: the same greedy text as the file itself.

The client is libllama (llama-cpp-python's vendored llama.cpp, built by scripts/build_llama_cpp.sh, which
scripts/setup.sh runs) driven by ``ckptfs-llama-probe`` (scripts/llama_probe/probe.cpp, called through
scripts/llama_client.py): it loads the model in each of llama.cpp's load modes — ``mmap`` (pages faulted in
as the graph touches them), ``none`` (``--no-mmap``: buffered reads of every tensor) and ``dio``
(``--load-mode dio``: O_DIRECT reads at st_blksize-aligned offsets; llama.cpp silently falls back to
buffered reads when O_DIRECT fails, so the probe reports that and the test refuses it) — and generates
greedily. The model is real-shaped (scripts/make_realistic_gguf.py: Gemma 3's architecture keys, an
SPM vocabulary with byte tokens, the Q4_K_M type mix of Q8_0 / Q5_0 / Q4_K / Q6_K / F32) with random
weights; the oracle is the probe's output on the original file, in the same mode.

Mounted: the merged ``model.gguf`` of a split set (written by gguf-py's splitting writer with the same seed
as the single file, so byte-identical to it), local and from nginx on loopback (``http://``).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, require_nginx
from gguf import GGUFReader
from loopback.servers import Nginx

sys.path.append(str(REPO / "scripts"))
import llama_client
from llama_models import N_PREDICT, check_same, direct, make_model, probe  # noqa: F401







@pytest.fixture(scope="module")
def model(tmp_path_factory) -> dict[str, Path]:
    """``one``: the single file; ``split``: the same model as a 4-shard set (the www root for nginx)."""
    root = tmp_path_factory.mktemp("llama")
    make_model(root / "one.gguf")
    make_model(root / "www" / "split" / "m.gguf", "--split-max-tensors", "14")
    shards = sorted((root / "www" / "split").glob("m-*-of-*.gguf"))
    assert len(shards) == 4
    return {"one": root / "one.gguf", "www": root / "www", "shards": shards}






@pytest.fixture(scope="module")
def split_mount(module_mounted, model) -> Path:
    return module_mounted(str(model["shards"][1]))


@pytest.mark.parametrize("mode", llama_client.MODES)
def test_model_gguf_of_a_split_set(split_mount, direct, probe, mode):
    check_same(llama_client.run(split_mount / "model.gguf", mode, N_PREDICT, probe=probe), direct[mode], mode)


@pytest.fixture(scope="module")
def http_mount(module_mounted, model):
    require_nginx()
    with Nginx(model["www"]) as server:
        mnt = module_mounted(f"{server.url}/split/{model['shards'][0].name}")
        yield mnt, server


@pytest.mark.parametrize("mode", ["mmap", "dio"])
def test_model_gguf_of_a_split_set_over_http(http_mount, direct, probe, mode):
    mnt, server = http_mount
    check_same(llama_client.run(mnt / "model.gguf", mode, N_PREDICT, probe=probe), direct[mode], mode)
    assert any(" 206 " in line for line in server.access_log())  # read per range, not downloaded whole


def test_the_comparison_sees_a_changed_tensor(probe, model, direct, tmp_path):
    """The oracle can fail: zeroing one F32 tensor (output_norm) of a copy changes the greedy tokens."""
    copy = tmp_path / "changed.gguf"
    shutil.copyfile(model["one"], copy)
    tensor = next(t for t in GGUFReader(str(model["one"])).tensors if t.name == "output_norm.weight")
    with open(copy, "r+b") as f:
        f.seek(int(tensor.data_offset))
        f.write(np.zeros(int(tensor.n_elements), np.float32).tobytes())
    assert llama_client.run(copy, "mmap", N_PREDICT, probe=probe)["tokens"] != direct["mmap"]["tokens"]


# ------------------------------------------------- the checkpoint's own files ------------------


@pytest.mark.parametrize("mode", llama_client.MODES)
def test_single_file_mount_shows_the_file(module_mounted, model, direct, probe, mode):
    mnt = module_mounted(str(model["one"]))
    check_same(llama_client.run(mnt / "one.gguf", mode, N_PREDICT, probe=probe), direct[mode], mode)


@pytest.mark.parametrize("mode", ["mmap", "dio"])
def test_single_file_over_http(module_mounted, model, direct, probe, mode):
    require_nginx()
    with Nginx(model["one"].parent) as server:
        mnt = module_mounted(f"{server.url}/one.gguf")
        check_same(llama_client.run(mnt / "one.gguf", mode, N_PREDICT, probe=probe), direct[mode], mode)
        assert any(" 206 " in line for line in server.access_log())


def test_repository_of_two_quantizations(mounted, model, direct, probe, tmp_path):
    """A folder as a GGUF repository holds it: two models side by side, each loads under its own name."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copyfile(model["one"], repo / "m-Q4_K_M.gguf")
    make_model(repo / "m-other.gguf", "--seed", "7")
    other = llama_client.run(repo / "m-other.gguf", "mmap", N_PREDICT, probe=probe)
    assert other["tokens"] != direct["mmap"]["tokens"]
    mnt = mounted(str(repo))
    for mode in ("mmap", "dio"):
        check_same(llama_client.run(mnt / "m-Q4_K_M.gguf", mode, N_PREDICT, probe=probe), direct[mode], mode)
        check_same(llama_client.run(mnt / "m-other.gguf", mode, N_PREDICT, probe=probe), other, mode)


def test_split_set_mounted_by_a_relative_path(mounted, model, direct, probe):
    www = model["www"]
    mnt = mounted(f"split/{model['shards'][1].name}", cwd=www)
    check_same(llama_client.run(mnt / "model.gguf", "dio", N_PREDICT, probe=probe), direct["dio"], "dio")
