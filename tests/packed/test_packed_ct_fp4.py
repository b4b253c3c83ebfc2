"""compressed-tensors NVFP4, MXFP4 (``*-pack-quantized``) and MXFP8 (``mxfp8-quantized``) views through the API, against the float32
formula (ml_dtypes, numpy) bit for bit and, rounded to bfloat16, against compressed-tensors' own
``decompress`` of layers its own compressors wrote; ``mixed-precision`` config groups and the ignore list."""

from __future__ import annotations

import numpy as np
import pytest
from fp4_fixtures import (as_numpy, ct_config, ct_decompress, ct_layer, ct_mx_formula, nvfp4_formula, same_values,
                          to_bf16, write_torch_folder)
from packed_fixtures import compressed_dequantize, compressed_layer, same_bits

import ckptfs

pytest.importorskip("compressed_tensors")
PREFIX = "model.layers.0.mlp.down_proj"


def formula(preset: str, tensors) -> np.ndarray:
    arrays = {name: as_numpy(t) for name, t in tensors.items()}
    if preset == "NVFP4":
        return nvfp4_formula(arrays["weight_packed"], arrays["weight_scale"], arrays["weight_global_scale"], True)
    if preset == "MXFP8":
        return ct_mx_formula(arrays["weight"], arrays["weight_scale"], 8)
    return ct_mx_formula(arrays["weight_packed"], arrays["weight_scale"], 4)


@pytest.mark.parametrize("preset,out,in_features", [("NVFP4", 37, 160), ("NVFP4", 64, 16), ("MXFP4", 19, 96),
                                                    ("MXFP4", 80, 256), ("MXFP8", 33, 96), ("MXFP8", 8, 32)])
def test_view_equals_formula_and_compressed_tensors(tmp_path, preset, out, in_features):
    config, tensors = ct_layer(preset, out, in_features, seed=out)
    expected = formula(preset, tensors)
    oracle = ct_decompress(preset, config, tensors)
    assert same_values(to_bf16(expected), oracle)      # the formula is the reference's, before its rounding
    assert np.isnan(expected[0, 0]) if preset == "NVFP4" else np.isinf(expected[0, :32]).any()
    folder = write_torch_folder(tmp_path / "m", {f"{PREFIX}.{k}": v for k, v in tensors.items()},
                                {"quantization_config": ct_config({"group_0": config}, config["format"])})
    with ckptfs.open(folder) as ck:
        view = ck[PREFIX + ".weight"]
        assert view.shape == (out, in_features) and view.dtype == np.float32
        assert same_bits(view.numpy(), expected)
        assert same_bits(view[3:out - 2], expected[3:out - 2])
        assert view.meta["scheme"] == f"compressed-tensors/{config['format']}"
        assert view.meta["parameters"]["format"] == config["format"]
        for name, t in tensors.items():  # the stored parts are served as stored (MXFP8's codes: ck.stored)
            assert ck.stored(f"{PREFIX}.{name}").raw() == as_numpy(t).tobytes()
        if preset == "MXFP8":
            assert view.meta["stored"]["storage_type"] == "F8_E4M3"


def test_nvfp4_scalar_global_scale(tmp_path):
    """A 0-d ``weight_global_scale`` does not promote the bfloat16 scale: compressed-tensors rounds the divided
    scale to bfloat16 before the product, and so does the view."""
    config, tensors = ct_layer("NVFP4", 24, 64, seed=3, scalar_global=True)
    oracle = ct_decompress("NVFP4", config, tensors)
    folder = write_torch_folder(tmp_path / "m", {f"{PREFIX}.{k}": v for k, v in tensors.items()},
                                {"quantization_config": ct_config({"group_0": config}, config["format"])})
    with ckptfs.open(folder) as ck:
        values = ck[PREFIX + ".weight"].numpy()
    assert same_values(to_bf16(values), oracle)
    assert not same_values(to_bf16(formula("NVFP4", tensors)), oracle)  # the rounding of the scale matters here


