"""Run llama.cpp's ``convert_hf_to_gguf.py`` (from the tree scripts/build_llama_cpp.sh builds) on a Hugging Face
folder: the oracle of ``gguf/model.gguf`` in tests/ggufview/ and the baseline of benchmarks/gguf_view.py.

The converter names a BPE tokenizer's pre-tokenizer by the hash of one text's token ids and refuses a hash its
table does not list; a tokenizer made for a test (or converted from a GGUF) has a hash of its own, so the run
registers it under ``pre`` — what the converter's update script does when it adds a model to the table. The
converter runs in a child of the project's Python (the tree's gguf-py first on its path), which reports its
own peak RSS and bytes written to disk.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from llama_client import probe_path

# argv: tree, pre name, converter arguments; the child's last stderr line is its own figures (JSON).
_CONVERT = """
import json, resource, runpy, sys
tree, name = sys.argv[1], sys.argv[2]
sys.argv = [tree + "/convert_hf_to_gguf.py", *sys.argv[3:]]
sys.path.insert(0, tree)
from conversion import base
listed = base.TextModel.get_vocab_base_pre
def registered(self, tokenizer):
    try:
        return listed(self, tokenizer)
    except NotImplementedError:  # a hash the table lacks, registered under the given name
        return name
base.TextModel.get_vocab_base_pre = registered
runpy.run_path(sys.argv[0], run_name="__main__")
io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
print(json.dumps({"write_bytes": int(io["write_bytes"]),
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}), file=sys.stderr)
"""


def llama_cpp_tree() -> Path:
    """The llama.cpp source tree the client tests build (beside the probe's bin/ folder)."""
    return probe_path().parent.parent / "src" / "llama.cpp"


def convert(folder: str | Path, out: str | Path, outtype: str, pre: str, timeout: float = 1800,
            extra: tuple[str, ...] = ()) -> dict:
    """The converter on ``folder`` into ``out`` (``extra``: more of its options): ``wall_s``,
    ``write_bytes``, ``maxrss_kib``; RuntimeError with its stderr's end when it fails."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CONVERT, str(llama_cpp_tree()), pre, str(folder),
                           "--outfile", str(out), "--outtype", outtype, *extra],
                          capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed: {done.stderr[-3000:]}")
    return {"wall_s": wall, **json.loads(done.stderr.strip().splitlines()[-1])}
