"""AWQ views (GEMM and GEMV packing) through the API, against AutoAWQ's own ``dequantize_gemm`` (GEMM) and the
scalar transcription of its packing loops (GEMV has no dequantizer of its own), plus hand-derived values."""

from __future__ import annotations

import numpy as np
import pytest
from packed_fixtures import (same_bits, autoawq_dequantize_gemm, awq_gemm_layer, awq_gemv_layer, require_package,
                             write_folder)
from reference import scalar_packed

import ckptfs

PREFIX = "model.layers.3.mlp.down_proj"


def awq_config(group_size: int, version: str) -> dict:
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": version}


@pytest.mark.parametrize("group_size", [32, 64, -1])
def test_gemm_equals_autoawq(tmp_path, group_size):
    require_package("awq")
    layer = awq_gemm_layer(np.random.default_rng(group_size + 10), 120, 256, group_size)
    oracle = autoawq_dequantize_gemm(layer.tensors, group_size)
    assert same_bits(oracle, layer.expected())
    t = layer.tensors
    gsize = 256 if group_size == -1 else group_size
    assert same_bits(scalar_packed.awq_gemm_dequantize(t["qweight"], t["qzeros"], t["scales"], gsize), oracle)
    folder = write_folder(tmp_path / "m", {PREFIX: t}, awq_config(group_size, "gemm"))
    with ckptfs.open(folder) as ck:
        view = ck[PREFIX + ".weight"]
        assert view.shape == (120, 256) and view.virtual
        assert same_bits(view.numpy(), oracle)
        assert same_bits(view[13:99], oracle[13:99])
        assert view.meta["parameters"] == {"bits": 4, "group_size": group_size, "groups": 256 // gsize,
                                           "version": "gemm", "zero_point": True}


@pytest.mark.parametrize("group_size", [32, 128])
def test_gemv_equals_scalar_transcription(tmp_path, group_size):
    layer = awq_gemv_layer(np.random.default_rng(group_size), 48, 512, group_size)
    t = layer.tensors
    scalar = scalar_packed.awq_gemv_dequantize(t["qweight"], t["qzeros"], t["scales"], group_size)
    assert same_bits(scalar, layer.expected())
    folder = write_folder(tmp_path / "m", {PREFIX: t}, awq_config(group_size, "GEMV"))
    with ckptfs.open(folder) as ck:
        view = ck[PREFIX + ".weight"]
        assert view.shape == (48, 512)
        assert same_bits(view.numpy(), scalar)
        assert same_bits(view[7], scalar[7])


def test_golden_values(tmp_path):
    """By hand. GEMM, one input, 8 outputs: qweight word 0x76543210 puts k in nibble k, which AutoAWQ's order
    [0, 2, 4, 6, 1, 3, 5, 7] assigns to output ORDER[k]: outputs 0..7 hold 0, 4, 1, 5, 2, 6, 3, 7; zero 0, scale 1.
    GEMV, one output, 8 inputs: nibble k is input k; zero point 3, scale 2: W = 2 * (k - 3)."""
    word = np.array([[0x76543210]], np.uint32).view(np.int32)
    gemm = {"qweight": word, "qzeros": np.zeros((1, 1), np.int32), "scales": np.ones((1, 8), np.float16)}
    gemv = {"qweight": word, "qzeros": np.array([[3]], np.int32), "scales": np.full((1, 8), 2.0, np.float16)}
    folder = write_folder(tmp_path / "a", {PREFIX: gemm}, awq_config(-1, "gemm"))
    with ckptfs.open(folder) as ck:
        assert ck[PREFIX + ".weight"].numpy()[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    folder = write_folder(tmp_path / "b", {PREFIX: gemv}, awq_config(-1, "gemv"))
    with ckptfs.open(folder) as ck:
        assert ck[PREFIX + ".weight"].numpy()[0].tolist() == [-6, -4, -2, 0, 2, 4, 6, 8]
