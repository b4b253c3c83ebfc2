"""hf/ of a quantized folder: ``from_pretrained(MNT/hf)`` against dequantizing to disk first, then loading.

The folder is a Qwen3-0.6B-FP8-shaped checkpoint (hidden 1024, intermediate 3072, 28 layers, 16 heads and 8
KV heads of 128, a 151,936-token vocabulary, tied embeddings; every linear layer of the blocks F8_E4M3 with
BF16 ``weight_scale_inv`` per 128 x 128 block, as Qwen3-*-FP8 ships), random codes and scales, written once.
Two ways to a loaded bfloat16 model, each step in a fresh Python process:

(a) the scheme's reference code dequantizes the folder to disk — compressed-tensors' ``convert_checkpoint``
    with its ``FP8BlockDequantizer.from_pretrained`` (every layer with a scale) on CPU, one worker (what its
    documentation offers for this), writing a bfloat16
    folder — then ``AutoModelForCausalLM.from_pretrained(that folder)``;
(b) ``ckptfs mount --hf`` of the FP8 folder, then ``from_pretrained(MNT/hf)``.

Reported: time to a loaded model (a: conversion + load; b: mount setup + load), each process's peak RSS
(ru_maxrss), the bytes each side writes (the converter's ``/proc/self/io`` ``write_bytes``; the daemon's,
before and after the load, from ``/proc/PID/io``), the daemon's peak RSS, and a hash of the logits of one
prompt, which must be equal for (a) and (b). Both sides read the FP8 folder from the page cache (it was just
written). Results: docs/performance.md.

Usage: python -m benchmarks hf_release [--layers 28] [--vocab 151936] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import REPO
from benchmarks.hf import daemon_memory, mount, umount

TOKENS = [[1, 5, 17, 42, 99, 3, 64, 127, 8, 0, 33, 71]]

#: argv: folder; loads it in bfloat16 and reports time, peak RSS and the logits' hash
LOADER = r"""
import hashlib, json, resource, sys, time
import torch
from transformers import AutoModelForCausalLM
t0 = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16, device_map="cpu").eval()
load_s = time.perf_counter() - t0
with torch.no_grad():
    logits = model(torch.tensor(json.loads(sys.argv[2]))).logits
