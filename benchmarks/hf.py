"""End-to-end benchmark of hf/: transformers loading a GGUF three ways, side by side in one run.

(a) ``from_pretrained(dir, gguf_file=...)`` — transformers' own GGUF path (gguf-py's reader, dequantize all);
(b) ``from_pretrained(MNT/hf)`` — the folder of a ``ckptfs mount --hf`` of the same GGUF;
(b') the same on a fresh mount, the loading process reading model.safetensors once front to back first
(counted in its load time): transformers maps the file and touches the weights in the order of the first
forward pass, partly in parallel threads, which the kernel and the daemon serve less well than one stream;
(c) ``from_pretrained(saved)`` — that folder copied to local disk: a Hugging Face folder, the floor.

Each load runs in a fresh Python process (tokenizer, then model, float32), which reports: tokenizer and model
load time, its peak RSS (ru_maxrss), time to first token (one greedy step on a prompt) and tokens/s (greedy
decoding), and a hash of the prompt's float32 logits, which must be the same for (a), (b) and (c). Beside
them: the mount's own setup time and the daemon's peak RSS, and sequential read throughput of
hf/model.safetensors against the .npy stream of the same tensors on the same mount (``cat`` into /dev/null,
each on a fresh mount so no cache is warm).

The GGUF is real-shaped: scripts/make_realistic_gguf.py with Gemma 3 270M's shapes (18 layers, a 262,144-token
vocabulary, tied output, Q4_K_M's type mix), random weights. Results: docs/performance.md.

Usage: python -m benchmarks hf [--gguf PATH] [--layers 18] [--vocab 262144] [--tokens 16] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import REPO

#: runs in a fresh process: argv = mode ("gguf" DIR FILE | "folder" DIR | "folder-preread" DIR), tokens
LOADER = r"""
import hashlib, json, resource, sys, time
t0 = time.perf_counter()
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
t_import = time.perf_counter() - t0
mode, where, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
kwargs = {"gguf_file": rest.pop(0)} if mode == "gguf" else {}
n_tokens = int(rest[0])
t0 = time.perf_counter()
tok = AutoTokenizer.from_pretrained(where, **kwargs)
t_tok = time.perf_counter() - t0
t0 = time.perf_counter()
if mode == "folder-preread":  # one sequential pass first: the weights reach the page cache in file order
    import glob
    for name in sorted(glob.glob(where + "/*.safetensors")):
        with open(name, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass
model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kwargs).eval()
t_model = time.perf_counter() - t0
ids = tok("The quick brown fox jumps over the lazy dog", return_tensors="pt")["input_ids"]
with torch.no_grad():
    t0 = time.perf_counter()
    logits = model(ids).logits
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=n_tokens, min_new_tokens=n_tokens, do_sample=False)
    t_gen = time.perf_counter() - t0
print(json.dumps({"import_s": t_import, "tokenizer_s": t_tok, "model_s": t_model, "load_s": t_tok + t_model,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "first_token_s": t_first, "tokens_per_s": (out.shape[1] - ids.shape[1]) / t_gen,
                  "logits_sha256": hashlib.sha256(logits.numpy().tobytes()).hexdigest()[:16],
                  "dtype": str(model.dtype)}))
