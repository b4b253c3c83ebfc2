"""GPTQ views through the API, checked against AutoGPTQ's own torch dequantization and a scalar transcription.

Oracles: ``auto_gptq``'s ``qlinear_cuda.QuantLinear`` (its CPU path: ``scales[g_idx] * (weight - zeros[g_idx])``
in fp16, read out by an identity input), the scalar loops of tests/reference/scalar_packed.py (v2 zero
points, which AutoGPTQ does not read), and hand-derived golden values. Values are compared bit for bit
against the fp16 computation the references do (``Layer.expected``, torch), whose agreement with the oracle
each test checks too (the identity matmul cannot show the sign of a zero, so that one is compared by value).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from packed_fixtures import same_bits, autogptq_dequantize, gptq_layer, require_package, write_folder
from reference import scalar_packed

import ckptfs

PREFIX = "model.layers.0.self_attn.q_proj"


def gptq_config(bits: int, group_size: int, desc_act: bool = False, fmt: str | None = None) -> dict:
    config = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": desc_act, "sym": True,
              "damp_percent": 0.01, "true_sequential": True}
    if fmt is not None:
        config["checkpoint_format"] = fmt
    return config


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group_size,desc_act", [(32, False), (32, True), (-1, False), (48, True)])
def test_view_equals_autogptq(tmp_path, bits, group_size, desc_act):
    require_package("auto_gptq")
    rng = np.random.default_rng(bits * 100 + group_size)
    # zero points 0..2^bits-1: a v1 zero point of 0 is stored as 2^bits - 1 and read back as 2^bits
    layer = gptq_layer(rng, 96, 192, bits, group_size, desc_act=desc_act, zero_range=(0, 2 ** bits))
    oracle = autogptq_dequantize(layer.tensors, bits, group_size)
    expected = layer.expected()
    assert np.array_equal(oracle, expected)
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, gptq_config(bits, group_size, desc_act))
    with ckptfs.open(folder) as ck:
        view = ck[PREFIX + ".weight"]
        assert view.virtual and view.shape == (96, 192) and view.dtype == np.float32
        assert same_bits(view.numpy(), expected)
        assert same_bits(view[5:41], expected[5:41])          # a row range decodes only its tiles
        assert same_bits(view[77], expected[77])
        assert view.meta["parameters"]["bits"] == bits and view.meta["scheme"] == "gptq"


@pytest.mark.parametrize("scale", [3e-6, 5000.0])
def test_subnormal_and_overflowing_products(tmp_path, scale):
    """Scales whose products fall below float16's normal range (subnormals) or beyond it (inf), as the
    reference's fp16 arithmetic gives them."""
    require_package("auto_gptq")
    layer = gptq_layer(np.random.default_rng(4), 64, 128, 4, 32, zero_range=(0, 16))
    layer.tensors["scales"] = (layer.tensors["scales"].astype(np.float32) / 0.05 * scale).astype(np.float16)
    layer.scales = layer.tensors["scales"].astype(np.float32)[layer.extra["g_idx"]].T.copy()
    oracle = autogptq_dequantize(layer.tensors, 4, 32)
    expected = layer.expected()
    finite = np.isfinite(oracle)  # the identity matmul turns a column holding inf into NaN (inf * 0)
    assert np.array_equal(oracle[finite], expected[finite])
    t = layer.tensors
    assert same_bits(scalar_packed.gptq_dequantize(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], 4, False),
                     expected)
    assert (np.isinf(expected).any() if scale > 1 else ((expected != 0) & (np.abs(expected) < 2 ** -14)).any())
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, gptq_config(4, 32))
    with ckptfs.open(folder) as ck:
        assert same_bits(ck[PREFIX + ".weight"].numpy(), expected)


def test_v2_zero_points_are_stored_as_is(tmp_path):
    """gptq_v2 stores z itself: the same weights packed v1 (z - 1) and v2 (z) give the same view, equal to
    AutoGPTQ's v1 reading and to the scalar transcription of the v2 unpack."""
    require_package("auto_gptq")
    v1 = gptq_layer(np.random.default_rng(7), 64, 128, 4, 32, zero_range=(1, 16))
    v2 = gptq_layer(np.random.default_rng(7), 64, 128, 4, 32, v2=True, zero_range=(1, 16))
    assert np.array_equal(v1.q, v2.q) and np.array_equal(v1.zeros, v2.zeros)
    assert not np.array_equal(v1.tensors["qzeros"], v2.tensors["qzeros"])
    oracle = autogptq_dequantize(v1.tensors, 4, 32)
    t = v2.tensors
    scalar = scalar_packed.gptq_dequantize(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], 4, v2=True)
    assert np.array_equal(scalar, oracle)
    folder = write_folder(tmp_path / "v2", {PREFIX: v2.tensors}, gptq_config(4, 32, fmt="gptq_v2"))
    with ckptfs.open(folder) as ck:
        assert same_bits(ck[PREFIX + ".weight"].numpy(), v2.expected())
        assert ck[PREFIX + ".weight"].meta["parameters"]["checkpoint_format"] == "gptq_v2"


