"""``gguf/model.gguf`` of a gpt-oss MXFP4 folder against llama.cpp's converter.

A tiny gpt-oss is made at test time in the release's layout (``tests/gptoss_models.py``: transformers'
weights, the experts quantized to MXFP4 blocks and scales with numpy + ml_dtypes, an o200k-shaped tokenizer
with the harmony special tokens and a ``chat_template.jinja``, two shards). The mount's file equals the
converter's as maps (every key, the experts repacked into GGML MXFP4, the gate/up split of the experts and
their biases), in ``auto`` (the file type ``MOSTLY_MXFP4_MOE``, the other matrices BF16), ``f16`` (the same
file type, the other matrices F16) and ``q8_0``;
gguf-py's MXFP4 dequantizer reads from the served experts the values transformers' own gpt-oss
dequantization gives for the stored parts; llama.cpp generates the same greedy tokens from both files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf_view_models import assert_same_greedy, assert_same_gguf, convert
from gguf_view_models import converter, mounted_gguf  # noqa: F401 - fixtures
from gptoss_models import PRE, make_gpt_oss

pytest.importorskip("transformers")
pytest.importorskip("gguf")

N_PREDICT = 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_gpt_oss(tmp_path_factory.mktemp("hf") / "tiny-gpt-oss")


@pytest.mark.parametrize("outtype", ["auto", "f16", "q8_0"])
def test_equal_to_the_converter(mounted_gguf, folder, converter, tmp_path, outtype):
    reference = convert(folder, tmp_path / "converted.gguf", outtype, pre=PRE)
    assert_same_gguf(mounted_gguf(folder, outtype), reference)


def test_experts_hold_the_stored_values(mounted_gguf, folder):
    """Independent of the converter: each served expert tensor, dequantized by gguf-py, is transformers'
    dequantization of the stored blocks and scales (gate the even rows of ``gate_up_proj``, up the odd
    ones), exactly; the biases are the stored columns likewise; the file type is MXFP4_MOE with BF16
    matrices."""
    import torch
    from gguf import GGUFReader, quants
    from safetensors import safe_open
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    reader = GGUFReader(mounted_gguf(folder, "auto"))
    served = {t.name: t for t in reader.tensors}
    assert reader.fields["general.file_type"].contents() == 38  # MOSTLY_MXFP4_MOE
    assert served["blk.1.attn_q.weight"].tensor_type.name == "BF16"
    with safe_open(folder / "model-00002-of-00002.safetensors", "pt") as f:
        stored = {name: f.get_tensor(f"model.layers.1.mlp.experts.{name}")
                  for name in ("gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales",
                               "gate_up_proj_bias")}

    def dequantized(name: str) -> np.ndarray:
        tensor = served[name]
        assert tensor.tensor_type.name == "MXFP4"
        return quants.dequantize(np.array(tensor.data), tensor.tensor_type)

    gate_up = convert_moe_packed_tensors(stored["gate_up_proj_blocks"], stored["gate_up_proj_scales"],
                                         dtype=torch.float32).numpy()  # [E, in, 2 * out]
    down = convert_moe_packed_tensors(stored["down_proj_blocks"], stored["down_proj_scales"],
                                      dtype=torch.float32).numpy()
    assert np.abs(gate_up).max() > 0
    gate = dequantized("blk.1.ffn_gate_exps.weight")
    assert np.array_equal(gate, gate_up[:, :, 0::2].transpose(0, 2, 1))
    assert np.array_equal(dequantized("blk.1.ffn_up_exps.weight"), gate_up[:, :, 1::2].transpose(0, 2, 1))
    assert np.array_equal(dequantized("blk.1.ffn_down_exps.weight"), down.transpose(0, 2, 1))
    bias = stored["gate_up_proj_bias"].float().numpy()
    assert np.array_equal(np.array(served["blk.1.ffn_gate_exps.bias"].data), bias[:, 0::2])
    assert np.array_equal(np.array(served["blk.1.ffn_up_exps.bias"].data), bias[:, 1::2])


def test_llama_cpp_greedy_tokens(mounted_gguf, folder, converter, tmp_path):
    reference = convert(folder, tmp_path / "converted.gguf", "auto", pre=PRE)
    assert_same_greedy(reference, mounted_gguf(folder, "auto"), N_PREDICT)


def _info_gguf(folder: Path) -> str:
    """``ckptfs info --gguf``'s line about gguf/ (no traceback on the way)."""
    import subprocess

    from conftest import ckptfs_cli, cli_env

    done = subprocess.run([*ckptfs_cli(), "info", "--gguf", str(folder)], env=cli_env(), capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert "Traceback" not in done.stderr, done.stderr
    return next((line for line in done.stdout.splitlines() if line.startswith("gguf/: ")), done.stdout + done.stderr)


def test_dense_experts_are_refused(folder, tmp_path):
    """A gpt-oss folder without ``quant_method: mxfp4`` (a dense copy) gets no ``gguf/``: one line naming why."""
    copy = tmp_path / "tiny-gpt-oss"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    del config["quantization_config"]
    (copy / "config.json").write_text(json.dumps(config))
    assert _info_gguf(folder).startswith("gguf/: available")
    assert _info_gguf(copy).startswith("gguf/: none: a gpt-oss folder whose experts are not MXFP4")


@pytest.mark.parametrize("damage,line", [
    ("no scales", "model.layers.1.mlp.experts.down_proj_blocks has no _scales beside it"),
    ("scales cut", "model.layers.1.mlp.experts.down_proj_scales is U8 [4, 64, 1]: expected U8 [4, 64, 3]"),
    ("blocks 3-D", "model.layers.1.mlp.experts.down_proj_blocks is U8 [4, 64, 48]: expected U8 [experts, out, "
                   "in / 32, 16]"),
])
def test_damaged_parts_get_one_line(folder, tmp_path, damage, line):
    """A layer's MXFP4 parts that do not fit together (a scale tensor missing or of another shape, blocks
    without their 16-byte axis) give ``gguf/: none`` with the one line naming the tensor, never a traceback."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "tiny-gpt-oss"
    shutil.copytree(folder, copy)
    shard = copy / "model-00002-of-00002.safetensors"
    tensors = load_file(str(shard))
    prefix = "model.layers.1.mlp.experts.down_proj"
    if damage == "no scales":
        del tensors[f"{prefix}_scales"]
    elif damage == "scales cut":
        tensors[f"{prefix}_scales"] = tensors[f"{prefix}_scales"][..., :1].contiguous()
    else:
        tensors[f"{prefix}_blocks"] = tensors[f"{prefix}_blocks"].reshape(4, 64, 48).contiguous()
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    index["weight_map"] = {name: file for name, file in index["weight_map"].items()
                           if file != shard.name or name in tensors}
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    assert _info_gguf(copy) == f"gguf/: none: {line}"


def test_a_range_reads_only_its_rows(folder):
    """A few rows of ``ffn_up_exps`` (odd stored rows of ``gate_up_proj``) read the one span of stored rows of
    the blocks and of the scales they lie in, nothing else, and are the whole file's bytes there."""
    from counting import Counting

    from ckptfs.checkpoint.api import Checkpoint
    from ckptfs.formats.multi import read_checkpoint
    from ckptfs.ggufview.view import VirtualGgufView

    calls: list[tuple[int, int]] = []
    ck = Checkpoint(read_checkpoint(str(folder)), str(folder), source_wrapper=lambda s: Counting(s, calls))
    view = VirtualGgufView(ck, "auto")
    whole = view.read(0, view.size)
    plan, start = view.tensor_at("blk.1.ffn_up_exps.weight")
    # 4 experts of 96 up rows (the intermediate size), each 64 inputs: 2 blocks of 17 bytes
    assert (plan.rows, plan.cols, plan.row_bytes, plan.qtype.name) == (4 * 96, 64, 2 * 17, "MXFP4")
    assert plan.shape == (4, 96, 64)
    blocks = ck.stored("model.layers.1.mlp.experts.gate_up_proj_blocks").info
    scales = ck.stored("model.layers.1.mlp.experts.gate_up_proj_scales").info
    # output rows 100..103 are up rows 4..7 of expert 1: stored rows 192 + 1 + 2 * (4..7) = 201..207
    calls.clear()
    first, last = start + 100 * 34 + 5, start + 103 * 34 + 20
    got = view.read(first, last - first)
    assert sorted(calls) == sorted([(blocks.offset + 201 * 32, 7 * 32), (scales.offset + 201 * 2, 7 * 2)])
    assert got == whole[first:last]
    ck.close()
