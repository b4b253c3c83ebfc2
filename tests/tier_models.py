"""A small GGUF for the cache-tier tests: a Q4_K and a Q8_0 tensor of several block groups each (decoded
groups to share) and an F32 tensor (served straight from its bytes, never cached). Values: gguf-py's
dequantize of what gguf-py's writer stored (tests/fixtures.py). ``forge``: a tier entry rewritten as an
attacker without the key would."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np

from conftest import mount_stats, wait_until
from fixtures import quantized, write_gguf
from mount_expect import npy_bytes

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


def expected_files(refs: dict) -> dict[str, bytes]:
    return {f"{name}.npy": npy_bytes(ref.astype(np.float32)) for name, ref in refs.items()}


def read_all(mnt: Path, expected: dict[str, bytes], chunk: int = 64 * 1024) -> int:
    """Read every expected file in ``chunk`` steps and compare; the bytes read. The kernel's cached pages of
    each file are dropped first, so the daemon (and its tiers) answers every read, not the page cache."""
    total = 0
    for name, want in expected.items():
        with open(mnt / name, "rb") as fh:
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            got = b"".join(iter(lambda: fh.read(chunk), b""))
        assert got == want, name
        total += len(got)
    return total


def settled(mnt: Path, tier: str) -> dict:
    """The mount's stats once its background writes to ``tier`` are done (bounded wait)."""
    assert wait_until(lambda: mount_stats(mnt)["tiers"][tier]["pending"] == 0, timeout=60)
    return mount_stats(mnt)
