"""Packed-checkpoint fixtures (GPTQ, AWQ, compressed-tensors) and the reference dequantizers the tests trust.

Writers: random integer weights, zero points and scales (no calibration needed) are packed by the loops
below, transcribed from the packers the schemes publish (AutoGPTQ ``QuantLinear.pack``, AutoAWQ
``WQLinear_GEMM/GEMV.from_linear``) one packed position at a time, and written as a model folder (a
safetensors file by the ``safetensors`` library + ``config.json``). compressed-tensors layers are packed by
compressed-tensors' own ``pack_to_int32``.

Oracles: AutoGPTQ's torch dequantization (``qlinear_cuda.QuantLinear.forward`` on an identity input: its
``scales[g_idx] * (weight - zeros[g_idx])`` matrix comes out unchanged), AutoAWQ's ``dequantize_gemm`` and
compressed-tensors' ``PackedQuantizationCompressor.decompress``. AutoGPTQ and AutoAWQ are installed without
their CUDA dependencies, so the modules holding these functions are loaded from their files (their package
``__init__`` imports accelerate and more). Nothing here imports ckptfs.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


@dataclass
class Layer:
    """One packed layer: its stored tensors (without the prefix) and the integers they were packed from."""

    tensors: dict[str, np.ndarray]
    q: np.ndarray                        # [out, in] integer weights as the scheme subtracts them
    zeros: np.ndarray                    # [out, in] the zero point subtracted from each weight
    scales: np.ndarray                   # [out, in] float32 scale of each weight
    extra: dict[str, Any] = field(default_factory=dict)

    def expected(self, scale_dtype: str = "float16") -> np.ndarray:
        """``(q - z) * s`` computed in ``scale_dtype`` as the references do, as float32 ``[out, in]``."""
        import torch

        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[scale_dtype]
        diff = torch.from_numpy((self.q.astype(np.int32) - self.zeros.astype(np.int32)).astype(np.float32))
        return (diff.to(dtype) * torch.from_numpy(self.scales).to(dtype)).float().numpy()


# ----------------------------------------------------------------------------------------------- packing

def pack_dense(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack ``values[count, ...]`` (unsigned, < 2^bits) along axis 0: value ``k`` at bit ``bits * k`` of
    the words read as one little-endian bit string (AutoGPTQ's 2/3/4/8-bit loops all come to this; its
    3-bit loop writes values 10 and 21 across two words). Returns int32 ``[ceil(count * bits / 32), ...]``."""
    count = values.shape[0]
    words = np.zeros((math.ceil(count * bits / 32),) + values.shape[1:], np.uint64)
    v = values.astype(np.uint64)
    for k in range(count):
        word, offset = divmod(bits * k, 32)
        words[word] |= (v[k] << np.uint64(offset)) & np.uint64(0xFFFFFFFF)
        if offset + bits > 32:
            words[word + 1] |= v[k] >> np.uint64(32 - offset)
    return words.astype(np.uint32).view(np.int32)


def pack_awq(values: np.ndarray, order: list[int]) -> np.ndarray:
    """AutoAWQ's column packing: ``values[rows, 8c]`` (4-bit) -> int32 ``[rows, c]``, nibble ``i`` of word
    ``c`` holding column ``8c + order[i]`` (GEMM order, or the identity for GEMV)."""
    rows, cols = values.shape
    out = np.zeros((rows, math.ceil(cols / 8)), np.uint32)
    for col in range(out.shape[1]):
        for i in range(8):
            if col * 8 + order[i] < cols:
                out[:, col] |= values[:, col * 8 + order[i]].astype(np.uint32) << np.uint32(4 * i)
    return out.view(np.int32)


