#!/usr/bin/env python3
"""One script for a lent GPU machine: build, check the CUDA path against the CPU path, benchmark, summarize.

The device machine has its own Python and torch and none of the test extras (no gguf-py, no pytest) and no
network, so this script needs only numpy and torch: it compiles the C kernels itself (the system compiler
and Python's headers, no setuptools), writes its own GGUF (a minimal v3 writer below) and prints a
summary (and ``--json FILE``). Steps:

  1. build   ckptfs/quant/_native.c -> ckptfs/quant/_native<EXT_SUFFIX> (-O2 -ffp-contract=off, as setup.py)
  2. kernels every type with a torch kernel: random blocks (every byte random: NaN/inf/subnormal scales too)
             dequantized on the device and by the host codecs (C kernel or numpy) must agree bit for bit
  3. speed   dequantization throughput per type on the device (output float32 GB/s), beside the host codec
  4. model   a real-shaped GGUF (Qwen2-7B Q4_K_M layout, dims scaled, plus one tensor of every kernel type):
             ckptfs.load(device="cuda") vs ckptfs.load() then .to("cuda"): same bits, both timed
  5. errors  an unknown GPU index, and a load that cannot fit (memory capped with
             set_per_process_memory_fraction): one clear error, device memory back where it was

Without CUDA (``--cpu``, or automatically) the same steps run on the CPU with the torch kernels, smaller:
that is how the script itself is checked on machines without a GPU.

Usage: python scripts/gpu_check.py [--cpu] [--json OUT] [--scale 0.25]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover - the device machine has torch; say so clearly where it does not
    sys.exit("gpu_check.py needs torch (pip install torch) and numpy")

# GGML type ids (ggml.h) of the types written here.
GGML_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11,
            "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20, "IQ4_XS": 23, "BF16": 30, "MXFP4": 39}


# ------------------------------------------------------------------------------------------------ 1. build


def build_native() -> dict:
    """Compile the optional C kernels in place; the package works without them (numpy), so a failure is
    reported, not fatal."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = os.path.join(ROOT, "ckptfs", "quant", "_native" + suffix)
    source = os.path.join(ROOT, "ckptfs", "quant", "_native.c")
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    partial = f"{target}.{os.getpid()}.tmp"            # built aside, then renamed: a loaded copy stays intact
    cmd = [*cc.split()[:1], "-O2", "-ffp-contract=off", "-shared", "-fPIC",
           f"-I{sysconfig.get_paths()['include']}", source, "-o", partial]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        os.replace(partial, target)
    elif os.path.exists(partial):
        os.unlink(partial)
    return {"ok": proc.returncode == 0, "command": " ".join(cmd), "error": proc.stderr.strip()[-2000:]}


# ------------------------------------------------------------------------------------------------ helpers


def float_bits(values: np.ndarray) -> np.ndarray:
    """Bit patterns with every NaN one canonical NaN (bit-exact elsewhere, NaN-aware)."""
    flat = np.ascontiguousarray(values).reshape(-1)
    if flat.dtype.kind != "f":
        return flat.view(np.uint8)
    bits = flat.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[flat.itemsize]).copy()
    bits[np.isnan(flat)] = {2: 0x7E00, 4: 0x7FC00000, 8: 0x7FF8000000000000}[flat.itemsize]
    return bits


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.bfloat16:
        a, b = a.float(), b.float()
    return bool(np.array_equal(float_bits(a.cpu().numpy()), float_bits(b.cpu().numpy())))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------------ 2. kernels


def check_kernels(device: torch.device, blocks_per_type: int) -> dict:
    from ckptfs.quant import codec_for
    from ckptfs.torchio import kernels

    rng = np.random.default_rng(15)
    results = {}
    for name in kernels.KERNELS:
        codec = codec_for(name)
        raw = rng.integers(0, 256, (blocks_per_type, codec.block_bytes), dtype=np.uint8)
        if name == "BOOL":
            raw &= 1
        want = codec.dequantize(raw)
        got = kernels.dequantize(name, torch.from_numpy(raw).to(device)).cpu().numpy()
        results[name] = bool(got.dtype == want.dtype and np.array_equal(float_bits(got), float_bits(want)))
    return results


# ------------------------------------------------------------------------------------------------ 3. speed


