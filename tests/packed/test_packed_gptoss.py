"""gpt-oss ``mxfp4`` experts: ``...mlp.experts.gate_up_proj`` / ``down_proj`` views of shape ``[E, in, out]``
(what the BF16 release stores) from ``_blocks`` and ``_scales``, against ``ldexp(e2m1, e - 127)`` (numpy,
ml_dtypes) and transformers' ``convert_moe_packed_tensors`` bit for bit (float32, and bfloat16 as it loads
them), through the API, ``ckptfs.load``, a mount, and a count of what a small read takes."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from counting import Counting
from fp4_fixtures import GPT_OSS_CONFIG, gptoss_experts, gptoss_formula, to_bf16, transformers_mxfp4
from mount_expect import npy_bytes
from packed_fixtures import same_bits, write_folder
from test_packed_mount import read_at

import ckptfs
from ckptfs.checkpoint.api import Checkpoint
from ckptfs.formats.multi import read_checkpoint

pytest.importorskip("transformers")
EXPERTS = "model.layers.{}.mlp.experts"


def gptoss_folder(path, layers: int = 1, experts: int = 3, hidden: int = 64, intermediate: int = 64,
                  config=GPT_OSS_CONFIG, seed: int = 0):
    """A gpt-oss-shaped folder: per layer ``gate_up_proj`` ``[E, 2 * intermediate, hidden / 32, 16]`` blocks
    and ``down_proj`` ``[E, hidden, intermediate / 32, 16]``, their biases, and an unquantized router."""
    rng = np.random.default_rng(seed)
    stored, expected = {}, {}
    for layer in range(layers):
        prefix = EXPERTS.format(layer)
        for proj, out, in_features in (("gate_up_proj", 2 * intermediate, hidden), ("down_proj", hidden, intermediate)):
            parts = gptoss_experts(rng, experts, out, in_features)
            for role, value in parts.items():
                stored[f"{prefix}.{proj}_{role}"] = value
            expected[f"{prefix}.{proj}"] = gptoss_formula(parts["blocks"], parts["scales"])
        stored[f"model.layers.{layer}.mlp.router.weight"] = rng.standard_normal((experts, hidden)).astype(np.float32)
    folder = write_folder(path, {}, config, extra_tensors=stored)
    return folder, stored, expected


def test_views_equal_the_formula_and_transformers(tmp_path):
    folder, stored, expected = gptoss_folder(tmp_path / "m", layers=2, experts=3, hidden=96, intermediate=64)
    with ckptfs.open(folder) as ck:
        for name, values in expected.items():
            blocks, scales = stored[name + "_blocks"], stored[name + "_scales"]
            assert same_bits(values, transformers_mxfp4(blocks, scales, "float32"))
            assert same_bits(to_bf16(values), transformers_mxfp4(blocks, scales))
            view = ck[name]
            experts, out = blocks.shape[:2]
            assert view.shape == (experts, blocks.shape[2] * 32, out) == values.shape
            assert same_bits(view.numpy(), values)
            assert same_bits(view[1], values[1]) and same_bits(view[0:3:2], values[0:3:2])
            assert view.meta["scheme"] == "mxfp4" and view.meta["shape"] == list(values.shape)
            assert sorted(view.meta["parts"]) == ["blocks", "scales"]
            # the stored parts and the bias are served as they are
            for role in ("blocks", "scales", "bias"):
                assert ck[f"{name}_{role}"].raw() == stored[f"{name}_{role}"].tobytes()
        assert "model.layers.0.mlp.router" not in ck


def test_load_gives_the_release_names(tmp_path):
    torch = pytest.importorskip("torch")
    folder, stored, expected = gptoss_folder(tmp_path / "m")
    state = ckptfs.load(folder)
    names = {EXPERTS.format(0) + s for s in (".gate_up_proj", ".down_proj", ".gate_up_proj_bias", ".down_proj_bias")}
    assert names | {"model.layers.0.mlp.router.weight"} == set(state)
    for name, values in expected.items():
        assert torch.equal(state[name], torch.from_numpy(values).to(state[name].dtype))


def test_ignored_and_hostile_layers(tmp_path):
    """A layer in ``modules_to_not_convert`` and a layer whose scales do not fit its blocks: no view, one
    reason each, every stored part served."""
    folder, stored, _ = gptoss_folder(tmp_path / "m", layers=2)
    bad = EXPERTS.format(1) + ".down_proj_scales"
    stored[bad] = stored[bad][:, :, :1].copy()
    config = dict(GPT_OSS_CONFIG, modules_to_not_convert=GPT_OSS_CONFIG["modules_to_not_convert"] +
                  ["model.layers.0.mlp.experts.gate_up_proj"])
    write_folder(folder, {}, config, extra_tensors=stored)
    with ckptfs.open(folder) as ck:
        assert EXPERTS.format(0) + ".gate_up_proj" not in ck and EXPERTS.format(1) + ".down_proj" not in ck
        assert EXPERTS.format(0) + ".down_proj" in ck and EXPERTS.format(1) + ".gate_up_proj" in ck
        skipped = ck[EXPERTS.format(0) + ".gate_up_proj_blocks"].meta["packed_view"]
        assert skipped["present"] is False and "modules_to_not_convert" in skipped["reason"]
        note = ck[EXPERTS.format(1) + ".down_proj_blocks"].meta["packed_view"]
        assert note["present"] is False and note["reason"].startswith(f"{bad} has shape [3, 64, 1]"), note
        assert ck[bad].raw() == stored[bad].tobytes()


def test_views_through_the_mount(tmp_path, mounted):
    folder, stored, expected = gptoss_folder(tmp_path / "m", experts=4, hidden=128, intermediate=96)
    mnt = mounted(folder)
    name = EXPERTS.format(0) + ".gate_up_proj"
    data = npy_bytes(expected[name])
    path = mnt / (name + ".npy")
    rng = np.random.default_rng(1)
    for offset in [0, 200, len(data) - 4096, *rng.integers(0, len(data), 16).tolist()]:
        assert read_at(path, offset, 4096) == data[offset:offset + 4096], offset
    assert path.read_bytes() == data
    assert (mnt / (EXPERTS.format(0) + ".down_proj.npy")).read_bytes() == npy_bytes(expected[EXPERTS.format(0) +
                                                                                                ".down_proj"])
    meta = json.loads((mnt / (name + ".meta.json")).read_text())
    assert (meta["scheme"], meta["shape"]) == ("mxfp4", [4, 128, 192])
    assert not os.path.exists(mnt / (name + ".raw"))
    for role in ("blocks", "scales", "bias"):
        assert (mnt / f"{name}_{role}.raw").read_bytes() == stored[f"{name}_{role}"].tobytes()
    half = mounted(folder, "--dtype", "float16")
    with np.errstate(over="ignore"):  # the blocks scaled by 2^127 overflow float16, as numpy casts them
        assert (half / (name + ".npy")).read_bytes() == npy_bytes(expected[name].astype(np.float16))


def test_a_small_read_reads_one_expert(tmp_path):
    """4 KiB of expert 2's values: their tile (32 rows: one block column of the expert, as in gpt-oss-20b's
    shapes) reads expert 2's blocks and scales once (the rows are columns of the stored matrices, spread over
    the whole expert) and nothing of the other experts; a second tile of the expert reads nothing."""
    folder, stored, expected = gptoss_folder(tmp_path / "m", experts=3, hidden=64, intermediate=544)
    name = EXPERTS.format(0) + ".gate_up_proj"
    out = 2 * 544
    calls: list[tuple[int, int]] = []
    ck = Checkpoint(read_checkpoint(str(folder)), str(folder), source_wrapper=lambda s: Counting(s, calls))
    try:
        view = ck[name]
        flat = expected[name].reshape(-1)
        calls.clear()
        start = (2 * 64 + 40) * out
        assert same_bits(view.data.read(start, start + 1024), flat[start:start + 1024])
        blocks, scales = ck[name + "_blocks"].info, ck[name + "_scales"].info
        assert sorted(calls) == sorted([(blocks.offset + 2 * out * 2 * 16, out * 2 * 16),
                                        (scales.offset + 2 * out * 2, out * 2)])
        calls.clear()
        start = (2 * 64 + 3) * out
        assert same_bits(view.data.read(start, start + 1024), flat[start:start + 1024])
        assert calls == []
    finally:
        ck.close()
