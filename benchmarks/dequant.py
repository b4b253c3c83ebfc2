"""Dequantization speed: ckptfs codecs against gguf-py, numpy and ml_dtypes, one whole tensor per case.

Each case decodes one real-shaped tensor (rows x cols, numpy order) the way each library would, from the same
stored bytes, and compares both outputs bit for bit (NaN-aware) in the same run, so a fast wrong answer
cannot hide. Reported: best-of-N wall time as output MB/s (10^6 bytes of the output dtype per second) and
the ckptfs/reference ratio.

- ckptfs: ``codec.dequantize`` on the block matrix ``u8[n_blocks, block_bytes]`` (what the block engine
  hands it), then, where the served dtype differs from the codec's (``--dtype float32`` on an F16 tensor),
  ``.astype`` exactly as ckptfs.engine.blocks.TensorData does.
- gguf-py: ``gguf.quants.dequantize`` on the tensor's 2-D raw array ``u8[rows, row_bytes]`` — the shape of
  ``GGUFReader``'s ``tensor.data`` for quantized types; it dequantizes whole rows.
- numpy's own conversion for plain types: ``np.frombuffer(raw, dtype).reshape(shape)`` for types served as
  stored (both sides are zero-copy views: only the per-call cost exists, so those rows give microseconds per
  call, timed over many calls, instead of a meaningless MB/s), ``.astype(float32)`` of that view for F16
  served as float32, ml_dtypes' ``astype(float32)`` for BF16 and F8.

Input bytes are random but realistic: random bytes everywhere, then every fp16/f32/E8M0 scale field
overwritten with a finite value of a realistic size (gguf-py cannot quantize most of these types, and
quantizing big tensors with it takes minutes). Decoding speed does not depend on the weights' values, except
that NaN/inf scales and subnormal products would slow float arithmetic, which real files do not exercise.

Usage: python -m benchmarks dequant [--quick] [--types Q4_0,Q4_K,F16>F32] [--repeat 3]
Set CKPTFS_NO_NATIVE=1 to time the pure-numpy path when the optional C kernel is built.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ckptfs.quant import Codec, codec_for, output_dtype

SHAPES = [(262144, 640), (4096, 4096), (14336, 4096)]
QUICK_SHAPES = [(4096, 4096)]
GGUF_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
              "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
              "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "BF16"]
CKPTFS_ONLY = ["Q8_1", "Q8_K", "Q1_0", "Q2_0"]
# Plain types; "F16>F32" is an F16 tensor served as float32 (ckptfs's dtype setting "float32").
PLAIN = ["F32", "F16", "I8", "I32", "F16>F32", "F8_E4M3", "F8_E5M2"]
ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
# Byte offsets of the fp16 scale fields that must be finite for a realistic block (IQ1_M: see set_iq1_m_scale).
F16_SCALES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q8_1": [0, 2],
              "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
              "IQ1_S": [0], "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
              "IQ4_NL": [0], "IQ4_XS": [0], "TQ1_0": [52], "TQ2_0": [64], "Q1_0": [0], "Q2_0": [0]}
F32_SCALES = {"Q8_K": [0]}
# MXFP4's E8M0 scale byte: random bytes would make 1 block in 10 produce float32 subnormals (e < 24), which
# slow down float multiplies (gguf-py's) but not table lookups (ckptfs's): keep it realistic, 2^-10 .. 2^2.
E8M0_SCALES = {"MXFP4": [0]}
ZERO_COPY_CALLS = 2000          # a view costs ~1 us: time many calls to measure it at all


@dataclass(frozen=True)
class Case:
    """One benchmarked storage type, served as ``mode`` (ckptfs's dtype setting)."""

    label: str
    name: str
    mode: str = "auto"

    @property
    def codec(self) -> Codec:
        return codec_for(self.name)

    @property
    def zero_copy(self) -> bool:
        return self.codec.exact and output_dtype(self.codec, self.mode) == self.codec.dtype


def parse_case(label: str) -> Case:
    name, _, target = label.partition(">")
    if target not in ("", "F32"):
        raise ValueError(f"{label}: only TYPE>F32 (served as float32) is supported")
    return Case(label, name, "float32" if target else "auto")


@dataclass
class Row:
    case: Case
    shape: tuple[int, int]
    ours_s: float
    ref_name: str
    ref_s: float | None
    nbytes: int
    equal: bool | None


def set_iq1_m_scale(raw: np.ndarray, halves: np.ndarray) -> None:
    """IQ1_M has no d field: the fp16 bits of d are the top 4 bits of the four u16 ``scales`` at bytes 48..55
    (nibble k of d in the u16 at byte 48 + 2k, i.e. the high nibble of byte 49 + 2k)."""
    for k in range(4):
        top = ((halves >> np.uint16(4 * k)) & 15).astype(np.uint8)
        raw[:, 49 + 2 * k] = (raw[:, 49 + 2 * k] & 0x0F) | (top << 4)


def make_blocks(name: str, n_elements: int, rng: np.random.Generator) -> np.ndarray:
    """Random realistic block bytes ``u8[n_blocks, block_bytes]`` for ``n_elements`` values of ``name``."""
    codec = codec_for(name)
    n_blocks = n_elements // codec.block_elements
    if name in ("F32", "F16", "BF16"):
        values = rng.standard_normal(n_elements, dtype=np.float32)
        if name == "BF16":
            return (values.view(np.uint32) >> 16).astype("<u2").view(np.uint8).reshape(n_blocks, 2)
        return values.astype("<" + {"F32": "f4", "F16": "f2"}[name]).view(np.uint8).reshape(n_blocks, -1)
    raw = rng.integers(0, 256, size=(n_blocks, codec.block_bytes), dtype=np.uint8)

    def scales() -> np.ndarray:
        return (rng.uniform(1e-4, 2e-2, n_blocks) * rng.choice([-1.0, 1.0], n_blocks)).astype("<f2")

    for offset in F16_SCALES.get(name, []):
        raw[:, offset:offset + 2] = scales().view(np.uint8).reshape(n_blocks, 2)
    for offset in F32_SCALES.get(name, []):
        raw[:, offset:offset + 4] = rng.uniform(1e-4, 2e-2, n_blocks).astype("<f4").view(np.uint8).reshape(n_blocks, 4)
    for offset in E8M0_SCALES.get(name, []):
        raw[:, offset] = rng.integers(127 - 10, 127 + 3, n_blocks, dtype=np.uint8)
    if name == "IQ1_M":
        set_iq1_m_scale(raw, scales().view(np.uint16))
    return raw


def best_time(fn: Callable[[], np.ndarray], repeat: int, calls: int = 1) -> tuple[float, np.ndarray]:
    """Best of ``repeat`` timings of ``calls`` back-to-back calls, per call."""
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


Decode = Callable[[np.ndarray, tuple[int, int]], np.ndarray]


def ckptfs_decoder(case: Case) -> Decode:
    """ckptfs's path: the codec on the block matrix, then TensorData's dtype conversion if the mode needs one."""
    codec = case.codec
    served = output_dtype(codec, case.mode)
    if served == codec.dtype:
        return lambda blocks, shape: codec.dequantize(blocks).reshape(shape)
    return lambda blocks, shape: codec.dequantize(blocks).reshape(-1).astype(served).reshape(shape)


def references(case: Case) -> list[tuple[str, Decode]]:
    """The libraries ckptfs is compared with for ``case``, as (label, decode(blocks, shape))."""
    refs: list[tuple[str, Decode]] = []
    if case.name in GGUF_TYPES:
        import gguf.quants
        from gguf import GGMLQuantizationType

        qtype = GGMLQuantizationType[case.name]
        # Whole rows, u8[rows, row_bytes], as GGUFReader's tensor.data holds them (a free reshape of the blocks).
        refs.append(("gguf-py", lambda blocks, shape: gguf.quants.dequantize(blocks.reshape(shape[0], -1), qtype)))
    if case.name in ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            return refs
        ml_type = getattr(ml_dtypes, ML_DTYPES[case.name])
        refs.append(("ml_dtypes astype",
                     lambda blocks, shape: np.frombuffer(blocks, ml_type).astype(np.float32).reshape(shape)))
    elif case.codec.exact:
        stored = case.codec.dtype
        if case.zero_copy:
            refs.append(("numpy frombuffer", lambda blocks, shape: np.frombuffer(blocks, stored).reshape(shape)))
        else:
            served = output_dtype(case.codec, case.mode)
            refs.append(("numpy astype",
                         lambda blocks, shape: np.frombuffer(blocks, stored).astype(served).reshape(shape)))
    return refs


def bench_case(case: Case, shape: tuple[int, int], repeat: int, rng: np.random.Generator) -> list[Row]:
    blocks = make_blocks(case.name, shape[0] * shape[1], rng)
    calls = ZERO_COPY_CALLS if case.zero_copy else 1
    ours_fn = ckptfs_decoder(case)
    ours_s, ours = best_time(lambda: ours_fn(blocks, shape), repeat, calls)
    refs = references(case)
    if not refs:
        return [Row(case, shape, ours_s, "-", None, ours.nbytes, None)]
    rows = []
    for label, ref_fn in refs:
        with np.errstate(all="ignore"):           # gguf-py's float ops on extreme (finite) values
            ref_s, theirs = best_time(lambda: ref_fn(blocks, shape), repeat, calls)
        rows.append(Row(case, shape, ours_s, label, ref_s, ours.nbytes, same_bits(ours, theirs)))
        del theirs
    return rows


def machine_line() -> str:
    from ckptfs.bench.run import machine
    from ckptfs.quant import native

    m = machine()
    kernels = ", ".join(sorted(native.native_types())) or "none (numpy only)"
    return f"{m['cpu']}; {m['cpus']} CPUs; Python {m['python']}; numpy {m['numpy']}; native kernels: {kernels}"


def speed(row: Row, seconds: float) -> str:
    """MB/s, or microseconds per call for zero-copy rows (their MB/s would only restate the call cost)."""
    if row.case.zero_copy:
        return f"{seconds * 1e6:7.2f} us"
    return f"{row.nbytes / seconds / 1e6:10.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the 4096 x 4096 shape")
    parser.add_argument("--types", help="comma-separated storage types, TYPE>F32 for served as float32 "
                                        "(default: all benchmarked types)")
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per case (default 3)")
    args = parser.parse_args(argv)
    try:
        cases = [parse_case(label) for label in (args.types.split(",") if args.types
                                                 else GGUF_TYPES + CKPTFS_ONLY + PLAIN)]
    except ValueError as exc:
        parser.error(str(exc))
    unknown = [c.label for c in cases if codec_for(c.name) is None]
    if unknown:
        parser.error(f"no codec for {', '.join(unknown)}")
    shapes = QUICK_SHAPES if args.quick else SHAPES
    rng = np.random.default_rng(0)

    print(machine_line())
    print(f"{'type':<8} {'shape':>13} {'ckptfs MB/s':>11} {'reference':>17} {'ref MB/s':>10} {'ratio':>7} equal")
    failures = 0
    for case in cases:
        for shape in shapes:
            where = f"{shape[0]}x{shape[1]}"
            if shape[1] % case.codec.block_elements:
                # e.g. 640 columns are not whole 256-element blocks: no such tensor exists.
                print(f"{case.label:<8} {where:>13}  (row length not a whole number of blocks)")
                continue
            for row in bench_case(case, shape, args.repeat, rng):
                ref = speed(row, row.ref_s) if row.ref_s else f"{'-':>10}"
                ratio = f"{row.ref_s / row.ours_s:6.2f}x" if row.ref_s else f"{'-':>7}"
                equal = {True: "yes", False: "NO", None: "-"}[row.equal]
                failures += row.equal is False
                print(f"{case.label:<8} {where:>13} {speed(row, row.ours_s):>11} {row.ref_name:>17} {ref:>10} "
                      f"{ratio} {equal}", flush=True)
            gc.collect()
    return 1 if failures else 0