@pytest.mark.parametrize("bits", [3, 4])
def test_scalar_transcription_agrees(tmp_path, bits):
    layer = gptq_layer(np.random.default_rng(bits), 32, 64, bits, 16, desc_act=True, zero_range=(0, 2 ** bits))
    t = layer.tensors
    scalar = scalar_packed.gptq_dequantize(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], bits, v2=False)
    folder = write_folder(tmp_path / "m", {PREFIX: t}, gptq_config(bits, 16, True))
    with ckptfs.open(folder) as ck:
        assert np.array_equal(ck[PREFIX + ".weight"].numpy(), scalar)


def test_golden_values(tmp_path):
    """Worked by hand: 4-bit, 8 inputs x 8 outputs, one group. Column 0 of qweight is 0x76543210 (input i holds
    i); qzeros' word is 0x00000007 (v1: output 0's zero point is 7 + 1 = 8, the others 0 + 1 = 1); scales 0.5.
    So W[0, i] = 0.5 * (i - 8) and, with the other columns' words 0, W[o, i] = 0.5 * (0 - 1) for o > 0."""
    qweight = np.zeros((1, 8), np.uint32)
    qweight[0, 0] = 0x76543210
    tensors = {"qweight": qweight.view(np.int32), "qzeros": np.array([[7]], np.int32),
               "scales": np.full((1, 8), 0.5, np.float16), "g_idx": np.zeros(8, np.int32)}
    folder = write_folder(tmp_path / "g", {PREFIX: tensors}, gptq_config(4, -1))
    with ckptfs.open(folder) as ck:
        w = ck[PREFIX + ".weight"].numpy()
    assert w[0].tolist() == [-4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5]
    assert (w[1:] == -0.5).all()


def test_quantize_config_json_and_no_g_idx(tmp_path):
    """Older AutoGPTQ folders keep the settings in quantize_config.json (no quant_method) and may store no
    g_idx: groups are then i // group_size."""
    require_package("auto_gptq")
    layer = gptq_layer(np.random.default_rng(3), 64, 128, 4, 64)
    oracle = autogptq_dequantize(layer.tensors, 4, 64)
    tensors = {k: v for k, v in layer.tensors.items() if k != "g_idx"}
    settings = {"bits": 4, "group_size": 64, "desc_act": False, "sym": True}
    folder = write_folder(tmp_path / "old", {PREFIX: tensors}, settings, config_file="quantize_config.json")
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    with ckptfs.open(folder) as ck:
        view = ck[PREFIX + ".weight"]
        assert np.array_equal(view.numpy(), oracle)
        assert view.meta["config"] == "quantize_config.json" and view.meta["parameters"]["g_idx"] is False


def test_float16_mode_and_stored_parts_unchanged(tmp_path):
    layer = gptq_layer(np.random.default_rng(5), 64, 128, 4, 32)
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, gptq_config(4, 32),
                          extra_tensors={"lm_head.weight": np.ones((4, 4), np.float16)})
    with ckptfs.open(folder, dtype="float16") as ck:
        view = ck[PREFIX + ".weight"]
        assert view.dtype == np.float16
        assert np.array_equal(view.numpy(), layer.expected().astype(np.float16))
        # the stored parts are still there, unchanged, and say which view they make up
        qweight = ck[PREFIX + ".qweight"]
        assert not qweight.virtual and np.array_equal(qweight.numpy(), layer.tensors["qweight"])
        assert qweight.meta["packed_view"] == {"name": PREFIX + ".weight", "scheme": "gptq", "present": True}
        assert set(ck) == {PREFIX + "." + n for n in ("qweight", "qzeros", "scales", "g_idx", "weight")} | {
            "lm_head.weight"}


def test_pickled_view_reopens(tmp_path):
    import pickle

    layer = gptq_layer(np.random.default_rng(9), 32, 64, 4, 32)
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, gptq_config(4, 32))
    with ckptfs.open(folder) as ck:
        again = pickle.loads(pickle.dumps(ck[PREFIX + ".weight"]))
        assert again.name == PREFIX + ".weight" and same_bits(again.numpy(), layer.expected())


def test_torch_load_and_load_batch_include_the_view(tmp_path):
    """ckptfs.load (the release's state dict: the views, not their parts) and load_batch decode a view
    through the view itself; a part is loaded when named."""
    torch = pytest.importorskip("torch")
    layer = gptq_layer(np.random.default_rng(10), 64, 128, 4, 32)
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, gptq_config(4, 32))
    loaded = ckptfs.load(folder)
    assert loaded[PREFIX + ".weight"].dtype == torch.float32
    assert same_bits(loaded[PREFIX + ".weight"].numpy(), layer.expected())
    assert not any(name.startswith(PREFIX + ".q") or name.endswith((".scales", ".g_idx")) for name in loaded)
    parts = ckptfs.load(folder, [PREFIX + ".qweight"])
    assert np.array_equal(parts[PREFIX + ".qweight"].numpy(), layer.tensors["qweight"])
    with ckptfs.open(folder) as ck:
        assert same_bits(ck[PREFIX + ".weight"].to_torch(rows=slice(3, 9)).numpy(), layer.expected()[3:9])
        batch = ckptfs.load_batch(ck, [PREFIX + ".weight", PREFIX + ".scales"])
        assert same_bits(batch[PREFIX + ".weight"], layer.expected())
