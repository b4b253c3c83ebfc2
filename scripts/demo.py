"""The main job on the built-in demo checkpoint: generate it, mount it, list it, load a tensor, unmount.

Run by ``scripts/setup.sh --demo``; uses the installed ``ckptfs`` command exactly as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_demo_gguf import write_demo  # noqa: E402

CKPTFS = str(Path(sys.executable).with_name("ckptfs"))


def run(*args: str) -> str:
    print("$", " ".join(args))
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    print(out, end="" if out.endswith("\n") or not out else "\n")
    return out


def main() -> int:
    demo = HERE.parent / "demo"
    ckpt, mnt = demo / "demo.gguf", demo / "mnt"
    write_demo(str(ckpt))
    mnt.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(mnt):
        run(CKPTFS, "umount", str(mnt))
    run(CKPTFS, "info", str(ckpt))
    run(CKPTFS, "mount", str(ckpt), str(mnt))
    try:
        run("ls", "-l", str(mnt))
        run("cat", str(mnt / "blk.0.attn_q.weight.meta.json"))
        print('$ python -c \'np.load("demo/mnt/blk.0.attn_q.weight.npy", mmap_mode="r")\'')
        arr = np.load(mnt / "blk.0.attn_q.weight.npy", mmap_mode="r")
        print(f"shape={arr.shape} dtype={arr.dtype} first row[:6]={np.asarray(arr[0, :6])}")
        meta = json.loads((mnt / "blk.0.attn_q.weight.meta.json").read_text())
        assert list(arr.shape) == meta["shape"], "shape in .npy and meta.json differ"
        try:
            from gguf import GGUFReader
            from gguf.quants import dequantize
        except ImportError:
            pass
        else:
            t = next(t for t in GGUFReader(str(ckpt)).tensors if t.name == "blk.0.attn_q.weight")
            same = np.array_equal(np.asarray(arr), dequantize(t.data, t.tensor_type))
            print(f"equal to gguf-py's dequantization: {same}")
            if not same:
                return 1
    finally:
        run(CKPTFS, "umount", str(mnt))
    print("demo done: the checkpoint was mounted, listed, read with numpy and unmounted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
