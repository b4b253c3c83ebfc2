"""A small GGUF for the cache-tier tests: a Q4_K and a Q8_0 tensor of several block groups each (decoded
groups to share) and an F32 tensor (served straight from its bytes, never cached). Values: gguf-py's
dequantize of what gguf-py's writer stored (tests/fixtures.py). ``forge``: a tier entry rewritten as an
attacker without the key would."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
from fixtures import quantized, write_gguf

FORGED_VALUE = 1234.5
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


def forge(data: bytes) -> bytes:
    """``data`` (an entry) with every value replaced by FORGED_VALUE, its crc32s recomputed as entry.py's
    docstring lays them out (payload crc at 40, header crc of bytes 0..44 at 44); bytes 48..64 (the MAC, which needs the key) kept."""
    dtype = np.dtype(data[8:16].rstrip(b"\0").decode())
    (length,) = struct.unpack_from("<Q", data, 16)
    payload = np.full(length // dtype.itemsize, FORGED_VALUE, dtype).tobytes()
    head = data[:40] + struct.pack("<I", zlib.crc32(payload) & 0xFFFFFFFF)
    return head + struct.pack("<I", zlib.crc32(head) & 0xFFFFFFFF) + data[48:64] + payload
