"""Packed views through a real FUSE mount: ``PREFIX.weight.npy`` is byte for byte ``np.save`` of the
reference's values (AutoGPTQ, AutoAWQ, compressed-tensors), reads at any offset agree with it, the view has
no ``.raw``, and a layer without a view keeps its parts, whose ``meta.json`` says why."""

from __future__ import annotations

import json
import os

import numpy as np
from packed_fixtures import (autoawq_dequantize_gemm, autogptq_dequantize, awq_gemm_layer, compressed_config,
                             compressed_dequantize, compressed_layer, gptq_layer, require_package, write_folder)
from safetensors.numpy import load_file
from mount_expect import npy_bytes

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True}
Q, BAD = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"


def read_at(path, offset: int, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def test_gptq_view_and_parts_through_the_mount(tmp_path, mounted):
    require_package("auto_gptq")
    rng = np.random.default_rng(11)
    layer = gptq_layer(rng, 256, 512, 4, 128, desc_act=True, zero_range=(0, 16))
    bad = gptq_layer(rng, 64, 256, 4, 128)
    bad.tensors["scales"] = bad.tensors["scales"][:1].copy()
    oracle = autogptq_dequantize(layer.tensors, 4, 128)
    folder = write_folder(tmp_path / "m", {Q: layer.tensors, BAD: bad.tensors}, GPTQ)
    mnt = mounted(folder)
    names = set(os.listdir(mnt))
    assert {Q + ".weight.npy", Q + ".weight.meta.json"} <= names
    assert Q + ".weight.raw" not in names and BAD + ".weight.npy" not in names
    # bytes as the reference's fp16 formula gives them (Layer.expected, torch); equal in value to AutoGPTQ's
    # result, whose identity matmul cannot show the sign of a zero
    assert np.array_equal(layer.expected(), oracle)
    expected = npy_bytes(layer.expected())
    path = mnt / (Q + ".weight.npy")
    assert os.path.getsize(path) == len(expected)
    rng = np.random.default_rng(0)
    for offset in [0, 100, len(expected) - 4096, *rng.integers(0, len(expected), 20).tolist()]:
        assert read_at(path, offset, 4096) == expected[offset: offset + 4096], offset
    assert path.read_bytes() == expected
    meta = json.loads((mnt / (Q + ".weight.meta.json")).read_text())
    assert (meta["virtual"], meta["scheme"], meta["shape"], meta["npy_dtype"]) == (True, "gptq", [256, 512], "<f4")
    assert meta["parameters"]["desc_act"] is True and meta["parameters"]["group_size"] == 128
    # stored parts: unchanged, and their meta.json names the view (or why there is none)
    stored = load_file(str(folder / "model.safetensors"))
    for name in (Q + ".qweight", BAD + ".qweight", BAD + ".scales"):
        assert (mnt / (name + ".raw")).read_bytes() == stored[name].tobytes()
    assert json.loads((mnt / (Q + ".qzeros.meta.json")).read_text())["packed_view"] == {
        "name": Q + ".weight", "scheme": "gptq", "present": True}
    note = json.loads((mnt / (BAD + ".qweight.meta.json")).read_text())["packed_view"]
    assert note["present"] is False and note["reason"].startswith(f"{BAD}.scales has shape [1, 64]")


def test_awq_and_compressed_views_in_float16(tmp_path, mounted):
    require_package("awq")
    rng = np.random.default_rng(12)
    awq = awq_gemm_layer(rng, 128, 256, 64)
    folder_awq = write_folder(tmp_path / "awq", {Q: awq.tensors},
                              {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
                               "version": "gemm"})
    mnt = mounted(folder_awq, "--dtype", "float16")
    oracle = autoawq_dequantize_gemm(awq.tensors, 64)
    assert (mnt / (Q + ".weight.npy")).read_bytes() == npy_bytes(oracle.astype(np.float16))

    ct = compressed_layer(rng, 96, 256, 4, "group", 64, False)
    folder_ct = write_folder(tmp_path / "ct", {Q: ct.tensors}, compressed_config({"group_0": ct.extra["scheme"]}))
    mnt = mounted(folder_ct)
    oracle = compressed_dequantize(ct.tensors, ct.extra["scheme"])
    expected = npy_bytes(oracle)
    path = mnt / (Q + ".weight.npy")
    assert path.read_bytes() == expected
    assert read_at(path, 1000, 5000) == expected[1000:6000]
