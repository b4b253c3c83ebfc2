"""Benchmark of packed views (results in docs/performance.md; method: docs/packed.md).

One 4096 x 4096 GPTQ layer (4 bits, group size 128, g_idx stored) in a model folder; side by side in one
run, rounds alternating:

1. **Random 4 KiB reads** of ``PREFIX.weight.npy`` through a fresh mount (``ckptfs mount`` by the real
   CLI): p50 and p90 per read, against the reference dequantizing the whole layer in-process (median).
2. **The whole view streamed** through a fresh mount (1 MiB reads, from a cold cache): values per second,
   against the reference's dequantization throughput (values per second of the same layer). The mount
   decodes with the C kernel where it is built (``ckptfs/packed/_kernels.c``); a second fresh mount with
   ``CKPTFS_NO_NATIVE=1`` streams the view through the numpy path too, so both are measured in each round.
3. **The mount's floor**: a plain float32 tensor of the same size (64 MiB, a safetensors file) streamed as
   ``.npy`` the same way: no decoding at all, only the mount's transfer cost.
4. **Decoding in-process** (no mount): the whole view read through the API (``Tensor.numpy()``, fresh
   checkpoint each time) with the C kernel and with numpy, against the same reference.

The reference: AutoGPTQ's CPU dequantization (``qlinear_cuda.QuantLinear``'s torch operations: shift and
mask ``qweight`` and ``qzeros``, ``scales[g_idx] * (weight - zeros[g_idx])`` in fp16), timed as those
operations alone (its ``forward`` would add a matmul); the script checks it gives the mount's values.
Usage: python -m benchmarks packed [--rounds 3] [--reads 300] [--json OUT]
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

from ckptfs.bench import bench_mount, random_reads
from ckptfs.core.options import OpenOptions
from ckptfs.packed.native import available as native_available

PREFIX = "model.layers.0.mlp.up_proj"
IN = OUT = 4096
GROUP = 128
READ = 4096
STREAM_CHUNK = 1 << 20
NUMPY_ONLY = {"CKPTFS_NO_NATIVE": "1"}  # the daemon decodes through numpy (no C kernel)


def make_layer(folder: Path, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random packed words are valid 4-bit data: any int32 holds eight 4-bit values."""
    from safetensors.numpy import save_file

    groups = IN // GROUP
    tensors = {
        "qweight": rng.integers(-2 ** 31, 2 ** 31, (IN // 8, OUT), dtype=np.int64).astype(np.int32),
        "qzeros": rng.integers(-2 ** 31, 2 ** 31, (groups, OUT // 8), dtype=np.int64).astype(np.int32),
        "scales": rng.uniform(0.001, 0.02, (groups, OUT)).astype(np.float16),
        "g_idx": (np.arange(IN) // GROUP).astype(np.int32),
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file({f"{PREFIX}.{k}": v for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = {"model_type": "llama", "quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": True}}
    (folder / "config.json").write_text(json.dumps(config))
    return tensors


def reference_dequantize(tensors: dict[str, np.ndarray]):
    """AutoGPTQ qlinear_cuda's CPU dequantization (4 bits), operation for operation: fp16 ``[in, out]``."""
    import torch

    qweight, qzeros = torch.from_numpy(tensors["qweight"]), torch.from_numpy(tensors["qzeros"])
    scales, g_idx = torch.from_numpy(tensors["scales"]), torch.from_numpy(tensors["g_idx"]).long()
    wf = torch.tensor(list(range(0, 32, 4)), dtype=torch.int32).unsqueeze(0)
    zeros = torch.bitwise_right_shift(torch.unsqueeze(qzeros, 2).expand(-1, -1, 8), wf.unsqueeze(0)).to(torch.int8)
    zeros = torch.bitwise_and(zeros, 15) + 1
    zeros = zeros.reshape(scales.shape)
    weight = torch.bitwise_right_shift(torch.unsqueeze(qweight, 1).expand(-1, 8, -1), wf.unsqueeze(-1)).to(torch.int8)
    weight = torch.bitwise_and(weight, 15)
    weight = weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2])
    return scales[g_idx] * (weight - zeros[g_idx])


def timed_reference(tensors) -> float:
    start = time.perf_counter()
    reference_dequantize(tensors)
    return time.perf_counter() - start


def stream(path: str) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.read(fd, STREAM_CHUNK):
            pass
    finally:
        os.close(fd)
    return time.perf_counter() - start


def decode_in_process(folder: Path, backend: str) -> float:
    """Seconds to decode the whole view through the API with ``backend`` (a fresh checkpoint: cold caches)."""
    import ckptfs

    with ckptfs.open(str(folder)) as ck:
        view = ck[PREFIX + ".weight"]
        view.data.backend = backend
        start = time.perf_counter()
        view.numpy()
        return time.perf_counter() - start


def make_plain(folder: Path, rng: np.random.Generator) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"plain": rng.standard_normal((OUT, IN), dtype=np.float32)}, str(folder / "plain.safetensors"))
    return folder / "plain.safetensors"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reads", type=int, default=300)
    parser.add_argument("--cache-size", type=int, default=512 << 20)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(16)
    results: dict = {"machine": {"cpus": os.cpu_count(), "load1": os.getloadavg()[0]},
                     "layer": f"GPTQ 4-bit g{GROUP} {OUT}x{IN}", "rounds": [],
                     "native_kernel": native_available()}
    if not results["native_kernel"]:
        print("note: ckptfs.packed._kernels is not built (or CKPTFS_NO_NATIVE is set): both streams use numpy")
    with tempfile.TemporaryDirectory(prefix="ckptfs-bench-packed-") as work:
        folder = Path(work) / "model"
        tensors = make_layer(folder, rng)
        reference = reference_dequantize(tensors).float().numpy().T
        plain = make_plain(Path(work) / "plain", rng)
        options = OpenOptions(cache_size=args.cache_size)
        for r in range(args.rounds):
            row: dict = {}
            ref_before = timed_reference(tensors)
            with bench_mount(str(folder), work, f"random{r}", options) as mount:
                path = mount.file(PREFIX + ".weight.npy")
                size = os.path.getsize(path)
                offsets = rng.integers(0, (size - READ) // READ, args.reads) * READ
                times = random_reads(path, offsets)
                if r == 0:  # the mount serves the reference's values
                    data = Path(path).read_bytes()
                    assert np.array_equal(np.load(io.BytesIO(data)), reference), "mount and reference differ"
            with bench_mount(str(folder), work, f"stream{r}", options) as mount:
                stream_s = stream(mount.file(PREFIX + ".weight.npy"))
            with bench_mount(str(folder), work, f"stream-numpy{r}", options, NUMPY_ONLY) as mount:
                numpy_s = stream(mount.file(PREFIX + ".weight.npy"))
            with bench_mount(str(plain), work, f"floor{r}", options) as mount:
                floor_s = stream(mount.file("plain.npy"))
            decode_s = decode_in_process(folder, "auto")
            decode_numpy_s = decode_in_process(folder, "numpy")
            ref_after = timed_reference(tensors)
            ref_s = statistics.median([ref_before, ref_after])
            row.update(reference_s=ref_s, read_p50_s=float(np.percentile(times, 50)),
                       read_p90_s=float(np.percentile(times, 90)), stream_s=stream_s, stream_numpy_s=numpy_s,
                       floor_s=floor_s, decode_s=decode_s, decode_numpy_s=decode_numpy_s,
                       p50_speedup=ref_s / float(np.percentile(times, 50)), stream_vs_reference=ref_s / stream_s,
                       numpy_stream_vs_reference=ref_s / numpy_s, floor_vs_reference=ref_s / floor_s,
                       decode_vs_reference=ref_s / decode_s, decode_numpy_vs_reference=ref_s / decode_numpy_s,
                       load1=os.getloadavg()[0])
            results["rounds"].append(row)
            print(f"round {r}: reference {ref_s * 1e3:.0f} ms; 4 KiB read p50 {row['read_p50_s'] * 1e3:.2f} ms "
                  f"(p90 {row['read_p90_s'] * 1e3:.2f} ms) = {row['p50_speedup']:.0f}x faster; whole view "
                  f"streamed {stream_s * 1e3:.0f} ms = {row['stream_vs_reference']:.2f}x the reference's "
                  f"throughput ({OUT * IN / stream_s / 1e6:.0f} M values/s; numpy path {numpy_s * 1e3:.0f} ms = "
                  f"{row['numpy_stream_vs_reference']:.2f}x; no-decode floor {floor_s * 1e3:.0f} ms = "
                  f"{row['floor_vs_reference']:.2f}x); in-process decode {decode_s * 1e3:.0f} ms = "
                  f"{row['decode_vs_reference']:.2f}x (numpy {decode_numpy_s * 1e3:.0f} ms = "
                  f"{row['decode_numpy_vs_reference']:.2f}x); load {row['load1']:.1f}", flush=True)
    rounds = results["rounds"]
    results["median"] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    m = results["median"]
    print(f"median: 4 KiB read p50 {m['p50_speedup']:.0f}x faster than the reference's whole-layer dequantization "
          f"(target >= 100x); streamed {m['stream_vs_reference']:.2f}x its throughput (target >= 2x; numpy path "
          f"{m['numpy_stream_vs_reference']:.2f}x, no-decode floor {m['floor_vs_reference']:.2f}x); in-process "
          f"decode {m['decode_vs_reference']:.2f}x (numpy {m['decode_numpy_vs_reference']:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0
