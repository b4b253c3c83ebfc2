"""A small GGUF for the cache-tier tests: a Q4_K and a Q8_0 tensor of several block groups each (decoded
groups to share) and an F32 tensor (served straight from its bytes, never cached). Values: gguf-py's
dequantize of what gguf-py's writer stored (tests/fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fixtures import quantized, write_gguf

SHAPES = {"blk.0.q4k": ((64, 4096), "Q4_K"), "blk.0.q8": ((32, 2048), "Q8_0"), "norm": ((4096,), "F32")}


def write_model(path: Path, seed: int) -> dict[str, np.ndarray]:
    """Write the model with values from ``seed`` (same size for every seed); its reference values by name."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, (shape, kind) in SHAPES.items():
        if kind == "F32":
            tensors[name] = (rng.standard_normal(shape).astype(np.float32), kind)
        else:
            tensors[name] = (quantized(kind, shape, rng), kind)
    written = write_gguf(path, tensors)
    return {name: ref.array for name, ref in written.tensors.items()}
