"""compressed-tensors pack-quantized views through the API, against compressed-tensors' own
``PackedQuantizationCompressor.decompress`` (layers packed by its own ``pack_to_int32``), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from packed_fixtures import (same_bits, compressed_config, compressed_dequantize, compressed_layer, compressed_scheme,
                             write_folder)

import ckptfs

PREFIX = "model.layers.1.self_attn.o_proj"


CASES = [(bits, strategy, symmetric) for bits in (4, 8) for strategy in ("group", "channel", "tensor")
         for symmetric in (True, False)] + [(2, "group", False), (3, "group", True), (3, "channel", False)]


@pytest.mark.parametrize("bits,strategy,symmetric", CASES)
def test_view_equals_compressed_tensors(tmp_path, bits, strategy, symmetric):
    pytest.importorskip("compressed_tensors")
    rng = np.random.default_rng(bits * 10 + len(strategy) + symmetric)
    layer = compressed_layer(rng, 72, 256, bits, strategy, 64, symmetric)
    scheme = layer.extra["scheme"]
    oracle = compressed_dequantize(layer.tensors, scheme)
    assert same_bits(oracle, layer.expected("bfloat16"))
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, compressed_config({"group_0": scheme}))
    with ckptfs.open(folder) as ck:
        view = ck[PREFIX + ".weight"]
        assert view.shape == (72, 256)
        assert same_bits(view.numpy(), oracle)
        assert same_bits(view[9:50], oracle[9:50])
        params = view.meta["parameters"]
        assert (params["num_bits"], params["strategy"], params["symmetric"]) == (bits, strategy, symmetric)
        assert view.meta["computed_in"] == "BF16"


@pytest.mark.parametrize("scale_dtype", ["float16", "float32"])
def test_scale_dtypes(tmp_path, scale_dtype):
    pytest.importorskip("compressed_tensors")
    layer = compressed_layer(np.random.default_rng(1), 40, 128, 4, "group", 32, False, scale_dtype=scale_dtype)
    oracle = compressed_dequantize(layer.tensors, layer.extra["scheme"])
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, compressed_config({"g": layer.extra["scheme"]}))
    with ckptfs.open(folder) as ck:
        assert same_bits(ck[PREFIX + ".weight"].numpy(), oracle)


def test_config_groups_by_target_and_ignore(tmp_path):
    """Two config groups: a regex target for the MLP (8-bit channel) wins over the class-name target (4-bit
    group) for the layers it names; a layer in ``ignore`` gets no view."""
    pytest.importorskip("compressed_tensors")
    rng = np.random.default_rng(2)
    attn = compressed_layer(rng, 64, 128, 4, "group", 32, True)
    mlp = compressed_layer(rng, 64, 128, 8, "channel", None, False)
    skipped = compressed_layer(rng, 64, 128, 4, "group", 32, True)
    mlp_scheme = dict(mlp.extra["scheme"], targets=["re:.*mlp.*"])
    config = compressed_config({"group_0": attn.extra["scheme"], "group_1": mlp_scheme},
                               ignore=["model.layers.0.self_attn.v_proj"])
    folder = write_folder(tmp_path / "m", {"model.layers.0.self_attn.q_proj": attn.tensors,
                                           "model.layers.0.mlp.up_proj": mlp.tensors,
                                           "model.layers.0.self_attn.v_proj": skipped.tensors}, config)
    with ckptfs.open(folder) as ck:
        assert same_bits(ck["model.layers.0.self_attn.q_proj.weight"].numpy(),
                         compressed_dequantize(attn.tensors, attn.extra["scheme"]))
        assert same_bits(ck["model.layers.0.mlp.up_proj.weight"].numpy(),
                         compressed_dequantize(mlp.tensors, mlp.extra["scheme"]))
        assert "model.layers.0.self_attn.v_proj.weight" not in ck
        note = ck["model.layers.0.self_attn.v_proj.weight_packed"].meta["packed_view"]
        assert note["present"] is False and "ignore" in note["reason"]


def test_golden_values(tmp_path):
    """By hand: 4 bits, one row of 8; the packed word 0x76543210 holds field k = k, stored as q + 8, so
    q = k - 8; scale 0.25 (fp16), symmetric: W = 0.25 * (k - 8)."""
    tensors = {"weight_packed": np.array([[0x76543210]], np.uint32).view(np.int32),
               "weight_scale": np.full((1, 1), 0.25, np.float16), "weight_shape": np.array([1, 8], np.int64)}
    scheme = compressed_scheme(4, "channel", None, True)
    folder = write_folder(tmp_path / "g", {PREFIX: tensors}, compressed_config({"group_0": scheme}))
    with ckptfs.open(folder) as ck:
        assert ck[PREFIX + ".weight"].numpy()[0].tolist() == [-2.0, -1.75, -1.5, -1.25, -1.0, -0.75, -0.5, -0.25]