"""


def run_loader(args: list[str]) -> dict:
    result = subprocess.run([sys.executable, "-c", LOADER, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"loader {args} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def mount(src: Path, mnt: Path, *flags: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", "mount", str(src), str(mnt), *flags], check=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    return time.perf_counter() - start


def umount(mnt: Path) -> None:
    subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", "umount", str(mnt)], check=False,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


def daemon_memory(mnt: Path) -> dict:
    pid = json.loads(os.getxattr(str(mnt), "user.ckptfs.stats"))["pid"]
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon"):
                fields[key] = int(value.split()[0]) / 1024
    return fields


def stream(paths: list[Path]) -> tuple[int, float]:
    """Read the files one after the other with cat (the kernel's readahead, as a user would); bytes, seconds."""
    total = sum(p.stat().st_size for p in paths)
    start = time.perf_counter()
    for p in paths:
        subprocess.run(["cat", str(p)], stdout=subprocess.DEVNULL, check=True)
    return total, time.perf_counter() - start


def throughput(src: Path, work: Path, hf_dtype: str) -> dict:
    """MB/s of hf/model.safetensors and of every .npy, each on a fresh mount; the .npy files in as many bytes
    per value as the safetensors file (--dtype float32 beside float32, float16 beside bfloat16/float16)."""
    out = {}
    npy_dtype = "float32" if hf_dtype == "float32" else "float16"
    for what in ("npy", "safetensors"):
        mnt = work / f"mnt-{what}-{hf_dtype}"
        mnt.mkdir(exist_ok=True)
        mount(src, mnt, "--hf", "--hf-dtype", hf_dtype, "--dtype", npy_dtype)
        try:
            files = sorted(mnt.glob("*.npy")) if what == "npy" else [mnt / "hf" / "model.safetensors"]
            nbytes, seconds = stream(files)
            out[what] = {"bytes": nbytes, "seconds": seconds, "mb_per_s": nbytes / seconds / 1e6}
        finally:
            umount(mnt)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None, help="a GGUF to use (default: generate one)")
    parser.add_argument("--layers", type=int, default=18)
    parser.add_argument("--vocab", type=int, default=262144)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--stream-only", action="store_true", help="only the sequential read throughput")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="ckptfs-bench-hf-"))
    try:
        if args.gguf is None:
            from make_realistic_gguf import write

            src = work / "model" / "gemma3-270m-shaped.gguf"
            src.parent.mkdir()
            write(str(src), args.layers, args.vocab, False, 0)
        else:
            src = args.gguf.resolve()
        results: dict = {"gguf": str(src), "gguf_bytes": src.stat().st_size}
        if args.stream_only:
            for dtype in ("float32", "bfloat16"):
                results[f"stream_{dtype}"] = throughput(src, work, dtype)
            print(json.dumps(results, indent=2))
            return 0
        mnt = work / "mnt"
        mnt.mkdir()
        results["mount_setup_s"] = mount(src, mnt, "--hf", "--hf-dtype", "float32")
        try:
            saved = work / "saved"
            shutil.copytree(mnt / "hf", saved)
            results["a_gguf_file"] = run_loader(["gguf", str(src.parent), src.name, str(args.tokens)])
            results["b_mount_hf"] = run_loader(["folder", str(mnt / "hf"), str(args.tokens)])
            umount(mnt)  # a fresh mount: nothing of (b) left in the page cache or the daemon's cache
            mount(src, mnt, "--hf", "--hf-dtype", "float32")
            results["b_mount_hf_preread"] = run_loader(["folder-preread", str(mnt / "hf"), str(args.tokens)])
            results["c_saved_folder"] = run_loader(["folder", str(saved), str(args.tokens)])
            results["daemon_mib"] = daemon_memory(mnt)
        finally:
            umount(mnt)
        results["stream_float32"] = throughput(src, work, "float32")
        results["stream_bfloat16"] = throughput(src, work, "bfloat16")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    a, b, c = results["a_gguf_file"], results["b_mount_hf"], results["c_saved_folder"]
    results["ratios"] = {
        "load_speedup_b_vs_a": a["load_s"] / b["load_s"],
        "peak_rss_b_over_a": b["peak_rss_mib"] / a["peak_rss_mib"],
        "peak_rss_c_over_a": c["peak_rss_mib"] / a["peak_rss_mib"],
        "load_and_first_token_speedup_b_vs_a": (a["load_s"] + a["first_token_s"]) / (b["load_s"] + b["first_token_s"]),
        "load_and_first_token_speedup_b_preread_vs_a": (
            (a["load_s"] + a["first_token_s"])
            / (results["b_mount_hf_preread"]["load_s"] + results["b_mount_hf_preread"]["first_token_s"])),
        "logits_equal": (a["logits_sha256"] == b["logits_sha256"] == c["logits_sha256"]
                         == results["b_mount_hf_preread"]["logits_sha256"]),
        "safetensors_over_npy_f32": (results["stream_float32"]["safetensors"]["mb_per_s"]
                                     / results["stream_float32"]["npy"]["mb_per_s"]),
        "safetensors_over_npy_bf16": (results["stream_bfloat16"]["safetensors"]["mb_per_s"]
                                      / results["stream_bfloat16"]["npy"]["mb_per_s"]),
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"GGUF {src.name}: {results['gguf_bytes'] / 2**20:.0f} MiB; mount --hf setup {results['mount_setup_s']:.1f} s, "
          f"daemon peak RSS {results['daemon_mib'].get('VmHWM', 0):.0f} MiB")
    print(f"{'':18} {'tokenizer s':>11} {'model s':>8} {'load s':>7} {'peak RSS MiB':>12} {'1st token s':>11} "
          f"{'tok/s':>6}  logits")
    rows = (("(a) gguf_file", a), ("(b) mount hf/", b), ("(b') + cat first", results["b_mount_hf_preread"]),
            ("(c) saved folder", c))
    for label, r in rows:
        print(f"{label:18} {r['tokenizer_s']:11.2f} {r['model_s']:8.2f} {r['load_s']:7.2f} {r['peak_rss_mib']:12.0f} "
              f"{r['first_token_s']:11.3f} {r['tokens_per_s']:6.1f}  {r['logits_sha256']}")
    for dtype in ("float32", "bfloat16"):
        s = results[f"stream_{dtype}"]
        print(f"sequential read (hf/ in {dtype}): model.safetensors {s['safetensors']['mb_per_s']:.0f} MB/s, "
              f".npy stream {s['npy']['mb_per_s']:.0f} MB/s (same bytes per value)")
    r = results["ratios"]
    print(f"load (a)/(b) = {r['load_speedup_b_vs_a']:.1f}x; peak RSS (b)/(a) = {r['peak_rss_b_over_a']:.2f}, "
          f"(c)/(a) = {r['peak_rss_c_over_a']:.2f}; logits equal: {r['logits_equal']}; "
          f"safetensors/npy = {r['safetensors_over_npy_f32']:.2f} (float32), {r['safetensors_over_npy_bf16']:.2f} (bfloat16)")
    return 0
