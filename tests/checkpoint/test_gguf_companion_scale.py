"""A GGUF converted from ModelOpt NVFP4 may store ``X.scale`` (llama.cpp multiplies the layer's output by it)
and ``X.input_scale`` (activations) beside ``X.weight``: the weight's ``meta.json`` names those it has
(written here by gguf-py's own writer), in the API and through a mount; the values stay the stored ones."""

from __future__ import annotations

import json

import gguf
import numpy as np

import ckptfs

DOWN, UP, EXPS = "blk.0.ffn_down", "blk.0.ffn_up", "blk.0.ffn_gate_exps"


def nvfp4_gguf(path):
    """Three NVFP4 weights (64 values in 36 bytes a block): one with both companions, one with none (its
    scale was all 1.0), and experts with a per-expert scale."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.NVFP4][1]
    for name, rows in ((DOWN, 8), (UP, 4), (EXPS, 6)):
        raw = rng.integers(0, 256, (rows, 2 * block), dtype=np.uint8)
        raw[:, :4] = 0x38  # the four UE4M3 sub-block scales of each block: 1.0 (the raw bytes are any values)
        raw[:, block:block + 4] = 0x38
        writer.add_tensor(f"{name}.weight", raw, raw_dtype=gguf.GGMLQuantizationType.NVFP4)
    writer.add_tensor(f"{DOWN}.scale", np.array([0.25], np.float32))
    writer.add_tensor(f"{DOWN}.input_scale", np.array([0.5], np.float32))
    writer.add_tensor(f"{EXPS}.scale", np.arange(1, 4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_companions_named_in_meta(tmp_path, mounted):
    path = nvfp4_gguf(tmp_path / "m.gguf")
    reader = gguf.GGUFReader(str(path))
    stored = {t.name: t for t in reader.tensors}
    with ckptfs.open(path) as ck:
        down = ck[f"{DOWN}.weight"].meta
        assert (down["companion_scale"], down["input_scale"]) == (f"{DOWN}.scale", f"{DOWN}.input_scale")
        assert ck[f"{EXPS}.weight"].meta["companion_scale"] == f"{EXPS}.scale"
        assert "input_scale" not in ck[f"{EXPS}.weight"].meta
        assert "companion_scale" not in ck[f"{UP}.weight"].meta and "input_scale" not in ck[f"{UP}.weight"].meta
        assert "companion_scale" not in ck[f"{DOWN}.scale"].meta
        # the weight's values are the stored ones: gguf-py's dequantization, no scale applied
        expected = gguf.quants.dequantize(stored[f"{DOWN}.weight"].data, gguf.GGMLQuantizationType.NVFP4)
        assert np.array_equal(ck[f"{DOWN}.weight"].numpy(), expected.reshape(ck[f"{DOWN}.weight"].shape))
        assert ck[f"{EXPS}.scale"].numpy().tolist() == [1.0, 2.0, 3.0]
    mnt = mounted(path)
    meta = json.loads((mnt / f"{DOWN}.weight.meta.json").read_text())
    assert (meta["companion_scale"], meta["input_scale"]) == (f"{DOWN}.scale", f"{DOWN}.input_scale")
    assert "companion_scale" not in json.loads((mnt / f"{UP}.weight.meta.json").read_text())
