#!/usr/bin/env python3
"""Dequantization speed: ckptfs codecs against gguf-py (and numpy / ml_dtypes for plain and small floats).

Each case decodes one whole real-shaped tensor (rows x cols, numpy order) the way each library would: ckptfs
through ``codec.dequantize`` on the block bytes, gguf-py through ``gguf.quants.dequantize`` on the raw uint8
array (what it does with ``GGUFReader``'s ``tensor.data``). Both outputs are compared bit for bit
(NaN-aware) in the same run, so a fast wrong answer cannot hide. Reported: best-of-N wall time as output
MB/s (10^6 bytes of float32, or of the stored dtype for exact plain types) and the ckptfs/reference ratio.

Input bytes are random but valid: random bytes everywhere, then every fp16/f32 scale field overwritten
with a finite value of a realistic size (quantizing real weights with gguf-py would take minutes per
tensor and gguf-py cannot quantize K-quants at all). Speed does not depend on the weights' distribution.

Usage: python scripts/bench_dequant.py [--quick] [--types Q4_0,Q4_K] [--repeat 3]
Set CKPTFS_NO_NATIVE=1 to time the pure-numpy path when the optional C kernel is built.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ckptfs.quant import codec_for

SHAPES = [(262144, 640), (4096, 4096), (14336, 4096)]
QUICK_SHAPES = [(4096, 4096)]
BOTH = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "BF16"]
CKPTFS_ONLY = ["Q8_1", "Q8_K"]
NUMPY_BASELINE = ["F32", "F16", "I8", "I32", "F8_E4M3", "F8_E5M2"]
# Byte offsets of the scale fields that must be finite for a realistic block: fp16 ones, and Q8_K's f32 d.
F16_SCALES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q8_1": [0, 2],
              "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
F32_SCALES = {"Q8_K": [0]}


@dataclass
class Row:
    name: str
    shape: tuple[int, int]
    ours_mbs: float
    ref_name: str
    ref_mbs: float | None
    equal: bool | None


def make_blocks(name: str, n_elements: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid block bytes ``u8[n_blocks, block_bytes]`` for ``n_elements`` values of ``name``."""
    codec = codec_for(name)
    n_blocks = n_elements // codec.block_elements
    if name in ("F32", "F16", "BF16"):
        values = rng.standard_normal(n_elements, dtype=np.float32)
        if name == "BF16":
            return (values.view(np.uint32) >> 16).astype("<u2").view(np.uint8).reshape(n_blocks, 2)
        return values.astype("<" + {"F32": "f4", "F16": "f2"}[name]).view(np.uint8).reshape(n_blocks, -1)
    raw = rng.integers(0, 256, size=(n_blocks, codec.block_bytes), dtype=np.uint8)
    for offset in F16_SCALES.get(name, []):
        scale = (rng.uniform(1e-4, 2e-2, n_blocks) * rng.choice([-1.0, 1.0], n_blocks)).astype("<f2")
        raw[:, offset:offset + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    for offset in F32_SCALES.get(name, []):
        raw[:, offset:offset + 4] = rng.uniform(1e-4, 2e-2, n_blocks).astype("<f4").view(np.uint8).reshape(n_blocks, 4)
    return raw


def best_time(fn: Callable[[], np.ndarray], repeat: int, calls: int = 1) -> tuple[float, np.ndarray]:
    """Best of ``repeat`` timings of ``calls`` back-to-back calls, per call. Zero-copy decoders (exact plain
    types return a view) take microseconds, so they are timed over many calls to be measurable at all."""
    best, result = float("inf"), None
    for _ in range(repeat):
        result = None
        gc.collect()
        start = time.perf_counter()
        for _ in range(calls):
            result = fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best, result


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-exact equality with every NaN counted equal (signed zeros still distinguished)."""
    a = np.ascontiguousarray(a).reshape(-1)
    b = np.ascontiguousarray(b).reshape(-1)
    if a.dtype != b.dtype or a.size != b.size:
        return False
    if a.dtype.kind != "f":
        return a.tobytes() == b.tobytes()
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not np.array_equal(nan_a, nan_b):
        return False
    uint = np.dtype(f"u{a.dtype.itemsize}")
    return np.array_equal(a.view(uint)[~nan_a], b.view(uint)[~nan_b])


def reference(name: str) -> tuple[str, Callable[[np.ndarray, tuple[int, int]], np.ndarray]] | None:
    """The library ckptfs is compared with for ``name``, as (label, decode(raw_rows, shape))."""
    if name in BOTH:
        import gguf.quants
        from gguf import GGMLQuantizationType

        qtype = GGMLQuantizationType[name]
        return "gguf-py", lambda raw, shape: gguf.quants.dequantize(raw.reshape(shape[0], -1), qtype)
    if name in ("F32", "F16", "I8", "I32"):
        dtype = np.dtype({"F32": "<f4", "F16": "<f2", "I8": "i1", "I32": "<i4"}[name])
        return "numpy frombuffer", lambda raw, shape: np.frombuffer(raw, dtype=dtype).reshape(shape)
    if name.startswith("F8_"):
        try:
            import ml_dtypes
        except ImportError:
            return None
        ml_type = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}[name]
        return "ml_dtypes astype", lambda raw, shape: raw.view(ml_type).astype(np.float32).reshape(shape)
    return None


def bench_case(name: str, shape: tuple[int, int], repeat: int, rng: np.random.Generator) -> Row:
    codec = codec_for(name)
    raw = make_blocks(name, shape[0] * shape[1], rng)
    calls = 1000 if codec.exact else 1
    with np.errstate(all="ignore"):
        ours_t, ours = best_time(lambda: codec.dequantize(raw).reshape(shape), repeat, calls)
        ours_mbs = ours.nbytes / ours_t / 1e6
        ref = reference(name)
        if ref is None:
            return Row(name, shape, ours_mbs, "-", None, None)
        label, ref_fn = ref
        ref_t, theirs = best_time(lambda: ref_fn(raw, shape), repeat, calls)
    return Row(name, shape, ours_mbs, label, theirs.nbytes / ref_t / 1e6, same_bits(ours, theirs))


def machine_line() -> str:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    native = "off (CKPTFS_NO_NATIVE)" if os.environ.get("CKPTFS_NO_NATIVE") else "auto"
    return (f"{model}; {os.cpu_count()} CPUs; Python {platform.python_version()}; numpy {np.__version__}; "
            f"native kernel: {native}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the 4096 x 4096 shape")
    parser.add_argument("--types", help="comma-separated storage types (default: all benchmarked types)")
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per case (default 3)")
    args = parser.parse_args(argv)
    names = args.types.split(",") if args.types else BOTH + CKPTFS_ONLY + NUMPY_BASELINE
    unknown = [n for n in names if codec_for(n) is None]
    if unknown:
        parser.error(f"no codec for {', '.join(unknown)}")
    shapes = QUICK_SHAPES if args.quick else SHAPES
    rng = np.random.default_rng(0)

    print(machine_line())
    print(f"{'type':<8} {'shape':>13} {'ckptfs MB/s':>12} {'reference':>17} {'ref MB/s':>10} {'ratio':>7} equal")
    failures = 0
    for name in names:
        for shape in shapes:
            if shape[1] % codec_for(name).block_elements:
                # e.g. 640 columns are not whole 256-element K-quant blocks: no such tensor exists.
                print(f"{name:<8} {f'{shape[0]}x{shape[1]}':>13}  (row length not a whole number of blocks)")
                continue
            row = bench_case(name, shape, args.repeat, rng)
            gc.collect()
            ref_mbs = f"{row.ref_mbs:10.0f}" if row.ref_mbs else f"{'-':>10}"
            ratio = f"{row.ours_mbs / row.ref_mbs:6.2f}x" if row.ref_mbs else f"{'-':>7}"
            equal = {True: "yes", False: "NO", None: "-"}[row.equal]
            failures += row.equal is False
            print(f"{row.name:<8} {f'{shape[0]}x{shape[1]}':>13} {row.ours_mbs:12.0f} {row.ref_name:>17} "
                  f"{ref_mbs} {ratio} {equal}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
