"""FP4/FP8 microscaling fixtures (NVFP4, MXFP4, MXFP8, gpt-oss) and the independent float32 formulas.

Producers: compressed-tensors layers are quantized by compressed-tensors itself (its observer math
``calculate_qparams`` / ``generate_gparam`` and its compressors' ``compress``), then a few scale bytes are
set to the format's edge codes (E8M0 0 and 255, an E4M3 NaN) so that the non-finite rules are exercised.
ModelOpt NVFP4 and gpt-oss layers are written with numpy + ml_dtypes as those checkpoints store them
(random codes and scales: their decoders take any byte). Folders are written by ``safetensors.torch``.

Formulas: each scheme's value in float32, computed here from ml_dtypes' float4/float8 types and numpy
(not from ckptfs' tables), in the order the reference implementation combines the factors. Oracles (the
reference implementations themselves): compressed-tensors' ``decompress``, transformers'
``convert_moe_packed_tensors``. Nothing here imports ckptfs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

CT_FORMATS = {"NVFP4": "nvfp4-pack-quantized", "MXFP4": "mxfp4-pack-quantized", "MXFP8": "mxfp8-quantized"}


# ----------------------------------------------------------------------------------- the formulas (float32)

def e2m1(codes: np.ndarray) -> np.ndarray:
    """u8 bytes of two E2M1 nibbles (low nibble first) -> float32 ``[..., 2 * n]`` via ml_dtypes."""
    nibbles = np.stack([codes & 15, codes >> 4], axis=-1).reshape(*codes.shape[:-1], -1)
    return nibbles.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)


def e4m3(codes: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(codes).view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def per_group(scales: np.ndarray, group: int) -> np.ndarray:
    return np.repeat(scales, group, axis=-1)


def nvfp4_formula(packed: np.ndarray, scale: np.ndarray, global_scale: np.ndarray, divide: bool) -> np.ndarray:
    """compressed-tensors: ``e2m1 * (e4m3 / global)``; ModelOpt: ``e2m1 * (e4m3 * scale_2)`` (float32)."""
    g = np.float32(global_scale.reshape(-1)[0])
    with np.errstate(all="ignore"):
        s = e4m3(scale) / g if divide else e4m3(scale) * g
        return e2m1(packed) * per_group(s, 16)


def ct_mx_formula(codes: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    """compressed-tensors MX: ``code * 2.0 ** (e - 127)`` (2^128 = +inf)."""
    with np.errstate(all="ignore"):
        s = np.exp2(scale.astype(np.float64) - 127).astype(np.float32)  # 2^128 overflows float32: +inf
        values = e2m1(codes) if bits == 4 else e4m3(codes)
        return values * per_group(s, 32)


def gptoss_formula(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``ldexp(e2m1, e - 127)`` as ``[E, in, out]`` (exact, then rounded once to float32)."""
    experts, out, columns, _ = blocks.shape
    values = e2m1(blocks.reshape(experts, out, columns * 16)).astype(np.float64)
    exact = np.ldexp(values, per_group(scales.astype(np.int32) - 127, 32))
    with np.errstate(over="ignore"):
        return exact.astype(np.float32).transpose(0, 2, 1).copy()


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 (nearest even), as float32."""
    return values.astype(ml_dtypes.bfloat16).astype(np.float32)


# -------------------------------------------------------------------------------------- compressed-tensors

def ct_layer(preset: str, out: int, in_features: int, seed: int, edge_scales: bool = True,
             scalar_global: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(config group, {name: torch tensor})`` of one layer quantized by compressed-tensors (``preset``:
    NVFP4, MXFP4, MXFP8), its weight random bf16 with one large outlier row."""
    import torch
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    scheme = preset_name_to_scheme(preset, ["Linear"])
    args = scheme.weights
    group = args.group_size
    weight = torch.randn(out, in_features, generator=torch.Generator().manual_seed(seed)) * 0.05
    weight[out // 2] *= 50
    weight = weight.to(torch.bfloat16)
    grouped = weight.float().reshape(out, in_features // group, group)
    global_scale = None
    if args.strategy == "tensor_group":
        global_scale = generate_gparam(weight.float().amin(), weight.float().amax())
    scale, _ = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args, global_scale=global_scale)
    state = {"weight": weight, "weight_scale": scale}
    if global_scale is not None:
        state["weight_global_scale"] = global_scale
    compressor = {"NVFP4": NVFP4PackedCompressor, "MXFP4": MXFP4PackedCompressor,
                  "MXFP8": MXFP8QuantizationCompressor}[preset]
    tensors = dict(compressor.compress(state, scheme))
    if edge_scales:
        s = tensors["weight_scale"].view(torch.uint8).clone()
        if preset == "NVFP4":
            s[0, 0] = 0x7F        # E4M3 NaN
            s[1, -1] = 0          # zero scale
        else:
            s[0, 0], s[1, -1], s[-1, 0] = 255, 0, 1
        tensors["weight_scale"] = s.view(tensors["weight_scale"].dtype)
    if scalar_global:
        tensors["weight_global_scale"] = tensors["weight_global_scale"].reshape(())
    config = scheme.model_dump()
    config["format"] = CT_FORMATS[preset]
    config["weights"]["scale_dtype"] = None  # as saved configs show it (a torch dtype is not JSON)
    if config.get("input_activations"):
        config["input_activations"]["scale_dtype"] = None
    return config, tensors


def ct_decompress(preset: str, config: dict[str, Any], tensors: dict[str, Any]) -> np.ndarray:
    """compressed-tensors' own ``decompress`` of the layer, as float32."""
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme

    compressor = {"NVFP4": NVFP4PackedCompressor, "MXFP4": MXFP4PackedCompressor,
                  "MXFP8": MXFP8QuantizationCompressor}[preset]
    scheme = QuantizationScheme(**{k: v for k, v in config.items() if k != "format"})
    return compressor.decompress(dict(tensors), scheme)["weight"].float().numpy()


def ct_config(groups: dict[str, dict[str, Any]], fmt: str, ignore: list[str] | None = None) -> dict[str, Any]:
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": groups, "ignore": ignore if ignore is not None else ["lm_head"], "version": "0.20.1"}


def as_numpy(tensor) -> np.ndarray:
    """A torch tensor's stored bytes as numpy (uint8 for the 8-bit floats)."""
    import torch

    if tensor.dtype in (torch.float8_e4m3fn, torch.uint8):
        return tensor.view(torch.uint8).numpy()
    return tensor.numpy()


# -------------------------------------------------------------------------------------------- the folder

def write_torch_folder(folder: str | Path, tensors: dict[str, Any], config: dict[str, Any],
                       files: dict[str, Any] | None = None) -> Path:
    """``model.safetensors`` (torch tensors, written by ``safetensors.torch``), ``config.json`` and any
    other JSON ``files``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    for name, doc in (files or {}).items():
        (folder / name).write_text(json.dumps(doc))
    return folder


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bits, where NaN matches any NaN (payloads and signs of NaN differ between torch's
    kernels and numpy's; the formulas do not define them)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    bits = {2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    return bool(np.array_equal(nan_a, nan_b) and np.array_equal(a.view(bits)[~nan_a], b.view(bits)[~nan_b]))


# ----------------------------------------------------------------------------------------------- gpt-oss

GPT_OSS_CONFIG = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


def gptoss_experts(rng: np.random.Generator, experts: int, out: int, in_features: int) -> dict[str, np.ndarray]:
    """One projection as gpt-oss stores it: ``_blocks`` U8 ``[E, out, in/32, 16]``, ``_scales`` U8
    ``[E, out, in/32]`` (exponents around 2^-7, with the edge bytes 0 and 255 in a few blocks), ``_bias``
    F32 ``[E, out]``."""
    columns = in_features // 32
    blocks = rng.integers(0, 256, (experts, out, columns, 16), dtype=np.uint8)
    scales = rng.integers(112, 130, (experts, out, columns), dtype=np.uint8)
    scales[0, 0, 0], scales[-1, 1, -1], scales[0, -1, 0] = 255, 0, 254
    bias = rng.standard_normal((experts, out)).astype(np.float32)
    return {"blocks": blocks, "scales": scales, "bias": bias}


def transformers_mxfp4(blocks: np.ndarray, scales: np.ndarray, dtype: str = "bfloat16") -> np.ndarray:
    """transformers' ``convert_moe_packed_tensors`` (the gpt-oss dequantization) as float32 ``[E, in, out]``."""
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    result = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                       dtype=getattr(torch, dtype))
    return result.float().numpy()


