"""llama.cpp's time to first token on a ``--gguf`` mount's ``gguf/model.gguf`` against convert-then-load.

With peak RSS and bytes written to disk for both (docs/gguf-view.md has the figures).

The model is the round trip a user would try: a GGUF shaped like Gemma 3 270M (scripts/make_realistic_gguf.py
with the skeleton in scripts/real-shapes/) mounted with ``--hf``, its ``hf/`` folder copied out (BF16
safetensors, a SentencePiece-style BPE ``tokenizer.json``). Then, on that folder, ``--runs`` times each:

- **mount**: ``ckptfs mount FOLDER MNT --gguf`` (the command returns once the mount answers; the header is
  built before that), then the probe on ``MNT/gguf/model.gguf``. Time to first token = the mount command's
  wall time + the probe's ``ttft_ms`` (process start to the first generated token). Peak RSS: the daemon's
  ``VmHWM`` and the probe's. Disk written: the daemon's ``write_bytes`` (``/proc/PID/io``) in all, and while
  llama.cpp loaded and ran (from the mount's answer to the probe's end).
- **convert**: llama.cpp's ``convert_hf_to_gguf.py`` (``--outtype auto``; the tokenizer's hash is registered
  under ``gemma4``, as the converter's update script would list it), then the probe on its file. Time to first
  token = the converter's wall time + the probe's ``ttft_ms``. Peak RSS: the converter's and the probe's.
  Disk written: the converter's ``write_bytes``.

The probe is the client tests' (scripts/llama_client.py, mmap load, ``--threads``); the converter runs as
the tests run it (scripts/llama_convert.py). The page cache is left
warm for both (the folder's files were just written; pass ``--drop-caches`` as root for cold runs).
Medians of ``--runs`` are printed, with each run, as one JSON object.

``--scheme fp8``: the same folder with its projections in fine-grained FP8 as Qwen3-*-FP8 releases them
(scripts/fp8_folder.py: E4M3 codes, a BF16 ``weight_scale_inv`` per 128 x 128 block), which the converter
dequantizes and writes in BF16 (``auto``: the embedding is BF16), and the mount serves dequantized per read.

Usage: python -m benchmarks gguf_view [--work /tmp/ckptfs-bench/gguf-view] [--runs 3] [--threads 2]
       [--scheme bf16|fp8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import SCRIPTS, SKELETONS

import fp8_folder  # scripts/, on the import path (benchmarks/__init__.py)
import llama_convert

SKELETON = SKELETONS / "gemma3-270m-q4_k_m.json"
CKPTFS = [shutil.which("ckptfs", path=str(Path(sys.executable).parent)) or "ckptfs"]

def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def probe(model: Path, threads: int) -> dict:
    """One probe run, with its peak RSS (a child of its own, so RUSAGE_CHILDREN is its alone)."""
    code = ("import json, resource, sys; sys.path.insert(0, sys.argv[1]); import llama_client; "
            "r = llama_client.run(sys.argv[2], 'mmap', 4, threads=int(sys.argv[3])); "
            "r['maxrss_kib'] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; print(json.dumps(r))")
    done = subprocess.run([sys.executable, "-c", code, str(SCRIPTS), str(model), str(threads)],
                          capture_output=True, text=True, check=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def proc_value(pid: int, file: str, key: str) -> int:
    with open(f"/proc/{pid}/{file}") as f:
        line = next(line for line in f if line.startswith(key + ":"))
    return int(line.split()[1])


def run_mount(folder: Path, work: Path, threads: int) -> dict:
    mnt = Path(tempfile.mkdtemp(prefix="mnt-", dir=work))
    start = time.perf_counter()
    subprocess.run([*CKPTFS, "mount", str(folder), str(mnt), "--gguf"], check=True, timeout=600)
    mount_s = time.perf_counter() - start
    try:
        model = mnt / "gguf" / "model.gguf"
        if not model.exists():
            raise SystemExit("the mount has no gguf/model.gguf: see `ckptfs info --gguf FOLDER`")
        pid = json.loads(os.getxattr(str(mnt), "user.ckptfs.stats"))["pid"]
        written_at_ready = proc_value(pid, "io", "write_bytes")
        result = probe(model, threads)
        daemon_rss = proc_value(pid, "status", "VmHWM")
        written = proc_value(pid, "io", "write_bytes")
    finally:
        subprocess.run([*CKPTFS, "umount", str(mnt)], check=False, timeout=120)
        mnt.rmdir()
    return {"ttft_s": mount_s + result["ttft_ms"] / 1000, "mount_s": mount_s, "probe_ttft_s": result["ttft_ms"] / 1000,
            "peak_rss_mib": {"daemon": daemon_rss / 1024, "llama.cpp": result["maxrss_kib"] / 1024},
            "disk_written_bytes": written, "disk_written_while_serving": written - written_at_ready,
            "tokens": result["tokens"]}


def run_convert(folder: Path, work: Path, threads: int) -> dict:
    out = work / "converted.gguf"
    out.unlink(missing_ok=True)
    own = llama_convert.convert(folder, out, "auto", "gemma4")
    result = probe(out, threads)
    return {"ttft_s": own["wall_s"] + result["ttft_ms"] / 1000, "convert_s": own["wall_s"],
            "probe_ttft_s": result["ttft_ms"] / 1000,
            "peak_rss_mib": {"converter": own["maxrss_kib"] / 1024, "llama.cpp": result["maxrss_kib"] / 1024},
            "disk_written_bytes": own["write_bytes"], "file_bytes": out.stat().st_size, "tokens": result["tokens"]}


def prepare(work: Path) -> Path:
    """The hf/ folder of a Gemma-3-270M-shaped GGUF's mount, copied out (made once per work folder)."""
    folder = work / "gemma-3-270m"
    if (folder / "model.safetensors").is_file():
        return folder
    source = work / "gemma3-270m.gguf"
    subprocess.run([sys.executable, str(SCRIPTS / "make_realistic_gguf.py"), str(source), "--shapes", str(SKELETON)],
                   check=True, timeout=600)
    mnt = Path(tempfile.mkdtemp(prefix="mnt-", dir=work))
    subprocess.run([*CKPTFS, "mount", str(source), str(mnt), "--hf"], check=True, timeout=600)
    try:
        shutil.copytree(mnt / "hf", folder)
    finally:
        subprocess.run([*CKPTFS, "umount", str(mnt)], check=False, timeout=120)
        mnt.rmdir()
    return folder


