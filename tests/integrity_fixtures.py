"""Shared pieces of the integrity tests: reference hashes of a file's tensors, and byte flips.

The expected manifest entries come from the reference readers (gguf-py's ``GGUFReader`` offsets and sizes,
``safetensors.deserialize`` bytes) and Python's ``hashlib``/``zlib``: never from ckptfs.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from pathlib import Path

import numpy as np

CHUNK = 1 << 20


def reference_tensors(path: str | Path) -> list[tuple[str, int, bytes]]:
    """(name, offset, stored bytes) of every tensor, from the reference reader of the file's format."""
    path = Path(path)
    blob = path.read_bytes()
    if blob[:4] == b"GGUF":
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        return [(t.name, int(t.data_offset), blob[int(t.data_offset):int(t.data_offset) + int(t.n_bytes)])
                for t in reader.tensors]
    import safetensors

    found = []
    for name, entry in safetensors.deserialize(blob):
        data = bytes(entry["data"])
        found.append((name, _locate(blob, data, name), data))
    return found


def _locate(blob: bytes, data: bytes, name: str) -> int:
    """Where the reference's bytes of ``name`` lie (safetensors' API gives bytes, not offsets): the header
    is JSON, and the data buffer starts after it."""
    import json
    import struct

    (length,) = struct.unpack_from("<Q", blob)
    begin, _ = json.loads(blob[8:8 + length])[name]["data_offsets"]
    offset = 8 + length + begin
    assert blob[offset:offset + len(data)] == data
    return offset


def expected_entry(name: str, offset: int, data: bytes) -> dict:
    return {"name": name, "offset": offset, "stored_nbytes": len(data), "crc32": zlib.crc32(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "chunks_crc32": [zlib.crc32(data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)]}


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def flip(path: str | Path, offset: int, *, keep_mtime: bool = True) -> None:
    """Invert one byte in place; with ``keep_mtime`` the size and mtime stay as they were (``rsync --inplace
    -t``), so nothing but the bytes tells the file changed."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0xFF]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def big_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """A safetensors file (the reference writer) with tensors spanning several 1 MiB chunks, one ending
    inside a chunk, and small ones between them."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(13)
    tensors = {
        "big.weight": rng.standard_normal((640, 1024)).astype(np.float32),       # 2.5 MiB: 3 chunks
        "mid.weight": rng.standard_normal((300, 1000)).astype(np.float16),       # 600,000 bytes: 1 chunk
        "norm.weight": rng.standard_normal(4096).astype(np.float32),
        "ids": rng.integers(0, 2**31, 1000, dtype=np.int64),
        "empty": np.zeros((0, 4), np.float32),
    }
    save_file(tensors, str(path))
    return tensors


def point_gguf_tensor_at(path: str | Path, name: str, other: str) -> None:
    """Rewrite the header of a GGUF so that tensor ``name`` starts where tensor ``other`` does (bytes shared
    or overlapping), locating the offset field through gguf-py's reader."""
    import struct

    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    by_name = {t.name: t for t in reader.tensors}
    field = by_name[name].field
    position = field.offset + sum(int(p.nbytes) for p in field.parts[:-1])
    relative = int(by_name[other].data_offset) - int(reader.data_offset)
    del reader, by_name, field
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(struct.pack("<Q", relative))
