"""transformers loads ``hf/`` of a quantized folder with no quantization library: ``from_pretrained(MNT/hf)``
on CPU gives logits bit-identical to a folder written from the oracle's dense tensors in the same dtype.

Tiny real-architecture models, quantized at test time: a Qwen3 in FP8 with 32 x 32 blocks (partial edge
tiles; the quantization written with numpy + ml_dtypes as Qwen3-FP8 stores it, BF16 scales; the oracle is
compressed-tensors' ``FP8BlockDequantizer``), a Llama in bitsandbytes nf4 with double quant (quantized and saved
by transformers + bitsandbytes on CPU; the oracle is bitsandbytes' own dequantization), and a gpt-oss in MXFP4
(random codes in the release's layout; the oracle is transformers' ``convert_moe_packed_tensors``).

Tiny Llamas whose producers stored activation and KV-cache scales beside the layers (compressed-tensors FP8
with a ``kv_cache_scheme``, ModelOpt NVFP4 with ``kv_cache_quant_algo``): hf/ holds exactly the model's
parameters, and transformers' loading info reports no key missing or unexpected.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOKENS = [[1, 5, 17, 42, 99, 3, 64, 127, 8, 0, 33, 71]]


def save_folder(folder: Path, config: dict, tensors: dict) -> Path:
    """A model folder: ``config.json`` and ``model.safetensors`` (torch tensors, written by safetensors)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def logits_and_state(folder: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16, device_map="cpu")
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor(TOKENS)).logits
    return logits, {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_loads_the_same(mnt: Path, dense: Path) -> None:
    config = json.loads((mnt / "hf" / "config.json").read_text())
    assert "quantization_config" not in config
    got, got_state = logits_and_state(mnt / "hf")
    want, want_state = logits_and_state(dense)
    assert got_state.keys() == want_state.keys()
    for name in want_state:
        assert torch.equal(got_state[name].view(torch.int16) if got_state[name].dtype == torch.bfloat16
                           else got_state[name], want_state[name].view(torch.int16)
                           if want_state[name].dtype == torch.bfloat16 else want_state[name]), name
    assert torch.isfinite(want).all()
    assert torch.equal(got, want)


def model_state(config) -> dict:
    """A randomly initialised model of ``config`` in bfloat16, as its release's state dict."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def fp8_block_quantize(weight, block: int):
    """Qwen3-FP8's quantization of one weight: per ``block`` x ``block`` tile (partial at the edges) ``s = amax
    / 448`` rounded to bfloat16, codes ``e4m3(w / s)``; (codes as torch float8_e4m3fn, scales bfloat16)."""
    w = weight.float().numpy()
    out, n = w.shape
    gh, gw = -(-out // block), -(-n // block)
    scales = np.empty((gh, gw), np.float32)
    codes = np.empty(w.shape, ml_dtypes.float8_e4m3fn)
    for i in range(gh):
        for j in range(gw):
            tile = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            s = float(np.array(max(float(np.abs(tile).max()), 1e-8) / 448.0, np.float32).astype(ml_dtypes.bfloat16))
            scales[i, j] = s
            codes[i * block:(i + 1) * block, j * block:(j + 1) * block] = (tile / s).astype(ml_dtypes.float8_e4m3fn)
    return (torch.from_numpy(codes.view(np.uint8).copy()).view(torch.float8_e4m3fn),
            torch.from_numpy(scales).to(torch.bfloat16))


def test_qwen3_fp8_block(tmp_path, mounted):
    converters = pytest.importorskip("compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer")
    from transformers import Qwen3Config

    config = Qwen3Config(hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=32, vocab_size=128, max_position_embeddings=64,
                         tie_word_embeddings=False)
    state = model_state(config)
    block = 32
    quantized, dense = {}, {}
    dequantizer = converters.FP8BlockDequantizer(weight_block_size=(block, block), dtype=torch.bfloat16,
                                                 targets=("Linear",))
    for name, value in state.items():
        if ".layers." in name and name.endswith("_proj.weight"):
            codes, scales = fp8_block_quantize(value, block)
            prefix = name[:-len(".weight")]
            quantized[name], quantized[prefix + ".weight_scale_inv"] = codes, scales
            out = dequantizer.process({"m.weight": codes, "m.weight_scale_inv": scales})
            dense[name] = out["m.weight"]
        else:
            quantized[name] = dense[name] = value
    doc = config.to_dict()
    doc["dtype"] = "bfloat16"
    save_folder(tmp_path / "dense", doc, dense)
    doc = {**doc, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                          "weight_block_size": [block, block]}}
    save_folder(tmp_path / "fp8", doc, quantized)
    assert_loads_the_same(mounted(str(tmp_path / "fp8"), "--hf"), tmp_path / "dense")


def test_llama_bitsandbytes_nf4_double_quant(tmp_path, mounted):
    pytest.importorskip("bitsandbytes")
    from packed.bnb_fixtures import dequantize_4bit, saved_by_transformers, stored_layers
    from safetensors.torch import load_file

    quantized = saved_by_transformers(tmp_path, 4, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    layers = stored_layers(quantized)
    assert layers and all("weight.nested_absmax" in parts for parts in layers.values())
    stored = load_file(str(quantized / "model.safetensors"))
    dense = {}
    for name, value in stored.items():
        prefix = name.split(".weight")[0]
        if prefix in layers:
            if name == prefix + ".weight":
                dense[name] = dequantize_4bit(layers[prefix], torch.float32).to(torch.bfloat16)
        else:
            dense[name] = value
    doc = json.loads((quantized / "config.json").read_text())
    doc.pop("quantization_config")
    save_folder(tmp_path / "dense-bnb", doc, dense)
    assert_loads_the_same(mounted(str(quantized), "--hf"), tmp_path / "dense-bnb")


def test_gpt_oss_mxfp4(tmp_path, mounted):
    from fp4_fixtures import GPT_OSS_CONFIG
    from transformers import GptOssConfig
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    config = GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=32, vocab_size=128, num_local_experts=4,
                          num_experts_per_tok=2, max_position_embeddings=64, sliding_window=16,
                          layer_types=["sliding_attention", "full_attention"])
    state = model_state(config)
    rng = np.random.default_rng(1)
    quantized, dense = {}, {}
    for name, value in state.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            experts, n_in, n_out = value.shape           # the release's layout: [E, in, out]
            blocks = torch.from_numpy(rng.integers(0, 256, (experts, n_out, n_in // 32, 16), dtype=np.uint8))
            scales = torch.from_numpy(rng.integers(119, 125, (experts, n_out, n_in // 32), dtype=np.uint8))
            quantized[name + "_blocks"], quantized[name + "_scales"] = blocks, scales
            dense[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
            assert dense[name].shape == value.shape
        else:
            quantized[name] = dense[name] = value
    doc = config.to_dict()
    doc["dtype"] = "bfloat16"
    save_folder(tmp_path / "dense", doc, dense)
    save_folder(tmp_path / "mxfp4", {**doc, "quantization_config": GPT_OSS_CONFIG}, quantized)
    assert_loads_the_same(mounted(str(tmp_path / "mxfp4"), "--hf"), tmp_path / "dense")


def load_info(folder: Path) -> dict:
    """transformers' loading info of ``folder`` (``output_loading_info=True``): the keys it reports as
    missing, unexpected or mismatched."""
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16, device_map="cpu",
                                                   output_loading_info=True)
    return {key: sorted(value) for key, value in info.items() if key != "error_msgs"}


def assert_no_scheme_part(mnt: Path, folder: Path, state: dict) -> None:
    """hf/ holds exactly the model's parameters (the release's names: no activation or KV-cache scale), as
    ``ckptfs.load(folder)`` does, and transformers reports no key as missing or unexpected."""
    import ckptfs
    from safetensors import safe_open

    with safe_open(str(mnt / "hf" / "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
    assert names == sorted(state)
    assert sorted(ckptfs.load(str(folder))) == names
    assert load_info(mnt / "hf") == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}


def tiny_llama():
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=32, vocab_size=128, max_position_embeddings=64,
                       tie_word_embeddings=False)


def test_compressed_tensors_fp8_with_a_kv_cache_scheme(tmp_path, mounted):
    """A compressed-tensors FP8 folder (static per-tensor weights and activations) whose ``kv_cache_scheme``
    stored ``self_attn.k_scale``/``v_scale`` (and, as older exports did, ``k_proj.output_scale``): hf/ holds
    none of them, and loads bit-identical to a folder of compressed-tensors' own decompression."""
    from compressed_tensors.compressors.naive_quantized.base import NaiveQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    config = tiny_llama()
    state = model_state(config)
    fp8 = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}
    scheme = QuantizationScheme(targets=["Linear"], weights=fp8, input_activations=fp8)
    quantized, dense = {}, {}
    for name, value in state.items():
        if ".layers." in name and name.endswith("_proj.weight"):
            prefix = name[:-len(".weight")]
            scale = (value.float().abs().max() / 448).reshape(1)
            codes = (value.float() / scale).to(torch.float8_e4m3fn)
            quantized[name], quantized[prefix + ".weight_scale"] = codes, scale
            quantized[prefix + ".input_scale"] = torch.tensor([0.02], dtype=torch.float32)
            out = NaiveQuantizationCompressor.decompress({"weight": codes, "weight_scale": scale}, scheme)
            dense[name] = out["weight"].to(torch.bfloat16)
        else:
            quantized[name] = dense[name] = value
    for layer in range(config.num_hidden_layers):
        attn = f"model.layers.{layer}.self_attn"
        quantized[attn + ".k_scale"] = torch.tensor([0.05], dtype=torch.bfloat16)
        quantized[attn + ".v_scale"] = torch.tensor([0.03], dtype=torch.bfloat16)
    quantized["model.layers.0.self_attn.k_proj.output_scale"] = torch.tensor([0.05], dtype=torch.float32)
    doc = config.to_dict()
    doc["dtype"] = "bfloat16"
    save_folder(tmp_path / "dense", doc, dense)
    group = {"targets": ["Linear"], "weights": fp8, "input_activations": fp8, "format": "float-quantized"}
    settings = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": group}, "ignore": ["lm_head"], "kv_cache_scheme": fp8}
    save_folder(tmp_path / "ct", {**doc, "quantization_config": settings}, quantized)
    mnt = mounted(str(tmp_path / "ct"), "--hf")
    assert_no_scheme_part(mnt, tmp_path / "ct", state)
    assert_loads_the_same(mnt, tmp_path / "dense")