# ------------------------------------------------------------------------------------------ ModelOpt NVFP4

def modelopt_nvfp4_layer(rng: np.random.Generator, out: int, in_features: int, scalar: bool = True) -> dict[str, Any]:
    """A ModelOpt NVFP4 layer as ``nvidia/*-FP4`` exports store it (torch tensors): ``weight`` U8
    ``[out, in/2]`` (random nibbles), ``weight_scale`` F8_E4M3 ``[out, in/16]`` (positive E4M3 values, one
    NaN code), ``weight_scale_2`` and ``input_scale`` F32 (0-d, or ``[1]``)."""
    import torch

    codes = rng.integers(0, 256, (out, in_features // 2), dtype=np.uint8)
    scale = rng.uniform(0.01, 448.0, (out, in_features // 16)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    scale[0, 0] = 0x7F
    shape = () if scalar else (1,)
    return {"weight": torch.from_numpy(codes),
            "weight_scale": torch.from_numpy(scale.copy()).view(torch.float8_e4m3fn),
            "weight_scale_2": torch.tensor(rng.uniform(1e-4, 1e-2), dtype=torch.float32).reshape(shape),
            "input_scale": torch.tensor(rng.uniform(0.01, 1.0), dtype=torch.float32).reshape(shape)}


def modelopt_fp8_layer(rng: np.random.Generator, out: int, in_features: int) -> dict[str, Any]:
    """A ModelOpt FP8 layer: ``weight`` F8_E4M3, per-tensor ``weight_scale`` and ``input_scale`` F32 (0-d)."""
    import torch

    weight = rng.standard_normal((out, in_features)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return {"weight": torch.from_numpy(weight.copy()).view(torch.float8_e4m3fn),
            "weight_scale": torch.tensor(0.0123, dtype=torch.float32),
            "input_scale": torch.tensor(0.5, dtype=torch.float32)}
