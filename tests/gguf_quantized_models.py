"""Tiny quantized Hugging Face folders made at test time in the layouts the releases store, for
``gguf/model.gguf`` against llama.cpp's converter.

Each starts as a tiny BF16 folder (``gguf_view_models``) whose projection weights are then replaced by the
scheme's parts, written with torch (its ``float8_e4m3fn``) and ``safetensors`` as those checkpoints store
them: Qwen3-*-FP8's fine-grained FP8 (``weight`` F8_E4M3, ``weight_scale_inv`` per block, BF16; or one F32
scale per tensor), compressed-tensors ``float-quantized`` FP8 and ``nvfp4-pack-quantized`` (llm-compressor's
``*-FP8-dynamic`` and ``*-NVFP4``), NVIDIA ModelOpt ``NVFP4`` and ``MIXED_PRECISION``. The NVFP4 codes and
group scales are random (the values are what they are; the comparison is of bytes and of greedy tokens), with
per-tensor and activation scales that are not 1, so the converter writes its companion ``.scale`` and
``.input_scale`` tensors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import REPO

sys.path.append(str(REPO / "scripts"))
import fp8_folder as fp8_folder_script

PROJECTION = fp8_folder_script.PROJECTION


def _rewrite(folder: Path, quantize, quantization_config: dict) -> Path:
    """Replace each projection weight of ``folder/model.safetensors`` by ``quantize(name, weight)``'s parts
    (a dict name -> tensor) and set the config's ``quantization_config``."""
    import torch
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        out.update(quantize(name, value) if PROJECTION.match(name) else {name: value})
    save_file(out, path, metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def fp8_folder(folder: Path, block: tuple[int, int] | None) -> Path:
    """Qwen3-*-FP8's layout: each projection's ``weight`` F8_E4M3 and ``weight_scale_inv``, per ``block``
    (BF16 ``[ceil(out / bh), ceil(in / bw)]``, the edge blocks partial) or one F32 scale for the tensor
    (0-d): scripts/fp8_folder.py, which the benchmark uses too."""
    return fp8_folder_script.convert_folder(folder, block)


def _nvfp4_parts(weight, seed: int):
    """Random E2M1 codes (two a byte, element ``2i`` low) and E4M3 group scales for a weight's shape."""
    import torch

    out, cols = weight.shape
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (out, cols // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    scales = (0.25 + 0.25 * torch.rand(out, cols // 16, generator=gen)).to(torch.float8_e4m3fn)
    return codes, scales


def nvfp4_compressed_folder(folder: Path) -> Path:
    """compressed-tensors ``nvfp4-pack-quantized``: ``weight_packed`` U8, ``weight_scale`` F8_E4M3 per 16,
    ``weight_global_scale`` and ``input_global_scale`` F32 ``[1]``; ``lm_head`` ignored."""
    import torch

    seeds = iter(range(1000))

    def quantize(name: str, weight):
        codes, scales = _nvfp4_parts(weight, next(seeds))
        base = name.removesuffix(".weight")
        return {base + ".weight_packed": codes, base + ".weight_scale": scales,
                base + ".weight_global_scale": torch.tensor([2.0]),
                base + ".input_global_scale": torch.tensor([4.0])}

    scheme = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True,
              "dynamic": False, "observer": "minmax"}
    settings = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                "quantization_status": "compressed", "ignore": ["lm_head"],
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": scheme,
                                              "input_activations": {**scheme, "dynamic": "local"},
                                              "format": "nvfp4-pack-quantized"}}}
    return _rewrite(folder, quantize, settings)


def nvfp4_modelopt_folder(folder: Path) -> Path:
    """NVIDIA ModelOpt ``NVFP4``: ``weight`` U8, ``weight_scale`` F8_E4M3 per 16, ``weight_scale_2`` and
    ``input_scale`` F32 0-d; ``lm_head`` excluded."""
    import torch

    seeds = iter(range(1000))

    def quantize(name: str, weight):
        codes, scales = _nvfp4_parts(weight, next(seeds))
        base = name.removesuffix(".weight")
        return {name: codes, base + ".weight_scale": scales, base + ".weight_scale_2": torch.tensor(0.5),
                base + ".input_scale": torch.tensor(0.25)}

    settings = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                "exclude_modules": ["lm_head"]}
    return _rewrite(folder, quantize, settings)


