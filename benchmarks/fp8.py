"""Benchmark of FP8 block-scaled views (results in docs/performance.md; method: docs/packed.md).

One 7168 x 2048 FP8 layer with 128 x 128 blocks (DeepSeek-V3's ``mlp.down_proj`` shape: F8_E4M3 codes and an
F32 ``weight_scale_inv`` grid of 56 x 16) in a model folder (``quant_method: fp8``), written by
safetensors' torch writer. Rounds alternate, each with fresh mounts (``ckptfs mount`` by the real CLI):

1. **Random 4 KiB reads** of ``PREFIX.weight.npy`` (the dense view): p50 and p90 per read, against the
   oracle dequantizing the whole layer in-process (compressed-tensors' ``FP8BlockDequantizer`` to
   bfloat16, the release's dtype; the median of one run before and one after the mount's).
2. **The view streamed vs the codes streamed**: ``PREFIX.weight.npy`` (float32, 4 bytes per value) and
   ``PREFIX.weight.raw`` (the stored E4M3 codes, 1 byte per value) of the same mount, each from a cold
   cache (a fresh mount each), 1 MiB reads; MB/s of each file's own bytes, and their ratio.

Usage: python -m benchmarks fp8 [--rounds 5] [--reads 300] [--json OUT]
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

import numpy as np

from benchmarks.view_rounds import in_turn, random_read_times, stream_mb_s, view_row
from ckptfs.core.options import OpenOptions

PREFIX = "model.layers.3.mlp.down_proj"
OUT, IN = 7168, 2048
BLOCK = (128, 128)


def make_layer(folder: Path, seed: int):
    """Random E4M3 codes (NaN codes replaced: a quantizer never writes them) and F32 block scales."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (OUT, IN), dtype=torch.uint8, generator=gen)
    codes[(codes & 0x7F) == 0x7F] = 0x7E
    grid = (-(-OUT // BLOCK[0]), -(-IN // BLOCK[1]))
    tensors = {f"{PREFIX}.weight": codes.view(torch.float8_e4m3fn),
               f"{PREFIX}.weight_scale_inv": torch.rand(grid, generator=gen) * 1e-3 + 1e-5}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    config = {"model_type": "deepseek_v3", "torch_dtype": "bfloat16", "quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)}}
    (folder / "config.json").write_text(json.dumps(config))
    return tensors


def reference(tensors, dtype):
    import torch
    from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import FP8BlockDequantizer

    dequantizer = FP8BlockDequantizer(weight_block_size=BLOCK, dtype=getattr(torch, dtype), targets=("Linear",))
    return dequantizer.process({"m.weight": tensors[f"{PREFIX}.weight"],
                                "m.weight_scale_inv": tensors[f"{PREFIX}.weight_scale_inv"]})["m.weight"]


def timed_reference(tensors) -> float:
    start = time.perf_counter()
    reference(tensors, "bfloat16")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reads", type=int, default=300)
    parser.add_argument("--cache-size", type=int, default=512 << 20)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(17)
    results: dict = {"machine": {"cpus": os.cpu_count(), "load1": os.getloadavg()[0]},
                     "layer": f"FP8 E4M3 {OUT}x{IN}, blocks {BLOCK[0]}x{BLOCK[1]}, F32 scales", "rounds": []}
    with tempfile.TemporaryDirectory(prefix="ckptfs-bench-fp8-") as work:
        folder = Path(work) / "model"
        tensors = make_layer(folder, 17)
        expected = reference(tensors, "float32").numpy()
        options = OpenOptions(cache_size=args.cache_size)
        npy, raw = PREFIX + ".weight.npy", PREFIX + ".weight.raw"

        def check(path: str) -> None:  # the mount serves the oracle's float32 values
            assert np.array_equal(np.load(io.BytesIO(Path(path).read_bytes())), expected), "values differ"

        for r in range(args.rounds):
            ref_before = timed_reference(tensors)
            times = random_read_times(str(folder), work, f"random{r}", options, npy, rng, args.reads,
                                      check if r == 0 else None)
            streams = stream_mb_s(str(folder), work, f"stream{r}", options, in_turn(r, npy, raw))
            ref_s = statistics.median([ref_before, timed_reference(tensors)])
            row = view_row(ref_s, times, streams[npy], streams[raw])
            results["rounds"].append(row)
            print(f"round {r}: oracle whole layer {ref_s * 1e3:.0f} ms; 4 KiB .npy read p50 "
                  f"{row['read_p50_s'] * 1e3:.2f} ms (p90 {row['read_p90_s'] * 1e3:.2f} ms) = "
                  f"{row['p50_speedup']:.0f}x faster; .npy stream {row['npy_mb_s']:.0f} MB/s, .raw stream "
                  f"{row['raw_mb_s']:.0f} MB/s = {row['npy_vs_raw']:.2f}x; load {row['load1']:.1f}", flush=True)
    rounds = results["rounds"]
    results["median"] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    m = results["median"]
    print(f"median of {len(rounds)}: 4 KiB read p50 {m['p50_speedup']:.0f}x faster than the oracle's whole-layer "
          f"dequantization (target >= 100x); .npy stream {m['npy_mb_s']:.0f} MB/s = {m['npy_vs_raw']:.2f}x "
          f"the .raw stream's {m['raw_mb_s']:.0f} MB/s (target >= 0.7x)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0
