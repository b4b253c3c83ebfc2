"""The other FP8-family schemes: compressed-tensors ``float-quantized`` / ``int-quantized`` /
``naive-quantized`` (written and decompressed by compressed-tensors' own compressors, the oracle), fbgemm
FP8 (Llama-4 layouts written with numpy + ml_dtypes as transformers' FbgemmFp8 classes store them). Each
view is bit for bit the float32 formula computed here, and rounded to the scale's dtype the oracle's."""

from __future__ import annotations

import numpy as np
import pytest
from fp8_fixtures import BF16, E4M3, round_bits, write_model
from packed_fixtures import compressed_config, compressed_layer, compressed_scheme, same_bits

import ckptfs

Q = "model.layers.0.mlp.down_proj"
K = "model.layers.0.self_attn.k_proj"


def _torch_of(value: np.ndarray):
    import torch

    if value.dtype == BF16:
        return torch.from_numpy(value.view(np.uint16).copy()).view(torch.bfloat16)
    if value.dtype == E4M3:
        return torch.from_numpy(value.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    return torch.from_numpy(np.ascontiguousarray(value))


def _numpy_of(value) -> np.ndarray:
    import torch

    if value.dtype == torch.bfloat16:
        return value.view(torch.uint16).numpy().view(BF16)
    if value.dtype == torch.float8_e4m3fn:
        return value.view(torch.uint8).numpy().view(E4M3)
    return value.numpy()


def ct_layer(rng, out, n, weights: dict, scale_dtype=BF16):
    """A layer compressed by compressed-tensors' NaiveQuantizationCompressor (float/int codes), with scales
    and zero points computed here per strategy (amax / qmax, as its min-max observer does)."""
    import torch
    from compressed_tensors.compressors.naive_quantized.base import NaiveQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    scheme = QuantizationScheme(targets=["Linear"], weights=weights)
    w = rng.standard_normal((out, n)).astype(np.float32) * 0.05
    strategy = weights["strategy"]
    if strategy == "tensor":
        shape, rows, cols = (1,), out, n
    elif strategy == "channel":
        shape, rows, cols = (out, 1), 1, n
    elif strategy == "group":
        shape, rows, cols = (out, n // weights["group_size"]), 1, weights["group_size"]
    else:
        bh, bw = weights["block_structure"]
        shape, rows, cols = (-(-out // bh), -(-n // bw)), bh, bw
    qmax = 448.0 if weights["type"] == "float" else 127.0
    scale = np.empty(shape, np.float32)
    flat = scale.reshape(-(-out // rows) if strategy != "tensor" else 1, -1)
    for i in range(flat.shape[0]):
        for j in range(flat.shape[1]):
            tile = w[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols] if strategy != "tensor" else w
            flat[i, j] = max(float(np.abs(tile).max()), 1e-6) / qmax
    state = {"weight": torch.from_numpy(w).to(torch.bfloat16),
             "weight_scale": _torch_of(scale.astype(scale_dtype))}
    if not weights.get("symmetric", True):
        state["weight_zero_point"] = torch.from_numpy(rng.integers(-20, 20, shape).astype(np.int8))
    compressed = NaiveQuantizationCompressor.compress(state, scheme)
    tensors = {k: _numpy_of(v) for k, v in compressed.items()}
    oracle = NaiveQuantizationCompressor.decompress({k: _torch_of(v) for k, v in tensors.items()}, scheme)
    return tensors, oracle["weight"].float().numpy()


def expected_ct(tensors: dict, block: tuple[int, int]) -> np.ndarray:
    """``(q - z[i // bh, j // bw]) * s[i // bh, j // bw]`` in float32."""
    q = tensors["weight"].astype(np.float32)
    s = tensors["weight_scale"].astype(np.float32).reshape(-1, -(-q.shape[1] // block[1]))
    z = tensors.get("weight_zero_point")
    rows, cols = np.arange(q.shape[0]) // block[0], np.arange(q.shape[1]) // block[1]
    s_full = s[rows][:, cols] if s.shape[0] > 1 else np.broadcast_to(s[0][cols], q.shape)
    if z is not None:
        z_full = z.astype(np.float32).reshape(s.shape)[rows][:, cols]
        q = q - z_full
    return (q * s_full).astype(np.float32)


@pytest.mark.parametrize("weights,block,shape", [
    ({"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}, (1, 200), (72, 200)),
    ({"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}, (72, 200), (72, 200)),
    ({"num_bits": 8, "type": "float", "strategy": "block", "symmetric": True, "block_structure": [128, 128]},
     (128, 128), (300, 200)),
    ({"num_bits": 8, "type": "float", "strategy": "group", "symmetric": True, "group_size": 32}, (1, 32),
     (40, 96)),
    ({"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}, (1, 100), (50, 100)),
    ({"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": False}, (1, 100), (50, 100)),
])
def test_compressed_tensors_float_and_int(tmp_path, weights, block, shape):
    pytest.importorskip("compressed_tensors")
    rng = np.random.default_rng(shape[0] + len(weights))
    tensors, oracle = ct_layer(rng, *shape, weights)
    fmt = "float-quantized" if weights["type"] == "float" else "int-quantized"
    config = {**compressed_config({"group_0": {"targets": ["Linear"], "weights": weights}}), "format": fmt}
    folder = write_model(tmp_path / "m", {f"{Q}.{k}": v for k, v in tensors.items()}, config)
    expected = expected_ct(tensors, block)
    with ckptfs.open(folder) as ck:
        view = ck[Q + ".weight"]
        assert view.virtual and view.meta["scheme"] == f"compressed-tensors/{fmt}"
        got = view.numpy()
        assert ck.stored(Q + ".weight").storage_type == ("F8_E4M3" if weights["type"] == "float" else "I8")
    assert same_bits(got, expected)
    with ckptfs.open(folder) as ck:  # the numpy reference path too (the C kernel serves by default)
        data = ck[Q + ".weight"].data
        data.backend = "numpy"
        assert same_bits(data.read(0, data.n_elements).reshape(shape), expected)
    assert np.array_equal(round_bits(got, BF16), oracle)


def test_mixed_precision_routes_each_layer_by_its_group(tmp_path):
    """``format: mixed-precision``: an FP8 group and an int4 pack-quantized group, each layer decoded by the
    scheme of the group that targets it; a layer in ``ignore`` keeps its stored tensor."""
    pytest.importorskip("compressed_tensors")
    rng = np.random.default_rng(21)
    fp8_weights = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}
    fp8, fp8_oracle = ct_layer(rng, 64, 96, fp8_weights)
    int4 = compressed_layer(rng, 32, 64, 4, "group", 32, True)
    int4_scheme = compressed_scheme(4, "group", 32, True)
    config = compressed_config({
        "group_0": {"targets": [f"re:.*{Q.split('.')[-1]}$"], "weights": fp8_weights, "format": "float-quantized"},
        "group_1": {**int4_scheme, "targets": [K], "format": "pack-quantized"}}, ignore=["lm_head"])
    config["format"] = "mixed-precision"
    head, _ = ct_layer(rng, 16, 96, fp8_weights)
    folder = write_model(tmp_path / "m", {**{f"{Q}.{k}": v for k, v in fp8.items()},
                                          **{f"{K}.{k}": v for k, v in int4.tensors.items()},
                                          **{f"lm_head.{k}": v for k, v in head.items()}}, config)
    with ckptfs.open(folder) as ck:
        assert ck[Q + ".weight"].meta["scheme"] == "compressed-tensors/float-quantized"
        assert same_bits(ck[Q + ".weight"].numpy(), expected_ct(fp8, (1, 96)))
        assert ck[K + ".weight"].meta["scheme"] == "compressed-tensors"
        assert same_bits(ck[K + ".weight"].numpy(), int4.expected("bfloat16"))
        assert not ck["lm_head.weight"].virtual
        assert "ignore" in ck["lm_head.weight"].meta["packed_view"]["reason"]
    assert np.array_equal(round_bits(expected_ct(fp8, (1, 96)), BF16), fp8_oracle)


def test_g_idx_picks_each_columns_group(tmp_path):
    """Activation order: ``weight_g_idx[j]`` is the group whose scale column ``j`` takes."""
    rng = np.random.default_rng(22)
    out, n, g = 24, 64, 16
    codes = rng.standard_normal((out, n)).astype(np.float32).astype(E4M3)
    scales = (rng.uniform(0.001, 0.01, (out, n // g))).astype(np.float32).astype(BF16)
    g_idx = rng.permutation(np.arange(n) // g).astype(np.int32)
    weights = {"num_bits": 8, "type": "float", "strategy": "group", "group_size": g, "symmetric": True,
               "actorder": "group"}
    config = {**compressed_config({"group_0": {"targets": ["Linear"], "weights": weights}}),
              "format": "float-quantized"}
    folder = write_model(tmp_path / "m", {Q + ".weight": codes, Q + ".weight_scale": scales,
                                          Q + ".weight_g_idx": g_idx}, config)
    expected = codes.astype(np.float32) * scales.astype(np.float32)[:, g_idx]
    with ckptfs.open(folder) as ck:
        assert same_bits(ck[Q + ".weight"].numpy(), expected)


def test_fbgemm_linear_and_llama4_experts(tmp_path):
    """fbgemm_fp8: a Linear's per-row ``weight_scale [out, 1]``; Llama-4 experts in the release's layout
    ``[E, hidden, 2 * expert_dim]`` / ``[E, expert_dim, hidden]`` with one scale per column (``[E, 1, N]`` /
    ``[E, N, 1]``, as transformers' FbgemmFp8Llama4TextExperts stores them)."""
    rng = np.random.default_rng(23)

    def per_row(w):  # fbgemm's quantize_fp8_per_row: amax of each row / 448
        s = np.maximum(np.abs(w).max(axis=-1, keepdims=True), 1e-6).astype(np.float32) / np.float32(448)
        return (w / s).astype(E4M3), s

    w = rng.standard_normal((72, 40)).astype(np.float32)
    codes, scale = per_row(w)
    experts = "model.layers.1.feed_forward.experts"
    E, hidden, dim = 3, 40, 24
    gate_up = rng.standard_normal((E, hidden, 2 * dim)).astype(np.float32)
    gu_codes_t, gu_scale = per_row(np.swapaxes(gate_up, 1, 2))          # quantized transposed, per column
    down = rng.standard_normal((E, dim, hidden)).astype(np.float32)
    dn_codes_t, dn_scale = per_row(np.swapaxes(down, 1, 2))
    gu_codes, dn_codes = np.ascontiguousarray(np.swapaxes(gu_codes_t, 1, 2)), np.ascontiguousarray(
        np.swapaxes(dn_codes_t, 1, 2))
    tensors = {Q + ".weight": codes, Q + ".weight_scale": scale,
               experts + ".gate_up_proj": gu_codes, experts + ".gate_up_proj_scale": gu_scale.reshape(E, 1, 2 * dim),
               experts + ".down_proj": dn_codes, experts + ".down_proj_scale": dn_scale.reshape(E, hidden, 1)}
    folder = write_model(tmp_path / "m", tensors, {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                                                   "modules_to_not_convert": ["lm_head"]})
    with ckptfs.open(folder) as ck:
        assert same_bits(ck[Q + ".weight"].numpy(), codes.astype(np.float32) * scale)
        view = ck[experts + ".gate_up_proj"]
        assert view.virtual and view.shape == (E, hidden, 2 * dim) and view.meta["scheme"] == "fbgemm_fp8"
        assert same_bits(view.numpy(), gu_codes.astype(np.float32) * gu_scale.reshape(E, 1, 2 * dim))
        assert same_bits(ck[experts + ".down_proj"].numpy(),
                         dn_codes.astype(np.float32) * dn_scale.reshape(E, 1, hidden))
        assert ck.stored(experts + ".down_proj").storage_type == "F8_E4M3"
        assert sorted(r["scheme"] for r in ck.packed_views) == ["fbgemm_fp8"] * 3


def test_modelopt_fp8_per_tensor_per_channel_and_mixed_precision(tmp_path):
    """ModelOpt FP8 exports: per-tensor ``weight_scale []`` (config.json ``quant_method: modelopt``), the older
    ``hf_quant_config.json`` with ``exclude_modules`` wildcards, and ``MIXED_PRECISION`` routing by
    ``quantized_layers`` (a layer it does not name keeps its stored tensor)."""
    import json

    rng = np.random.default_rng(24)
    w = rng.standard_normal((48, 80)).astype(np.float32)
    tensor_scale = np.array(np.abs(w).max() / 448, np.float32)
    codes = (w / tensor_scale).astype(E4M3)
    channel_scale = (np.abs(w).max(axis=1) / 448).astype(np.float32)
    channel_codes = (w / channel_scale[:, None]).astype(E4M3)
    input_scale = np.array(0.5, np.float32)
    tensors = {Q + ".weight": codes, Q + ".weight_scale": tensor_scale, Q + ".input_scale": input_scale,
               K + ".weight": channel_codes, K + ".weight_scale": channel_scale, K + ".input_scale": input_scale,
               "model.layers.0.self_attn.o_proj.weight": codes,
               "model.layers.0.self_attn.o_proj.weight_scale": tensor_scale}
    expected_q = codes.astype(np.float32) * tensor_scale
    expected_k = channel_codes.astype(np.float32) * channel_scale[:, None]

    folder = write_model(tmp_path / "a", tensors, {"quant_method": "modelopt", "quant_algo": "FP8",
                                                   "exclude_modules": ["lm_head"]})
    with ckptfs.open(folder) as ck:
        assert ck[Q + ".weight"].meta["scheme"] == "modelopt/FP8"
        assert same_bits(ck[Q + ".weight"].numpy(), expected_q)
        assert same_bits(ck[K + ".weight"].numpy(), expected_k)
        assert not ck[Q + ".input_scale"].virtual
    pytest.importorskip("torch")
    assert set(ckptfs.load(folder)) == {Q + ".weight", K + ".weight", "model.layers.0.self_attn.o_proj.weight"}

    folder = write_model(tmp_path / "b", tensors, None)
    (folder / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.19.0"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None,
                         "exclude_modules": ["*self_attn.o_proj"]}}))
    with ckptfs.open(folder) as ck:
        assert same_bits(ck[K + ".weight"].numpy(), expected_k)
        reason = ck["model.layers.0.self_attn.o_proj.weight"].meta["packed_view"]["reason"]
        assert reason == "layer is in the config's exclude_modules list (*self_attn.o_proj)"

    folder = write_model(tmp_path / "c", tensors, {
        "quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
        "quantized_layers": {Q: {"quant_algo": "FP8"}, K: {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}}})
    with ckptfs.open(folder) as ck:
        assert same_bits(ck[Q + ".weight"].numpy(), expected_q)
        assert ck[K + ".weight"].meta["parameters"]["quant_algo"] == "FP8_PER_CHANNEL_PER_TOKEN"
        assert same_bits(ck[K + ".weight"].numpy(), expected_k)
        o_proj = ck["model.layers.0.self_attn.o_proj.weight"]
        assert not o_proj.virtual
        assert o_proj.meta["packed_view"]["reason"] == "layer is not in the config's quantized_layers (MIXED_PRECISION)"



def test_an_unknown_format_or_a_group_without_one_serves_the_stored_tensors(tmp_path, caplog):
    """A compressed-tensors format no scheme serves, or a group whose format is not the scheme's: the views
    are absent with the reason (logged once for a config-wide one), the stored codes served as stored."""
    pytest.importorskip("compressed_tensors")
    rng = np.random.default_rng(25)
    weights = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}
    tensors, _ = ct_layer(rng, 32, 64, weights)
    stored = {f"{Q}.{k}": v for k, v in tensors.items()} | {f"{K}.{k}": v for k, v in tensors.items()}
    config = {**compressed_config({"group_0": {"targets": ["Linear"], "weights": weights}}),
              "format": "sparse-24-bitmask"}
    folder = write_model(tmp_path / "a", stored, config)
    with caplog.at_level("WARNING", logger="ckptfs.packed"), ckptfs.open(folder) as ck:
        for prefix in (Q, K):
            weight = ck[prefix + ".weight"]
            assert not weight.virtual and weight.raw() == tensors["weight"].tobytes()
            assert weight.meta["packed_view"]["reason"] == ("compressed-tensors format 'sparse-24-bitmask' is not "
                                                            "supported (in config.json quantization_config)")
    assert len([r for r in caplog.records if "no view" in r.getMessage()]) == 1
    config = {**compressed_config({"g": {"targets": [K], "weights": weights, "format": "float-quantized"},
                                   "h": {"targets": [Q], "weights": weights, "format": "pack-quantized"}}),
              "format": "mixed-precision"}
    folder = write_model(tmp_path / "b", stored, config)
    with ckptfs.open(folder) as ck:
        assert same_bits(ck[K + ".weight"].numpy(), expected_ct(tensors, (1, 64)))
        assert ck[Q + ".weight"].meta["packed_view"]["reason"] == \
            "config group h has format 'pack-quantized', not float-quantized or int-quantized or naive-quantized"


def test_a_mixed_precision_format_nobody_serves_costs_only_its_own_layers_their_views(tmp_path, caplog):
    """``mixed-precision`` with one group in an unsupported format: only the layers that group targets lose
    their views (one log line, the reason in their parts' ``meta.json``); the other groups' layers keep theirs.
    The unsupported group's layer stores parts another scheme's marker would claim (F8_E4M3 ``weight``, and
    a ``weight_packed`` on a third layer): routed by its group, it is not decoded as that scheme either."""
    pytest.importorskip("compressed_tensors")
    rng = np.random.default_rng(26)
    weights = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}
    tensors, _ = ct_layer(rng, 32, 64, weights)
    int4 = compressed_layer(rng, 32, 64, 4, "group", 32, True)
    v = "model.layers.0.self_attn.v_proj"
    stored = ({f"{Q}.{k}": val for k, val in tensors.items()} | {f"{K}.{k}": val for k, val in tensors.items()}
              | {f"{v}.{k}": val for k, val in int4.tensors.items()})
    config = {**compressed_config({
        "g": {"targets": [K], "weights": weights, "format": "float-quantized"},
        "h": {"targets": [Q, v], "weights": weights, "format": "sparse-24-bitmask"}}), "format": "mixed-precision"}
    folder = write_model(tmp_path / "m", stored, config)
    reason = "compressed-tensors format 'sparse-24-bitmask' is not supported (in config.json quantization_config)"
    with caplog.at_level("WARNING", logger="ckptfs.packed"), ckptfs.open(folder) as ck:
        assert ck[K + ".weight"].virtual
        assert same_bits(ck[K + ".weight"].numpy(), expected_ct(tensors, (1, 64)))
        weight = ck[Q + ".weight"]
        assert not weight.virtual and weight.raw() == tensors["weight"].tobytes()
        assert weight.meta["packed_view"] == {"name": Q + ".weight", "scheme": "compressed-tensors",
                                              "present": False, "reason": reason}
        assert v + ".weight" not in ck
        assert ck[v + ".weight_packed"].meta["packed_view"]["reason"] == reason
        assert ck[v + ".weight_packed"].raw() == int4.tensors["weight_packed"].tobytes()
        rows = {row["name"]: row for row in ck.packed_views}
        assert rows[K + ".weight"]["present"] and not rows[Q + ".weight"]["present"]
    assert len([r for r in caplog.records if "no view" in r.getMessage()]) == 1
