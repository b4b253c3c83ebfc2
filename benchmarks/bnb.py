"""Benchmark of the bitsandbytes NF4 view (results in docs/performance.md; method: docs/packed.md).

One 4096 x 4096 layer quantized by bitsandbytes (``quantize_4bit``: NF4, blocks of 64, double quantization
as transformers' ``bnb_4bit_use_double_quant`` writes it) in a model folder, saved as ``Linear4bit`` saves it;
side by side in one run, rounds alternating:

1. **Random 4 KiB reads** of ``PREFIX.weight.npy`` through a fresh mount (``ckptfs mount`` by the real
   CLI): p50 and p90 per read, against bitsandbytes dequantizing the whole layer in-process
   (``functional.dequantize_4bit`` on CPU, its native kernel: right for this shape, whose rows are whole
   blocks; the median of the round's two timings).
2. **The view streamed vs the stored codes streamed**, on one fresh mount: ``PREFIX.weight.npy`` (64 MiB of
   float32) and ``PREFIX.weight.raw`` (the 8 MiB of codes), 1 MiB reads, in MB/s of each file's own bytes;
   which of the two goes first alternates from round to round. A second fresh mount with
   ``CKPTFS_NO_NATIVE=1`` streams the view through the numpy path.

Usage: python -m benchmarks bnb [--rounds 5] [--reads 300] [--json OUT]
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

PREFIX = "model.layers.0.mlp.up_proj"
OUT = IN = 4096
NUMPY_ONLY = {"CKPTFS_NO_NATIVE": "1"}


def make_layer(folder: Path) -> dict:
    """bitsandbytes' own quantization of a random bfloat16 weight, written as transformers saves it."""
    import torch
    import bitsandbytes.functional as F
    from safetensors.torch import save_file

    torch.manual_seed(0)
    weight = torch.randn(OUT, IN).to(torch.bfloat16)
    codes, state = F.quantize_4bit(weight, blocksize=64, compress_statistics=True, quant_type="nf4")
    tensors = {"weight": codes, **{f"weight.{k}": v for k, v in state.as_dict(packed=True).items()}}
    folder.mkdir(parents=True, exist_ok=True)
    save_file({f"{PREFIX}.{k}": v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = {"model_type": "llama", "torch_dtype": "bfloat16", "quantization_config": {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
        "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16",
        "llm_int8_skip_modules": None}}
    (folder / "config.json").write_text(json.dumps(config))
    return {"codes": codes, "state": state}


def reference(layer: dict):
    """bitsandbytes' dequantization of the whole layer (float32, unrounded: the view's values)."""
    import torch
    import bitsandbytes.functional as F

    state = layer["state"]
    state.dtype = torch.float32
    return F.dequantize_4bit(layer["codes"], state)


def timed_reference(layer: dict) -> float:
    start = time.perf_counter()
    reference(layer)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reads", type=int, default=300)
    parser.add_argument("--cache-size", type=int, default=512 << 20)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(49)
    results: dict = {"machine": {"cpus": os.cpu_count(), "load1": os.getloadavg()[0]},
                     "layer": f"bitsandbytes nf4 blocksize 64, double quant, {OUT}x{IN}", "rounds": []}
    with tempfile.TemporaryDirectory(prefix="ckptfs-bench-bnb-") as work:
        folder = Path(work) / "model"
        layer = make_layer(folder)
        expected = reference(layer).numpy()
        options = OpenOptions(cache_size=args.cache_size)
        npy, raw = PREFIX + ".weight.npy", PREFIX + ".weight.raw"

        def check(path: str) -> None:  # the mount serves bitsandbytes' values
            assert np.array_equal(np.load(io.BytesIO(Path(path).read_bytes())), expected), "values differ"

        for r in range(args.rounds):
            ref_before = timed_reference(layer)
            times = random_read_times(str(folder), work, f"random{r}", options, npy, rng, args.reads,
                                      check if r == 0 else None)
            order = in_turn(r, npy, raw)
            streams = stream_mb_s(str(folder), work, f"stream{r}", options, order)
            numpy_mbs = stream_mb_s(str(folder), work, f"stream-numpy{r}", options, [npy], NUMPY_ONLY)[npy]
            ref_s = statistics.median([ref_before, timed_reference(layer)])
            row: dict = view_row(ref_s, times, streams[npy], streams[raw])
            row.update(numpy_npy_mb_s=numpy_mbs, numpy_npy_vs_raw=numpy_mbs / streams[raw],
                       first=order[0].rsplit(".", 1)[-1])
            results["rounds"].append(row)
            print(f"round {r}: bitsandbytes whole layer {ref_s * 1e3:.0f} ms; 4 KiB read p50 "
                  f"{row['read_p50_s'] * 1e3:.3f} ms "
                  f"(p90 {row['read_p90_s'] * 1e3:.3f} ms) = {row['p50_speedup']:.0f}x faster; .npy "
                  f"{row['npy_mb_s']:.0f} MB/s vs .raw {row['raw_mb_s']:.0f} MB/s = {row['npy_vs_raw']:.2f}x (numpy path "
                  f"{row['numpy_npy_mb_s']:.0f} MB/s = {row['numpy_npy_vs_raw']:.2f}x; {row['first']} first); "
                  f"load {row['load1']:.1f}", flush=True)
    rounds = results["rounds"]
    results["median"] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0] if k != "first"}
    m = results["median"]
    print(f"median of {len(rounds)}: 4 KiB read p50 {m['p50_speedup']:.0f}x faster than bitsandbytes' whole-layer "
          f"dequantization (target >= 100x); .npy stream {m['npy_vs_raw']:.2f}x the .raw stream's MB/s (target "
          f">= 0.7x; numpy path {m['numpy_npy_vs_raw']:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0
