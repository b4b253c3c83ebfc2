"""ModelOpt NVFP4 (``nvidia/*-FP4``): the view stands in ``PREFIX.weight``'s name (the U8 codes stay
reachable as ``ck.stored`` and ``.raw``) and equals ``e2m1 * (e4m3(weight_scale) * weight_scale_2)`` in
float32, written here with ml_dtypes; from ``hf_quant_config.json`` and from a ``MIXED_PRECISION`` config
beside an FP8 layer; ``exclude_modules`` honoured."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fp4_fixtures import as_numpy, e4m3, modelopt_fp8_layer, modelopt_nvfp4_layer, nvfp4_formula, write_torch_folder
from mount_expect import npy_bytes
from packed_fixtures import same_bits

import ckptfs

pytest.importorskip("torch")
Q, K, DOWN = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.mlp.down_proj"


def expected(layer) -> np.ndarray:
    a = {k: as_numpy(v) for k, v in layer.items()}
    return nvfp4_formula(a["weight"], a["weight_scale"], a["weight_scale_2"], divide=False)


def hf_quant_folder(path, layers, exclude):
    tensors = {f"{prefix}.{k}": v for prefix, layer in layers.items() for k, v in layer.items()}
    doc = {"producer": {"name": "modelopt", "version": "0.29.0"},
           "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                            "exclude_modules": exclude}}
    return write_torch_folder(path, tensors, {"architectures": ["LlamaForCausalLM"]}, {"hf_quant_config.json": doc})


@pytest.mark.parametrize("scalar", [True, False])
def test_nvfp4_from_hf_quant_config(tmp_path, scalar):
    rng = np.random.default_rng(int(scalar))
    q, k = modelopt_nvfp4_layer(rng, 37, 96, scalar), modelopt_nvfp4_layer(rng, 16, 32, scalar)
    folder = hf_quant_folder(tmp_path / "m", {Q: q, K: k}, ["lm_head", "*k_proj"])
    values = expected(q)
    assert np.isnan(values[0, :16]).all() and np.isfinite(values[1:]).all()
    with ckptfs.open(folder) as ck:
        view = ck[Q + ".weight"]
        assert view.shape == (37, 96) and same_bits(view.numpy(), values)
        assert same_bits(view[5:9], values[5:9])
        assert view.meta["scheme"] == "modelopt/NVFP4"
        assert (view.meta["stored"]["storage_type"], view.meta["stored"]["shape"]) == ("U8", [37, 48])
        assert ck.stored(Q + ".weight").raw() == as_numpy(q["weight"]).tobytes()
        # the excluded layer keeps its codes under its name, with the reason
        assert ck[K + ".weight"].storage_type == "U8"
        note = ck[K + ".weight"].meta["packed_view"]
        assert note["present"] is False and "exclude_modules" in note["reason"]


def test_nvfp4_and_fp8_in_mixed_precision(tmp_path, mounted):
    rng = np.random.default_rng(7)
    fp8, nvfp4 = modelopt_fp8_layer(rng, 24, 64), modelopt_nvfp4_layer(rng, 40, 128)
    tensors = {f"{Q}.{k}": v for k, v in fp8.items()} | {f"{DOWN}.{k}": v for k, v in nvfp4.items()}
    config = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
              "quantized_layers": {Q: {"quant_algo": "FP8"}, DOWN: {"quant_algo": "NVFP4", "group_size": 16}}}
    folder = write_torch_folder(tmp_path / "m", tensors, {"quantization_config": config})
    fp8_values = e4m3(as_numpy(fp8["weight"])) * np.float32(0.0123)
    with ckptfs.open(folder) as ck:
        assert same_bits(ck[DOWN + ".weight"].numpy(), expected(nvfp4))
        assert same_bits(ck[Q + ".weight"].numpy(), fp8_values)
    mnt = mounted(folder)
    assert (mnt / (DOWN + ".weight.npy")).read_bytes() == npy_bytes(expected(nvfp4))
    assert (mnt / (DOWN + ".weight.raw")).read_bytes() == as_numpy(nvfp4["weight"]).tobytes()
    meta = json.loads((mnt / (DOWN + ".weight.meta.json")).read_text())
    assert meta["scheme"] == "modelopt/NVFP4" and meta["parameters"]["quant_algo"] == "NVFP4"


@pytest.mark.parametrize("damage,reason", [
    ("no_scale_2", f"part {Q}.weight_scale_2 is missing"),
    ("scale_shape", f"{Q}.weight_scale has shape [37, 5], NVFP4 of [37, 96] expects [37, 6]"),
    ("scale_type", f"{Q}.weight_scale is stored as BF16 (expected F8_E4M3)"),
])
def test_hostile_layers_keep_their_codes(tmp_path, damage, reason):
    """A missing ``weight_scale_2``, a scale grid that does not fit, a scale of another type: no view, the
    reason in the codes' meta.json, the codes served under their own name."""
    import torch

    layer = modelopt_nvfp4_layer(np.random.default_rng(9), 37, 96)
    if damage == "no_scale_2":
        del layer["weight_scale_2"]
    elif damage == "scale_shape":
        layer["weight_scale"] = layer["weight_scale"][:, :5].contiguous()
    else:
        layer["weight_scale"] = layer["weight_scale"].float().to(torch.bfloat16)
    folder = hf_quant_folder(tmp_path / "m", {Q: layer}, ["lm_head"])
    with ckptfs.open(folder) as ck:
        codes = ck[Q + ".weight"]
        assert codes.storage_type == "U8" and not codes.virtual
        note = codes.meta["packed_view"]
        assert note["present"] is False and note["reason"] == reason, note
        assert codes.raw() == as_numpy(layer["weight"]).tobytes()
