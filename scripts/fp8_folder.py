"""Turn a BF16 Hugging Face model folder's projection weights into fine-grained FP8 in place, in the layout
Qwen3-*-FP8 and DeepSeek-V3 release: each ``model.layers.N.{self_attn,mlp}.*_proj.weight`` becomes
F8_E4M3 codes with a ``weight_scale_inv`` beside it, and ``config.json`` gets ``quantization_config``
``{"quant_method": "fp8", "weight_block_size": [bh, bw], ...}``.

With a block, the scale of each ``bh x bw`` tile (partial at the edges) is its largest magnitude / 448 in
BF16 (Qwen3's scale type); without one, one F32 scale (0-d) for the tensor. The codes are the weight
divided by the scale, clamped to E4M3's range and cast (torch's ``float8_e4m3fn``), as the producers do.

Used by the gguf-view tests (tiny folders) and ``python -m benchmarks gguf_view --scheme fp8``.

Usage: python scripts/fp8_folder.py FOLDER [--block 128 128 | --per-tensor]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

PROJECTION = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight$")
E4M3_MAX = 448.0


def block_scales(weight, block: tuple[int, int]):
    """The BF16 scale grid ``[ceil(out / bh), ceil(in / bw)]`` of a float32 weight and that grid repeated
    over the weight's shape (as float32)."""
    import torch

    bh, bw = block
    out, cols = weight.shape
    gh, gw = -(-out // bh), -(-cols // bw)
    padded = torch.zeros(gh * bh, gw * bw)
    padded[:out, :cols] = weight.abs()
    grid = (padded.reshape(gh, bh, gw, bw).amax(dim=(1, 3)) / E4M3_MAX).to(torch.bfloat16)
    full = grid.float().repeat_interleave(bh, 0).repeat_interleave(bw, 1)[:out, :cols]
    return grid, full


def quantize(weight, block: tuple[int, int] | None) -> tuple:
    """(E4M3 codes, stored scale) of one weight."""
    import torch

    w = weight.float()
    if block is None:
        scale = (w.abs().max() / E4M3_MAX).reshape(())
        full = scale
    else:
        scale, full = block_scales(w, block)
    full = torch.where(full == 0, torch.ones_like(full), full)
    codes = (w / full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def convert_folder(folder: Path, block: tuple[int, int] | None) -> Path:
    """Quantize every safetensors file of ``folder`` in place and write the config's settings."""
    from safetensors.torch import load_file, save_file

    for path in sorted(folder.glob("*.safetensors")):
        tensors = load_file(path)
        out = {}
        for name, value in tensors.items():
            if PROJECTION.match(name) and value.ndim == 2:
                codes, scale = quantize(value, block)
                out[name], out[name + "_scale_inv"] = codes, scale
            else:
                out[name] = value
        save_file(out, path, metadata={"format": "pt"})
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        weight_map = data["weight_map"]
        for name, file in list(weight_map.items()):
            if PROJECTION.match(name):
                weight_map[name + "_scale_inv"] = file
        index.write_text(json.dumps(data, indent=2))
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    settings: dict = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3"}
    if block is not None:
        settings["weight_block_size"] = list(block)
    config["quantization_config"] = settings
    config_path.write_text(json.dumps(config, indent=2))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--block", type=int, nargs=2, default=(128, 128), metavar=("BH", "BW"))
    parser.add_argument("--per-tensor", action="store_true", help="one F32 scale per tensor instead of blocks")
    args = parser.parse_args()
    convert_folder(args.folder, None if args.per_tensor else tuple(args.block))


if __name__ == "__main__":
    main()
