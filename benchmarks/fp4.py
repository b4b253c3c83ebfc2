"""Benchmark of the FP4 views: compressed-tensors NVFP4 and gpt-oss MXFP4 (results in docs/performance.md).

Two layers, each in its own model folder, side by side in one run, rounds alternating:

- ``nvfp4``: a 4096 x 4096 layer quantized by compressed-tensors (``NVFP4PackedCompressor.compress`` of a
  random bfloat16 weight); the reference dequantizes it whole with ``NVFP4PackedCompressor.decompress``.
- ``gptoss``: a gpt-oss ``gate_up_proj`` with gpt-oss-20b's expert shape (``[E, 5760, 2880 / 32, 16]``
  blocks, E = 4 by default: 33 MiB of codes, a 254 MiB view); the reference is transformers'
  ``convert_moe_packed_tensors`` of the whole layer (bfloat16, as it loads the model).

Per layer and round:

1. **Random 4 KiB reads** of the view's ``.npy`` through a fresh mount (the real CLI): p50 and p90 per read,
   against the reference dequantizing the whole layer in-process (the median of the round's two timings).
2. **The view streamed vs the stored codes streamed**, on one fresh mount: the view's ``.npy`` and the codes'
   ``.raw`` (``weight_packed`` / ``gate_up_proj_blocks``), 1 MiB reads, in MB/s of each file's own bytes;
   which goes first alternates from round to round.

Usage: python -m benchmarks fp4 [--rounds 5] [--reads 300] [--experts 4] [--json OUT]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np

from benchmarks.view_rounds import in_turn, random_read_times, stream_mb_s, view_row
from ckptfs.core.options import OpenOptions

NVFP4_PREFIX = "model.layers.0.mlp.up_proj"
GPTOSS_PREFIX = "model.layers.0.mlp.experts.gate_up_proj"


def make_nvfp4(folder: Path) -> tuple[Callable[[], Any], str, str]:
    """compressed-tensors' own NVFP4 quantization of a random 4096 x 4096 bfloat16 weight."""
    import torch
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
    from safetensors.torch import save_file

    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    torch.manual_seed(0)
    weight = (torch.randn(4096, 4096) * 0.02).to(torch.bfloat16)
    grouped = weight.float().reshape(4096, 256, 16)
    global_scale = generate_gparam(weight.float().amin(), weight.float().amax())
    scale, _ = calculate_qparams(grouped.amin(-1), grouped.amax(-1), scheme.weights, global_scale=global_scale)
    tensors = dict(NVFP4PackedCompressor.compress({"weight": weight, "weight_scale": scale,
                                                   "weight_global_scale": global_scale}, scheme))
    folder.mkdir(parents=True, exist_ok=True)
    save_file({f"{NVFP4_PREFIX}.{k}": v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    group = scheme.model_dump()
    group["format"] = "nvfp4-pack-quantized"
    for args in ("weights", "input_activations"):
        group[args]["scale_dtype"] = None
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "bfloat16",
                                                    "quantization_config": {
                                                        "quant_method": "compressed-tensors",
                                                        "format": "nvfp4-pack-quantized",
                                                        "config_groups": {"group_0": group}, "ignore": []}}))

    def reference() -> Any:
        return NVFP4PackedCompressor.decompress(dict(tensors), scheme)["weight"]

    return reference, NVFP4_PREFIX + ".weight.npy", NVFP4_PREFIX + ".weight_packed.raw"


def make_gptoss(folder: Path, experts: int) -> tuple[Callable[[], Any], str, str]:
    """A gpt-oss-20b-shaped ``gate_up_proj`` (random codes, exponents around 2^-7)."""
    import torch
    from safetensors.numpy import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (experts, 5760, 90, 16), dtype=np.uint8)
    scales = rng.integers(118, 126, (experts, 5760, 90), dtype=np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({f"{GPTOSS_PREFIX}_blocks": blocks, f"{GPTOSS_PREFIX}_scales": scales,
               f"{GPTOSS_PREFIX}_bias": np.zeros((experts, 5760), np.float32)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt_oss", "torch_dtype": "bfloat16",
                                                    "quantization_config": {"quant_method": "mxfp4"}}))
    tb, ts = torch.from_numpy(blocks), torch.from_numpy(scales)

    def reference() -> Any:
        return convert_moe_packed_tensors(tb, ts)

    return reference, GPTOSS_PREFIX + ".npy", GPTOSS_PREFIX + "_blocks.raw"


def timed(reference: Callable[[], Any]) -> float:
    start = time.perf_counter()
    reference()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reads", type=int, default=300)
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--cache-size", type=int, default=512 << 20)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(49)
    results: dict = {"machine": {"cpus": os.cpu_count(), "load1": os.getloadavg()[0]}, "layers": {}}
    with tempfile.TemporaryDirectory(prefix="ckptfs-bench-fp4-") as work:
        layers = {"nvfp4": make_nvfp4(Path(work) / "nvfp4"),
                  "gptoss": make_gptoss(Path(work) / "gptoss", args.experts)}
        options = OpenOptions(cache_size=args.cache_size)
        for r in range(args.rounds):
            for name, (reference, npy, raw) in layers.items():
                folder = str(Path(work) / name)
                ref_before = timed(reference)

                def check(path: str) -> None:  # the reference's values, rounded as it rounds them
                    import torch
                    served = torch.from_numpy(np.load(io.BytesIO(Path(path).read_bytes())))
                    assert torch.equal(served.to(torch.bfloat16).view(torch.int16),
                                       reference().view(torch.int16)), f"{name}: values differ"

                times = random_read_times(folder, work, f"{name}-random{r}", options, npy, rng, args.reads,
                                          check if r == 0 else None)
                order = in_turn(r, npy, raw)
                streams = stream_mb_s(folder, work, f"{name}-stream{r}", options, order)
                row = view_row(statistics.median([ref_before, timed(reference)]), times, streams[npy], streams[raw])
                results["layers"].setdefault(name, []).append(row)
                print(f"round {r} {name}: reference whole layer {row['reference_s'] * 1e3:.0f} ms; 4 KiB read p50 "
                      f"{row['read_p50_s'] * 1e3:.3f} ms (p90 {row['read_p90_s'] * 1e3:.3f} ms) = {row['p50_speedup']:.0f}x; "
                      f".npy {row['npy_mb_s']:.0f} MB/s vs .raw {row['raw_mb_s']:.0f} MB/s = {row['npy_vs_raw']:.2f}x "
                      f"({'npy' if order[0] == npy else 'raw'} first); load {row['load1']:.1f}", flush=True)
    results["median"] = {name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
                         for name, rows in results["layers"].items()}
    for name, m in results["median"].items():
        print(f"median {name}: 4 KiB read p50 {m['p50_speedup']:.0f}x faster than the whole-layer reference "
              f"(target >= 100x); .npy stream {m['npy_vs_raw']:.2f}x the .raw stream's MB/s (target >= 0.7x)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0