def throughput(device: torch.device, elements: int, host_elements: int) -> dict:
    from ckptfs.quant import codec_for
    from ckptfs.torchio import kernels

    rng = np.random.default_rng(16)
    rates = {}
    for name in kernels.KERNELS:
        codec = codec_for(name)
        if codec.exact:
            continue                                    # a reinterpretation: nothing to measure
        n = max(1, elements // codec.block_elements)
        raw = rng.integers(0, 256, (n, codec.block_bytes), dtype=np.uint8)
        stored = torch.from_numpy(raw).to(device)
        kernels.dequantize(name, stored[:16])           # warm-up (tables uploaded, kernels loaded)
        sync(device)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            out = kernels.dequantize(name, stored)
            sync(device)
            best = min(best, time.perf_counter() - start)
            del out
        hn = max(1, host_elements // codec.block_elements)
        start = time.perf_counter()
        codec.dequantize(raw[:hn])
        host = time.perf_counter() - start
        rates[name] = {"device_gb_s": n * codec.block_elements * 4 / best / 1e9,
                       "host_gb_s": hn * codec.block_elements * 4 / host / 1e9}
        del stored
    return rates


# ------------------------------------------------------------------------------------------------ 4. model


def model_tensors(scale: float) -> list[tuple[str, tuple[int, ...], str]]:
    """Qwen2-7B's Q4_K_M layout (hidden 3584, FFN 18944, 28 layers, 4 KV heads of 128, vocabulary 152064;
    Q4_K matrices, Q6_K for attn_v/ffn_down in half the layers and the output, F32 norms and biases), every
    dim times ``scale`` (row lengths whole 256-blocks), plus one tensor of every other kernel type."""
    def dim(n: int, block: int = 1) -> int:
        m = max(1, round(n * scale))
        return max(block, m // block * block)

    hidden, ffn, kv, vocab = dim(3584, 256), dim(18944, 256), dim(512, 256), dim(152064)
    tensors = [("token_embd.weight", (vocab, hidden), "Q4_K")]
    for i in range(28):
        p = f"blk.{i}."
        heavy = "Q6_K" if i % 2 == 0 else "Q4_K"
        tensors += [(p + "attn_norm.weight", (hidden,), "F32"),
                    (p + "attn_q.weight", (hidden, hidden), "Q4_K"), (p + "attn_q.bias", (hidden,), "F32"),
                    (p + "attn_k.weight", (kv, hidden), "Q4_K"), (p + "attn_k.bias", (kv,), "F32"),
                    (p + "attn_v.weight", (kv, hidden), heavy), (p + "attn_v.bias", (kv,), "F32"),
                    (p + "attn_output.weight", (hidden, hidden), "Q4_K"),
                    (p + "ffn_norm.weight", (hidden,), "F32"),
                    (p + "ffn_gate.weight", (ffn, hidden), "Q4_K"), (p + "ffn_up.weight", (ffn, hidden), "Q4_K"),
                    (p + "ffn_down.weight", (hidden, ffn), heavy)]
    tensors += [("output_norm.weight", (hidden,), "F32"), ("output.weight", (vocab, hidden), "Q6_K")]
    for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS", "MXFP4",
                 "BF16", "F16"):
        tensors.append((f"extra.{name.lower()}", (64, 1024), name))
    return tensors


def write_gguf(path: str, tensors, seed: int = 0) -> None:
    """A minimal GGUF v3 (no metadata but the alignment): tensor infos, then each tensor's random bytes at
    a 32-byte aligned offset. Every byte random: scales may be NaN/inf, which the comparisons allow for."""
    from ckptfs.quant import codec_for

    rng = np.random.default_rng(seed)

    def string(s: str) -> bytes:
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    infos, offset, sizes = [], 0, []
    for name, shape, storage in tensors:
        codec = codec_for(storage)
        size = int(np.prod(shape)) // codec.block_elements * codec.block_bytes
        dims = tuple(reversed(shape))
        infos.append(string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, GGML_IDS[storage], offset))
        sizes.append(size)
        offset += -(-size // 32) * 32
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1)
    header += string("general.alignment") + struct.pack("<II", 4, 32) + b"".join(infos)
    with open(path, "wb") as f:
        f.write(header + b"\0" * (-len(header) % 32))
        for size in sizes:
            f.write(rng.integers(0, 256, size, dtype=np.uint8).tobytes() + b"\0" * (-size % 32))


def check_model(device: torch.device, scale: float, workdir: str) -> dict:
    import ckptfs
    from ckptfs.torchio import api

    path = os.path.join(workdir, "model.gguf")
    write_gguf(path, model_tensors(scale))
    use_kernels = None if device.type == "cuda" else True
    sync(device)
    start = time.perf_counter()
    on_device = api.load(path, device=device, use_kernels=use_kernels)
    sync(device)
    device_s = time.perf_counter() - start
    start = time.perf_counter()
    host = ckptfs.load(path)
    host_s = time.perf_counter() - start
    copied = {k: v.to(device) for k, v in host.items()}
    sync(device)
    host_then_copy_s = time.perf_counter() - start
    mismatched = [k for k in host if not same(on_device[k], copied[k])]
    start = time.perf_counter()
    bf16 = api.load(path, device=device, dtype=torch.bfloat16, use_kernels=use_kernels)
    sync(device)
    bf16_s = time.perf_counter() - start
    mismatched += [k + " (bf16)" for k in host if not same(bf16[k], copied[k].to(torch.bfloat16))]
    out_bytes = sum(v.numel() * v.element_size() for v in on_device.values())
    return {"file_bytes": os.path.getsize(path), "tensors": len(host), "output_bytes": out_bytes,
            "load_on_device_s": device_s, "load_bf16_on_device_s": bf16_s, "load_on_host_s": host_s,
            "host_then_copy_s": host_then_copy_s, "mismatched": mismatched}


# ------------------------------------------------------------------------------------------------ 5. errors


def check_errors(device: torch.device, workdir: str) -> dict:
    from ckptfs.torchio import api

    path = os.path.join(workdir, "model.gguf")
    found = {}
    try:
        api.load(path, device="cuda:99")
        found["bad_index"] = "no error"
    except ValueError as exc:
        found["bad_index"] = str(exc)
    if device.type != "cuda":
        return found
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    total = torch.cuda.get_device_properties(device).total_memory
    need = os.path.getsize(path) * 8                    # roughly the float32 output
    torch.cuda.set_per_process_memory_fraction(min(1.0, max(0.001, need / 4 / total)), device)
    try:
        api.load(path, device=device)
        found["out_of_memory"] = "no error"
    except MemoryError as exc:
        found["out_of_memory"] = str(exc)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    found["memory_back"] = torch.cuda.memory_allocated(device) == before
    return found


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (the torch kernels) even with CUDA")
    parser.add_argument("--json", help="write the summary here too")
    parser.add_argument("--scale", type=float, help="model dims scale (default 0.25 on CUDA, 0.03 on CPU)")
    parser.add_argument("--no-build", action="store_true", help="use the C kernels as they are")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    summary: dict = {"device": torch.cuda.get_device_name(0) if cuda else "cpu (torch kernels)",
                     "torch": torch.__version__, "python": sys.version.split()[0], "numpy": np.__version__}
    if not args.no_build:
        summary["build"] = build_native()
        print(f"build: {'ok' if summary['build']['ok'] else 'FAILED: ' + summary['build']['error']}", flush=True)
    from ckptfs.quant import native
    summary["native_types"] = sorted(native.native_types())

    summary["kernels"] = check_kernels(device, 4096 if cuda else 257)
    bad = [k for k, ok in summary["kernels"].items() if not ok]
    print(f"kernels: {len(summary['kernels']) - len(bad)}/{len(summary['kernels'])} bit-exact"
          f"{' FAILED: ' + ', '.join(bad) if bad else ''}", flush=True)

    summary["throughput"] = throughput(device, 1 << 26 if cuda else 1 << 18, 1 << 22 if cuda else 1 << 18)
    print(f"\n{'type':12s} {'device GB/s':>12s} {'host GB/s':>10s}   (float32 output, one host thread)")
    for name, r in summary["throughput"].items():
        print(f"{name:12s} {r['device_gb_s']:12.1f} {r['host_gb_s']:10.2f}")

    with tempfile.TemporaryDirectory(prefix="ckptfs-gpu-") as workdir:
        model = summary["model"] = check_model(device, args.scale or (0.25 if cuda else 0.03), workdir)
        print(f"\nmodel: {model['tensors']} tensors, file {model['file_bytes'] / 2**20:.0f} MiB, "
              f"output {model['output_bytes'] / 2**20:.0f} MiB float32")
        print(f"  load to {device} (kernels there)  {model['load_on_device_s']:7.2f} s")
        print(f"  load to {device} as bfloat16      {model['load_bf16_on_device_s']:7.2f} s")
        print(f"  load on host                   {model['load_on_host_s']:7.2f} s")
        print(f"  load on host, then .to({device}) {model['host_then_copy_s']:7.2f} s")
        print(f"  mismatched tensors: {model['mismatched'] or 'none'}")
        summary["errors"] = check_errors(device, workdir)
        for key, value in summary["errors"].items():
            print(f"  {key}: {value}")

    ok = (not bad and not model["mismatched"] and summary["errors"].get("bad_index", "").startswith("device")
          and summary["errors"].get("out_of_memory", "cuda").startswith("cuda")
          and summary["errors"].get("memory_back", True))
    summary["ok"] = ok
    print(f"\nSUMMARY: {'PASS' if ok else 'FAIL'} on {summary['device']} (torch {summary['torch']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