def prepare_fp8(work: Path) -> Path:
    """``prepare``'s folder with its projections in 128 x 128 block FP8 (made once per work folder)."""
    folder = work / "gemma-3-270m-fp8"
    if (folder / "config.json").is_file() and "quantization_config" in (folder / "config.json").read_text():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(prepare(work), folder)
    return fp8_folder.convert_folder(folder, (128, 128))


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="/tmp/ckptfs-bench/gguf-view")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drop-caches", action="store_true", help="drop the page cache before each run (root)")
    parser.add_argument("--scheme", choices=["bf16", "fp8"], default="bf16",
                        help="the folder as made (bf16) or with its projections in block FP8")
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    folder = prepare(work) if args.scheme == "bf16" else prepare_fp8(work)
    mounts, converts = [], []
    for _ in range(args.runs):
        for runs, run in ((mounts, run_mount), (converts, run_convert)):
            if args.drop_caches:
                drop_caches()
            runs.append(run(folder, work, args.threads))
    if any(m["tokens"] != c["tokens"] for m, c in zip(mounts, converts)):
        raise SystemExit("the mount's greedy tokens differ from the converted file's")
    ratio = median_of(mounts, "ttft_s") / median_of(converts, "ttft_s")
    print(json.dumps({"machine": {"cpus": os.cpu_count(), "uname": " ".join(os.uname())}, "scheme": args.scheme,
                      "folder_bytes": sum(p.stat().st_size for p in folder.iterdir()),
                      "mount_ttft_s": median_of(mounts, "ttft_s"), "convert_ttft_s": median_of(converts, "ttft_s"),
                      "ratio": ratio, "mount": mounts, "convert": converts}, indent=1))
    return 0