def modelopt_mixed_folder(folder: Path) -> Path:
    """ModelOpt ``MIXED_PRECISION``: the attention projections in NVFP4 (as ``nvfp4_modelopt_folder``), the
    MLP ones in FP8 (``weight`` F8_E4M3, one F32 ``weight_scale``, an ``input_scale``), each layer named in
    ``quantized_layers`` with its ``quant_algo``."""
    import torch

    seeds = iter(range(1000))
    layers: dict[str, dict] = {}

    def quantize(name: str, weight):
        base = name.removesuffix(".weight")
        if ".mlp." in name:
            codes, scale = fp8_folder_script.quantize(weight, None)
            layers[base] = {"quant_algo": "FP8"}
            return {name: codes, base + ".weight_scale": scale.float(), base + ".input_scale": torch.tensor(0.5)}
        codes, scales = _nvfp4_parts(weight, next(seeds))
        layers[base] = {"quant_algo": "NVFP4", "group_size": 16}
        return {name: codes, base + ".weight_scale": scales, base + ".weight_scale_2": torch.tensor(0.25),
                base + ".input_scale": torch.tensor(2.0)}

    settings = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": layers,
                "exclude_modules": ["lm_head"]}
    return _rewrite(folder, quantize, settings)


def ct_fp8_folder(folder: Path, block: tuple[int, int] | None) -> Path:
    """compressed-tensors ``float-quantized`` (llm-compressor's ``*-FP8-dynamic`` / ``*-FP8-block``): each
    projection's ``weight`` F8_E4M3 and a BF16 ``weight_scale``, per output channel ``[out, 1]`` or per
    ``block`` (``block_structure``)."""
    import torch

    def quantize(name: str, weight):
        w = weight.float()
        if block is None:
            scale = (w.abs().amax(dim=1, keepdim=True) / fp8_folder_script.E4M3_MAX).bfloat16()
            full = scale.float()
        else:
            scale, full = fp8_folder_script.block_scales(w, block)
        codes = (w / full).clamp(-fp8_folder_script.E4M3_MAX, fp8_folder_script.E4M3_MAX).to(torch.float8_e4m3fn)
        return {name: codes, name.removesuffix(".weight") + ".weight_scale": scale}

    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
               "strategy": "channel" if block is None else "block",
               **({"block_structure": list(block)} if block else {})}
    settings = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
                "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                                                     "format": "float-quantized"}}}
    return _rewrite(folder, quantize, settings)


def gptq_folder(folder: Path, desc_act: bool = True) -> Path:
    """GPTQ v1 4-bit (AutoGPTQ's layout: ``qweight`` I32 ``[in / 8, out]``, ``qzeros`` minus one, F16
    ``scales``, ``g_idx`` permuted when ``desc_act``), groups of 32; made by ``packed_fixtures.gptq_layer``."""
    import numpy as np
    import torch
    from packed_fixtures import gptq_layer

    rng = np.random.default_rng(21)

    def quantize(name: str, weight):
        out, cols = weight.shape
        layer = gptq_layer(rng, out, cols, 4, 32, desc_act=desc_act)
        base = name.removesuffix(".weight")
        return {f"{base}.{part}": torch.from_numpy(np.ascontiguousarray(value)) for part, value in layer.tensors.items()}

    settings = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": desc_act, "sym": True,
                "checkpoint_format": "gptq"}
    return _rewrite(folder, quantize, settings)


def ct_pack_folder(folder: Path) -> Path:
    """compressed-tensors ``pack-quantized`` int4 (llm-compressor's ``*-W4A16``): ``weight_packed`` I32 by
    compressed-tensors' own ``pack_to_int32``, BF16 ``weight_scale`` per group of 32, ``weight_shape``;
    made by ``packed_fixtures.compressed_layer``."""
    import numpy as np
    import torch
    from packed_fixtures import compressed_config, compressed_layer, compressed_scheme

    rng = np.random.default_rng(22)

    def tensor(value: np.ndarray):
        if value.dtype.name == "bfloat16":
            return torch.from_numpy(np.ascontiguousarray(value).view(np.uint16).astype(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(value))

    def quantize(name: str, weight):
        out, cols = weight.shape
        layer = compressed_layer(rng, out, cols, 4, "group", 32, True)
        base = name.removesuffix(".weight")
        return {f"{base}.{part}": tensor(value) for part, value in layer.tensors.items()}

    return _rewrite(folder, quantize, compressed_config({"group_0": compressed_scheme(4, "group", 32, True)}))
