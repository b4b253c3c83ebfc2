"""Valid seed files for the fuzz targets, written by the references (gguf-py's writer, the safetensors layout
of tests/fixtures.py). Small on purpose: a mutation then lands in the header most of the time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fixtures.py when run as a script

from fixtures import VT, Written, quantized, write_gguf, write_safetensors


def gguf_seeds(folder: Path) -> list[tuple[Path, int]]:
    """Every GGUF value type, nested arrays, several quant layouts, an unknown type id; both byte orders and
    both versions. Returns (path, start of the data section) per seed."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(11)
    tensors = {
        "a": (rng.standard_normal(8).astype(np.float32), "F32"),
        "q8": (rng.standard_normal((2, 32)).astype(np.float32), "Q8_0"),
        "h": (rng.standard_normal((3, 5)).astype(np.float16), "F16"),
        "k": (quantized("Q4_K", (256,), rng), "Q4_K"),
        "odd": (rng.integers(0, 256, 20, dtype=np.uint8), "GGML_TYPE_31"),
    }
    metadata = {"s": "text", "words": ["x", "yy", ""], "n": [[1, 2], [3]], "u": (7, VT.UINT64), "f": 1.5,
                "b": (True, VT.BOOL), "i8": ([-1, 2], VT.ARRAY, VT.INT8)}
    paths = []
    for name, kwargs in (("le3", {}), ("be3", {"big_endian": True}), ("le2", {"version": 2})):
        written = write_gguf(folder / f"{name}.gguf", {k: v for k, v in tensors.items()
                                                      if not (kwargs and k == "odd")}, metadata, **kwargs)
        paths.append(_with_data_start(written))
    paths.append(_with_data_start(write_gguf(folder / "aligned.gguf", {"a": tensors["a"]}, {"s": "x"}, alignment=64)))
    return paths


def _with_data_start(written: Written) -> tuple[Path, int]:
    """The first tensor's bytes begin the data section (the writer stores tensors in order)."""
    first = next(iter(written.tensors.values())).raw
    return written.path, written.path.read_bytes().index(first)


def safetensors_seeds(folder: Path) -> list[Path]:
    import ml_dtypes

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(12)
    tensors = {
        "w": rng.standard_normal((4, 8)).astype(np.float32),
        "b": rng.standard_normal(6).astype(ml_dtypes.bfloat16),
        "i": rng.integers(-5, 5, 3, dtype=np.int64),
        "m": rng.integers(0, 2, 5).astype(bool),
        "e": rng.standard_normal(4).astype(ml_dtypes.float8_e4m3fn),
        "p": (bytes(range(6)), "F4", (3, 4)),
        "s": np.array(1.5, dtype=np.float32),
        "z": np.zeros((0, 2), dtype=np.float16),
    }
    paths = [write_safetensors(folder / "all.safetensors", tensors, {"format": "pt", "k": "v"}).path,
             write_safetensors(folder / "one.safetensors", {"x": np.arange(4, dtype=np.float32)}).path]
    return paths


def index_seed(folder: Path) -> tuple[Path, dict, list[str]]:
    """A two-shard safetensors checkpoint with its index: (index path, index document, shard file names)."""
    folder.mkdir(parents=True, exist_ok=True)
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    write_safetensors(folder / shards[0], {"t0": np.arange(4, dtype=np.float32), "t1": np.ones(2, np.float16)})
    write_safetensors(folder / shards[1], {"t2": np.arange(3, dtype=np.int32)})
    (folder / "config.json").write_text('{"model_type": "test"}')
    doc = {"metadata": {"total_size": 30}, "weight_map": {"t0": shards[0], "t1": shards[0], "t2": shards[1]}}
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps(doc))
    return index, doc, shards


if __name__ == "__main__":  # write the seeds for a manual fuzzing run: python seeds.py gguf|safetensors DIR
    kind, out = sys.argv[1], Path(sys.argv[2])
    print("\n".join(str(p) for p, _ in gguf_seeds(out)) if kind == "gguf" else
          "\n".join(map(str, safetensors_seeds(out))))
