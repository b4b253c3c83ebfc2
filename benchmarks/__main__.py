"""The suite's one runner: ``python -m benchmarks`` lists the workloads, ``python -m benchmarks NAME
[ARGS...]`` runs one with its own arguments.

Listing reads each module's docstring from its file (``ast``), so it imports nothing heavy; running imports
only the workload asked for.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# workload -> the figure of docs/performance.md it produces (helpers: what they are for)
WORKLOADS = {
    "open": "GGUF header in-process: ckptfs.formats.read_file vs GGUFReader",
    "dequant": "dequantization per type, one core, vs gguf-py quants.dequantize",
    "ceiling": ".raw of the largest tensor streamed vs a zero-work Python FUSE filesystem",
    "scale": "94k-tensor safetensors header: mount + listings / ckptfs.open vs safe_open + keys",
    "torch": "ckptfs.load to float32 CPU tensors vs gguf-py reader + dequantize + torch.from_numpy",
    "hf": "transformers from_pretrained(MNT/hf) vs from_pretrained(dir, gguf_file=...)",
    "hf_release": "from_pretrained(MNT/hf) of an FP8 folder vs compressed-tensors' dequantize-to-disk then loading",
    "gguf_view": "llama.cpp on a --gguf mount's gguf/model.gguf vs convert_hf_to_gguf.py then loading",
    "clients": "llama.cpp through a local mount / a cold https:// mount vs the file / downloading first",
    "remote": "a fresh remote mount's stream behind a capped origin vs hf_transfer and aria2c; uncapped and warm vs local",
    "packed": "GPTQ 4096 x 4096 view: random 4 KiB read and stream vs AutoGPTQ's dequantization",
    "bnb": "bitsandbytes NF4 4096 x 4096 view: random 4 KiB read vs its dequantization; .npy vs .raw stream",
    "fp8": "FP8 7168 x 2048 block view: random 4 KiB read vs FP8BlockDequantizer; .npy stream vs .raw stream",
    "fp4": "NVFP4 4096 x 4096 and gpt-oss MXFP4 expert views: random 4 KiB read vs the references; .npy vs .raw",
    "tiers": "shared tiers: second daemon vs cold / no tier; Redis killed or frozen; eight workers, one copy",
    "cache_mac": "a shared-tier hit's check with a key (HMAC-SHA256) vs without (crc32)",
    "fleet": "a fleet of daemons through one Redis Cluster vs each fetching alone",
    "integrity": "ckptfs manifest / verify vs one hashlib.sha256 pass over the file",
    "metrics": "--metrics scraped every second vs a plain mount streaming every .npy",
    "range_clients": "docs/remote.md: the bulk byte path's candidates (urllib3, pycurl, obstore) against nginx",
    "store_writes": "docs/remote.md: the disk store's writes vs a downloader writing one file",
    "commits": "two checkouts side by side: ckptfs bench (local), an uncapped and a warm remote stream, new/old",
    "fleet_model": "docs/scale.md: the fleet model's table (no measurement)",
    "make_bench_safetensors": "fixture: a real-shaped safetensors file for ckptfs bench",
    "make_scale_safetensors": "fixture: the ~94,000-tensor safetensors file of scale",
}


def summary(name: str) -> str:
    """The first line of the workload module's docstring, read without importing it."""
    doc = ast.get_docstring(ast.parse((HERE / f"{name}.py").read_text()))
    return doc.splitlines()[0] if doc else ""


def listing() -> str:
    width = max(map(len, WORKLOADS))
    lines = ["python -m benchmarks NAME [ARGS...]   (NAME --help for its arguments)", ""]
    for name, row in WORKLOADS.items():
        lines.append(f"{name:{width}}  {summary(name)}")
        lines.append(f"{'':{width}}  figure: {row}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in WORKLOADS:
        print(f"no workload {name!r}; python -m benchmarks lists them", file=sys.stderr)
        return 2
    sys.argv = [f"python -m benchmarks {name}", *rest]  # argparse's prog in usage lines
    from loopback.servers import MissingTool

    try:
        return importlib.import_module(f"benchmarks.{name}").main(rest) or 0
    except MissingTool as exc:  # a server the workload starts cannot run here: one line, not a traceback
        print(f"benchmarks {name}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