def test_modelopt_nvfp4_with_kv_cache_scales(tmp_path, mounted):
    """A ModelOpt NVFP4 export with an FP8 KV cache (``kv_cache_quant_algo``): ``k_proj.k_scale`` and
    ``v_proj.v_scale`` beside each layer's ``input_scale``; hf/ holds none of them."""
    from fp4_fixtures import modelopt_nvfp4_layer

    config = tiny_llama()
    state = model_state(config)
    rng = np.random.default_rng(2)
    quantized = {}
    for name, value in state.items():
        if ".layers." in name and name.endswith("_proj.weight"):
            prefix = name[:-len(".weight")]
            out, n_in = value.shape
            for role, part in modelopt_nvfp4_layer(rng, out, n_in).items():
                quantized[f"{prefix}.{role}"] = part
            if prefix.endswith(("k_proj", "v_proj")):
                kind = prefix[-6]
                quantized[f"{prefix}.{kind}_scale"] = torch.tensor(0.04, dtype=torch.float32)
        else:
            quantized[name] = value
    doc = {**config.to_dict(), "dtype": "bfloat16"}
    hf_quant = {"producer": {"name": "modelopt", "version": "0.29.0"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                                 "exclude_modules": ["lm_head"]}}
    folder = save_folder(tmp_path / "modelopt", doc, quantized)
    (folder / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    assert_no_scheme_part(mounted(str(folder), "--hf"), folder, state)