def _scales(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    values = (rng.uniform(0.002, 0.05, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)
    if dtype == "float16":
        return values.astype(np.float16)
    if dtype == "bfloat16":
        import ml_dtypes
        return values.astype(ml_dtypes.bfloat16)
    return values


# ------------------------------------------------------------------------------------------------- GPTQ

def gptq_layer(rng: np.random.Generator, out: int, in_features: int, bits: int, group_size: int,
               desc_act: bool = False, v2: bool = False, with_g_idx: bool = True,
               zero_range: tuple[int, int] | None = None) -> Layer:
    """A GPTQ layer. v1 stores each zero point minus one (AutoGPTQ's ``zeros -= 1`` before packing)."""
    gsize = in_features if group_size == -1 else group_size
    groups = math.ceil(in_features / gsize)
    q = rng.integers(0, 2 ** bits, (in_features, out))
    lo, hi = zero_range if zero_range is not None else ((1, 2 ** bits) if not v2 else (0, 2 ** bits))
    z = rng.integers(lo, hi, (groups, out))
    scales = _scales(rng, (groups, out), "float16")
    g_idx = np.arange(in_features) // gsize
    if desc_act:
        g_idx = rng.permutation(g_idx)
    stored_z = z if v2 else (z - 1) & (2 ** bits - 1)
    tensors = {"qweight": pack_dense(q, bits), "qzeros": pack_dense(stored_z.T, bits).T.copy(),
               "scales": scales}
    if with_g_idx:
        tensors["g_idx"] = g_idx.astype(np.int32)
    zeros_used = z if v2 else stored_z + 1  # what a v1 reader subtracts: the stored field plus one
    return Layer(tensors, q.T.copy(), zeros_used[g_idx].T.copy(), scales.astype(np.float32)[g_idx].T.copy(),
                 {"g_idx": g_idx, "bits": bits, "group_size": group_size})


def autogptq_dequantize(tensors: dict[str, np.ndarray], bits: int, group_size: int) -> np.ndarray:
    """AutoGPTQ's own torch dequantization (``qlinear_cuda``, v1 format) as float32 ``[out, in]``."""
    import torch

    module = _load_module("auto_gptq", "nn_modules/qlinear/qlinear_cuda.py", "_ref_autogptq_qlinear_cuda")
    in_features = tensors["g_idx"].shape[0]
    out = tensors["scales"].shape[1]
    layer = module.QuantLinear(bits, group_size, in_features, out, bias=False)
    for name in ("qweight", "qzeros", "scales", "g_idx"):
        getattr(layer, name).copy_(torch.from_numpy(np.ascontiguousarray(tensors[name])))
    with torch.no_grad():
        weights = layer(torch.eye(in_features, dtype=torch.float16))  # x @ W^T-as-stored = the [in, out] matrix
    return weights.float().numpy().T.copy()


# -------------------------------------------------------------------------------------------------- AWQ

def awq_gemm_layer(rng: np.random.Generator, out: int, in_features: int, group_size: int) -> Layer:
    gsize = in_features if group_size == -1 else group_size
    groups = in_features // gsize
    q = rng.integers(0, 16, (in_features, out))
    z = rng.integers(0, 16, (groups, out))
    scales = _scales(rng, (groups, out), "float16")
    g = np.arange(in_features) // gsize
    tensors = {"qweight": pack_awq(q, AWQ_ORDER), "qzeros": pack_awq(z, AWQ_ORDER), "scales": scales}
    return Layer(tensors, q.T.copy(), z[g].T.copy(), scales.astype(np.float32)[g].T.copy())


def awq_gemv_layer(rng: np.random.Generator, out: int, in_features: int, group_size: int) -> Layer:
    gsize = in_features if group_size == -1 else group_size
    groups = in_features // gsize
    width = _awq_zeros_width(in_features, gsize)
    q = rng.integers(0, 16, (out, in_features))
    z = rng.integers(0, 16, (out, groups))
    scales = np.zeros((out, width * 8), np.float16)
    scales[:, :groups] = _scales(rng, (out, groups), "float16")
    qzeros = np.zeros((out, width), np.int32)
    qzeros[:, : math.ceil(groups / 8)] = pack_awq(z, list(range(8)))
    tensors = {"qweight": pack_awq(q, list(range(8))), "qzeros": qzeros, "scales": scales}
    g = np.arange(in_features) // gsize
    return Layer(tensors, q, z[:, g], scales[:, :groups].astype(np.float32)[:, g])


def _awq_zeros_width(in_features: int, group_size: int) -> int:
    """AutoAWQ's ``calculate_zeros_width``: groups rounded up to whole words, then to the kernel's multiple."""
    multiplier = 1 if group_size >= 128 else {64: 2, 32: 4}[group_size]
    width = math.ceil(in_features // group_size / 8)
    return math.ceil(width / multiplier) * multiplier


def autoawq_dequantize_gemm(tensors: dict[str, np.ndarray], group_size: int) -> np.ndarray:
    """AutoAWQ's ``dequantize_gemm`` (fp16) as float32 ``[out, in]``."""
    import torch

    module = _load_module("awq", "utils/packing_utils.py", "_ref_awq_packing_utils")
    in_features = tensors["qweight"].shape[0]
    gsize = in_features if group_size == -1 else group_size
    weight = module.dequantize_gemm(torch.from_numpy(tensors["qweight"]), torch.from_numpy(tensors["qzeros"]),
                                    torch.from_numpy(tensors["scales"]), 4, gsize)
    return weight.float().numpy().T.copy()


# ------------------------------------------------------------------------------------- compressed-tensors

def compressed_layer(rng: np.random.Generator, out: int, in_features: int, bits: int, strategy: str,
                     group_size: int | None, symmetric: bool, scale_dtype: str = "bfloat16") -> Layer:
    """A pack-quantized layer packed by compressed-tensors' own ``pack_to_int32``."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    groups = in_features // group_size if strategy == "group" else 1
    rows = out if strategy != "tensor" else 1
    q = rng.integers(-(2 ** (bits - 1)), 2 ** (bits - 1), (out, in_features))
    scales = _scales(rng, (rows, groups), scale_dtype)
    tensors: dict[str, np.ndarray] = {
        "weight_packed": pack_to_int32(torch.from_numpy(q.astype(np.int8)), bits).numpy(),
        "weight_scale": scales.reshape(-1) if strategy == "tensor" else scales,
        "weight_shape": np.array([out, in_features], np.int64),
    }
    z = np.zeros((rows, groups), np.int64)
    if not symmetric:
        z = rng.integers(-(2 ** (bits - 1)), 2 ** (bits - 1), (rows, groups))
        if strategy == "tensor":
            tensors["weight_zero_point"] = z.reshape(-1).astype(np.int8)
        else:
            tensors["weight_zero_point"] = pack_to_int32(torch.from_numpy(z.astype(np.int8)), bits,
                                                         packed_dim=0).numpy()
    gsize = group_size if strategy == "group" else in_features
    g = np.arange(in_features) // gsize
    def full(per_group: np.ndarray) -> np.ndarray:
        return np.broadcast_to(per_group, (out, groups))[:, g]

    return Layer(tensors, q, full(z), full(scales.astype(np.float32)),
                 {"scheme": compressed_scheme(bits, strategy, group_size, symmetric)})


def compressed_scheme(bits: int, strategy: str, group_size: int | None, symmetric: bool) -> dict[str, Any]:
    weights: dict[str, Any] = {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": strategy,
                               "dynamic": False, "actorder": None, "observer": "minmax"}
    if strategy == "group":
        weights["group_size"] = group_size
    return {"targets": ["Linear"], "weights": weights, "input_activations": None, "output_activations": None}


def compressed_config(groups: dict[str, dict[str, Any]], ignore: list[str] | None = None) -> dict[str, Any]:
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": groups, "ignore": ignore or ["lm_head"], "version": "0.20.1"}


def compressed_dequantize(tensors: dict[str, np.ndarray], scheme: dict[str, Any]) -> np.ndarray:
    """compressed-tensors' own ``PackedQuantizationCompressor.decompress`` as float32 ``[out, in]``."""
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    state = {}
    for name, value in tensors.items():
        if value.dtype.name == "bfloat16":
            state[name] = torch.from_numpy(value.view(np.uint16).astype(np.int32)).to(torch.int16).view(torch.bfloat16)
        else:
            state[name] = torch.from_numpy(np.ascontiguousarray(value))
    result = PackedQuantizationCompressor.decompress(state, QuantizationScheme(**scheme))
    return result["weight"].float().numpy()


# ------------------------------------------------------------------------------------------- the folder

def write_folder(folder: str | Path, layers: dict[str, dict[str, np.ndarray]],
                 quantization_config: dict[str, Any] | None, *, config_file: str = "config.json",
                 extra_tensors: dict[str, np.ndarray] | None = None) -> Path:
    """A model folder: ``model.safetensors`` with every layer's tensors under ``PREFIX.NAME``, plus the
    quantization settings in ``config.json`` (``quantization_config``) or in ``quantize_config.json``."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    flat = {f"{prefix}.{name}": np.ascontiguousarray(value)
            for prefix, tensors in layers.items() for name, value in tensors.items()}
    flat.update(extra_tensors or {})
    save_file(flat, str(folder / "model.safetensors"))
    config: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    if quantization_config is not None:
        if config_file == "config.json":
            config["quantization_config"] = quantization_config
        else:
            (folder / config_file).write_text(json.dumps(quantization_config))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def require_package(package: str) -> None:
    """Skip (fail under CI=true) when ``package`` is not installed. ``pytest.importorskip`` cannot be the
    guard for auto_gptq / awq: their package ``__init__`` needs accelerate and a matching transformers."""
    from conftest import skip_or_fail

    if importlib.util.find_spec(package) is None:
        skip_or_fail(f"{package} is not installed")


def _load_module(package: str, relative: str, as_name: str):
    """A module of an installed package, loaded from its file without running the package's ``__init__``."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{package} is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    module_spec = importlib.util.spec_from_file_location(as_name, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module

def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bits (NaN payloads and signed zeros included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    unsigned = {2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    return np.array_equal(a.view(unsigned), b.view(unsigned))


def check_shared(folder, name: str, expected: np.ndarray, shared_dir) -> None:
    """``Tensor.shared()`` of view ``name`` maps one read-only decoded copy: a second open with the same
    cache folder maps it again without decoding anything."""
    import ckptfs

    with ckptfs.open(folder, cache_dir=str(shared_dir)) as ck:
        values = ck[name].shared()
        assert not values.flags.writeable and same_bits(np.asarray(values), expected)
    with ckptfs.open(folder, cache_dir=str(shared_dir)) as ck:
        assert same_bits(np.asarray(ck[name].shared()), expected)
        assert ck.cache.decoded_bytes == 0