def test_mixed_precision_groups_and_ignore(tmp_path):
    """A ``mixed-precision`` config: an NVFP4 group for the attention, an MXFP4 group for the MLP's up and an
    MXFP8 one for its down projection (each with its own ``format``), and an ignored layer whose parts are
    served without a view; an int4 ``pack-quantized`` group beside them (its ``weight_packed`` too)."""
    attn_cfg, attn = ct_layer("NVFP4", 32, 64, seed=1)
    mlp_cfg, mlp = ct_layer("MXFP4", 48, 64, seed=2)
    down_cfg, down = ct_layer("MXFP8", 64, 96, seed=6)
    down_cfg["targets"] = ["re:.*down_proj"]
    import torch

    gate = compressed_layer(np.random.default_rng(8), 32, 64, 4, "group", 32, True, scale_dtype="float16")
    gate_cfg = dict(gate.extra["scheme"], targets=["re:.*gate_proj"], format="pack-quantized")
    skip_cfg, skipped = ct_layer("NVFP4", 16, 32, seed=4)
    attn_cfg["targets"] = ["re:.*self_attn.*"]
    mlp_cfg["targets"] = ["re:.*mlp.*"]
    names = {"model.layers.0.self_attn.q_proj": attn, "model.layers.0.mlp.up_proj": mlp,
             "model.layers.0.mlp.down_proj": down, "model.layers.0.self_attn.k_proj": skipped}
    tensors = {f"{prefix}.{k}": v for prefix, layer in names.items() for k, v in layer.items()}
    tensors.update({f"model.layers.0.mlp.gate_proj.{k}": torch.from_numpy(v) for k, v in gate.tensors.items()})
    config = ct_config({"group_0": attn_cfg, "group_2": down_cfg, "group_3": gate_cfg, "group_1": mlp_cfg},
                       "mixed-precision",
                       ignore=["lm_head", "model.layers.0.self_attn.k_proj"])
    folder = write_torch_folder(tmp_path / "m", tensors, {"quantization_config": config})
    with ckptfs.open(folder) as ck:
        assert same_bits(ck["model.layers.0.self_attn.q_proj.weight"].numpy(), formula("NVFP4", attn))
        assert same_bits(ck["model.layers.0.mlp.up_proj.weight"].numpy(), formula("MXFP4", mlp))
        assert same_values(to_bf16(ck["model.layers.0.mlp.up_proj.weight"].numpy()),
                           ct_decompress("MXFP4", mlp_cfg, mlp))
        assert same_bits(ck["model.layers.0.mlp.down_proj.weight"].numpy(), formula("MXFP8", down))
        assert same_bits(ck["model.layers.0.mlp.gate_proj.weight"].numpy(),
                         compressed_dequantize(gate.tensors, gate.extra["scheme"]))
        assert "model.layers.0.self_attn.k_proj.weight" not in ck
        note = ck["model.layers.0.self_attn.k_proj.weight_packed"].meta["packed_view"]
        assert note["present"] is False and "ignore" in note["reason"]


@pytest.mark.parametrize("damage,reason", [
    ("scale_shape", "weight_scale has shape [32, 2]"),
    ("no_global", "weight_global_scale is missing"),
    ("group_size", "group_size=32 is not supported (16)"),
])
def test_hostile_layers_keep_their_parts(tmp_path, damage, reason):
    config, tensors = ct_layer("NVFP4", 32, 64, seed=5)
    if damage == "scale_shape":
        tensors["weight_scale"] = tensors["weight_scale"][:, :2].contiguous()
    elif damage == "no_global":
        del tensors["weight_global_scale"]
    else:
        config["weights"]["group_size"] = 32
    folder = write_torch_folder(tmp_path / "m", {f"{PREFIX}.{k}": v for k, v in tensors.items()},
                                {"quantization_config": ct_config({"group_0": config}, config["format"])})
    with ckptfs.open(folder) as ck:
        assert PREFIX + ".weight" not in ck
        note = ck[PREFIX + ".weight_packed"].meta["packed_view"]
        assert note["present"] is False and reason in note["reason"], note
        assert ck[PREFIX + ".weight_packed"].raw() == as_numpy(tensors["weight_packed"]).tobytes()