print(json.dumps({"load_s": load_s, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "logits_sha256": hashlib.sha256(logits.float().numpy().tobytes()).hexdigest()[:16]}))
"""

#: argv: source folder, output folder; the reference dequantization to disk
CONVERTER = r"""
import json, resource, sys, time
import torch
from compressed_tensors.entrypoints.convert.convert_checkpoint import convert_checkpoint
from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import FP8BlockDequantizer
t0 = time.perf_counter()
converter = FP8BlockDequantizer.from_pretrained(sys.argv[1], weight_block_size=(128, 128), dtype=torch.bfloat16)
convert_checkpoint(sys.argv[1], sys.argv[2], converter, device="cpu", max_workers=1)
seconds = time.perf_counter() - t0
io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
print(json.dumps({"convert_s": seconds, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "write_bytes": int(io["write_bytes"])}))
"""


def run_python(code: str, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    if result.returncode != 0:
        raise SystemExit(f"{args} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def write_fp8_folder(folder: Path, layers: int, vocab: int) -> int:
    """The Qwen3-0.6B-FP8-shaped folder (module docstring); returns its bytes."""
    import ml_dtypes
    import numpy as np
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    config = Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, vocab_size=vocab, tie_word_embeddings=True,
                         max_position_embeddings=40960)
    rng = np.random.default_rng(0)

    def bf16(*shape: int, scale: float = 0.02) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape, np.float32) * scale).to(torch.bfloat16)

    def fp8(out: int, n: int) -> dict[str, torch.Tensor]:
        codes = rng.integers(0, 256, (out, n), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x38   # no NaN code (1.0 instead)
        scales = rng.uniform(1e-4, 1e-3, (-(-out // 128), -(-n // 128))).astype(ml_dtypes.bfloat16)
        return {"weight": torch.from_numpy(codes).view(torch.float8_e4m3fn),
                "weight_scale_inv": torch.from_numpy(scales.view(np.uint16)).view(torch.bfloat16)}

    tensors = {"model.embed_tokens.weight": bf16(vocab, 1024), "model.norm.weight": bf16(1024, scale=1.0)}
    q, kv, hidden, inter = 16 * 128, 8 * 128, 1024, 3072
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, (out, n) in {"self_attn.q_proj": (q, hidden), "self_attn.k_proj": (kv, hidden),
                               "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, q),
                               "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
                               "mlp.down_proj": (hidden, inter)}.items():
            tensors.update({f"{p}{name}.{role}": t for role, t in fp8(out, n).items()})
        for norm, size in (("input_layernorm", hidden), ("post_attention_layernorm", hidden),
                           ("self_attn.q_norm", 128), ("self_attn.k_norm", 128)):
            tensors[f"{p}{norm}.weight"] = bf16(size, scale=1.0)
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    doc = config.to_dict()
    doc["dtype"] = "bfloat16"
    doc["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    (folder / "config.json").write_text(json.dumps(doc, indent=2))
    return sum(p.stat().st_size for p in folder.iterdir())


def daemon_io(mnt: Path) -> dict:
    pid = json.loads(os.getxattr(str(mnt), "user.ckptfs.stats"))["pid"]
    with open(f"/proc/{pid}/io") as f:
        return {key: int(value) for key, value in (line.split(": ") for line in f.read().splitlines())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="ckptfs-bench-hf-release-"))
    tokens = json.dumps(TOKENS)
    try:
        src = work / "Qwen3-FP8-shaped"
        results: dict = {"layers": args.layers, "vocab": args.vocab,
                         "fp8_folder_bytes": write_fp8_folder(src, args.layers, args.vocab)}
        dense = work / "dequantized"
        converted = run_python(CONVERTER, str(src), str(dense))
        loaded = run_python(LOADER, str(dense), tokens)
        results["a_dequantize_then_load"] = {
            **converted, "load_s": loaded["load_s"], "load_peak_rss_mib": loaded["peak_rss_mib"],
            "total_s": converted["convert_s"] + loaded["load_s"], "logits_sha256": loaded["logits_sha256"],
            "folder_bytes": sum(p.stat().st_size for p in dense.iterdir())}
        shutil.rmtree(dense)
        mnt = work / "mnt"
        mnt.mkdir()
        setup = mount(src, mnt, "--hf")
        try:
            before = daemon_io(mnt)
            loaded = run_python(LOADER, str(mnt / "hf"), tokens)
            after = daemon_io(mnt)
            results["b_mount_hf"] = {
                "mount_setup_s": setup, **loaded, "total_s": setup + loaded["load_s"],
                "daemon_write_bytes": after["write_bytes"] - before["write_bytes"],
                "daemon_read_bytes": after["read_bytes"] - before["read_bytes"],
                "daemon_mib": daemon_memory(mnt)}
        finally:
            umount(mnt)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    a, b = results["a_dequantize_then_load"], results["b_mount_hf"]
    results["ratios"] = {"time_b_over_a": b["total_s"] / a["total_s"],
                         "logits_equal": a["logits_sha256"] == b["logits_sha256"]}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"FP8 folder {results['fp8_folder_bytes'] / 2**20:.0f} MiB ({args.layers} layers, vocab {args.vocab})")
    print(f"(a) convert_checkpoint {a['convert_s']:.1f} s (peak RSS {a['peak_rss_mib']:.0f} MiB, wrote "
          f"{a['write_bytes'] / 2**20:.0f} MiB) + from_pretrained {a['load_s']:.1f} s (peak RSS "
          f"{a['load_peak_rss_mib']:.0f} MiB) = {a['total_s']:.1f} s")
    print(f"(b) mount --hf {b['mount_setup_s']:.1f} s + from_pretrained(MNT/hf) {b['load_s']:.1f} s (peak RSS "
          f"{b['peak_rss_mib']:.0f} MiB) = {b['total_s']:.1f} s; daemon wrote {b['daemon_write_bytes']} bytes, "
          f"peak RSS {b['daemon_mib'].get('VmHWM', 0):.0f} MiB")
    print(f"b/a time {results['ratios']['time_b_over_a']:.2f}x; logits equal: {results['ratios']['logits_equal']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
