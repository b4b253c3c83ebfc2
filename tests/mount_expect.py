"""What a mount of a reference-written checkpoint must show, spelled out independently of ckptfs: the
expected files (bytes, JSON, arrays) and the checks every mount test shares (test_mount, the fusepy and
daemon variants, the tree layout). Expected file names follow the mount layout in docs/interfaces.md,
written here without ckptfs/util/names.py.

References: gguf-py (writer, reader offsets, dequantize), the safetensors layout written by tests/fixtures.py,
numpy's own np.save for the .npy bytes, ml_dtypes.
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from fixtures import (
    GGML_GEOMETRY,
    Written,
    jsonable,
    quantized,
)

# ------------------------------------------------------------------------------------------ expectations

GGUF_EXACT = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}
ST_EXACT = {"BOOL": "|b1", "U8": "|u1", "I8": "|i1", "U16": "<u2", "I16": "<i2", "U32": "<u4", "I32": "<i4",
            "U64": "<u8", "I64": "<i8", "F16": "<f2", "F32": "<f4", "F64": "<f8", "C64": "<c8"}


def served_dtype(exact: dict[str, str], storage_type: str, mode: str) -> np.dtype:
    """docs/interfaces.md, "dtype": what NAME.npy holds for this storage type under --dtype ``mode``."""
    if storage_type in exact:
        dtype = np.dtype(exact[storage_type])
        return np.dtype("<f4") if mode == "float32" and dtype.kind == "f" else dtype
    return np.dtype("<f2") if mode == "float16" else np.dtype("<f4")


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    # C order, as the mount serves it (np.ascontiguousarray alone would make a 0-d array 1-d)
    np.save(buf, array if array.flags.c_contiguous else np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def npy_header_length(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return len(npy_bytes(np.zeros(shape, dtype))) - int(np.prod(shape)) * dtype.itemsize


@dataclass
class Expected:
    """Every file a mount must show: exact bytes, parsed JSON, or (``unchecked``) listed only — a .npy of a
    type no reference library decodes (F4, F6: the codec tests cover their values)."""

    data: dict[str, bytes] = field(default_factory=dict)
    json: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    unchecked: set[str] = field(default_factory=set)

    @property
    def names(self) -> set[str]:
        return set(self.data) | set(self.json) | self.unchecked


def _add_tensor(out: Expected, stem: str, ref, exact: dict[str, str], mode: str, meta: dict[str, Any]) -> None:
    out.data[stem + ".raw"] = ref.raw
    dtype = served_dtype(exact, ref.storage_type, mode)
    if ref.array is None:
        out.unchecked.add(stem + ".npy")
    else:
        values = ref.array if ref.storage_type in exact else np.asarray(ref.array).astype(np.float32)
        with np.errstate(over="ignore"):  # float16 mode: large F8_E8M0 values become inf, as in any cast
            array = np.array(values.astype(dtype), order="C")  # (ascontiguousarray makes 0-d 1-d)
        out.arrays[stem + ".npy"] = array
        out.data[stem + ".npy"] = npy_bytes(array)
    out.json[stem + ".meta.json"] = {
        "name": ref.name, "storage_type": ref.storage_type, "shape": list(ref.shape), "npy_dtype": dtype.str,
        "npy_data_offset": npy_header_length(ref.shape, dtype), "npy_nbytes": int(np.prod(ref.shape)) * dtype.itemsize,
        "stored_nbytes": len(ref.raw), "byte_order": "little", "damaged": None, **meta}


def expected_gguf(written: Written, src: str, mode: str = "auto") -> Expected:
    out = Expected()
    reader = gguf.GGUFReader(written.path)
    offsets = {t.name: (int(t.data_offset), bytes(t.data.view(np.uint8).reshape(-1))) for t in reader.tensors}
    for name, ref in written.tensors.items():
        offset, stored = offsets[name]
        assert stored == ref.raw, f"fixture and gguf-py disagree on {name!r}"
        block_elements, block_bytes = GGML_GEOMETRY[ref.storage_type]
        _add_tensor(out, name, ref, GGUF_EXACT, mode, {
            "source": src, "offset": offset, "block_elements": block_elements, "block_bytes": block_bytes,
            "gguf_dims": list(reversed(ref.shape))})
    out.json["metadata.json"] = jsonable(written.metadata)
    _add_own_file(out, written, src)
    return out


def _add_own_file(out: Expected, written: Written, src: str) -> None:
    """The checkpoint file itself, under the last part of the name it was mounted by (a URL's without its
    query), byte for byte (docs/reference/layout.md)."""
    name = src.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    out.data[name] = Path(written.path).read_bytes()


#: safetensors block geometry: packed sub-byte floats by their packing, every other dtype one element a block
ST_PACKED_BLOCKS = {"F4": (2, 1), "F6_E2M3": (4, 3), "F6_E3M2": (4, 3)}


def expected_safetensors(written: Written, src: str, mode: str = "auto") -> Expected:
    out = Expected()
    raw = Path(written.path).read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])
    for name, ref in written.tensors.items():
        start = 8 + header_len + header[name]["data_offsets"][0]
        blocks = ST_PACKED_BLOCKS.get(ref.storage_type) or (1, np.asarray(ref.array).dtype.itemsize)
        _add_tensor(out, name, ref, ST_EXACT, mode, {"source": src, "offset": start, "block_elements": blocks[0],
                                                    "block_bytes": blocks[1]})
    out.json["metadata.json"] = jsonable(written.metadata)
    _add_own_file(out, written, src)
    return out


def check_tree(mnt: Path, expected: Expected) -> None:
    """The listing and every file's content (whole-file reads) equal the expectation."""
    assert set(os.listdir(mnt)) == expected.names
    for name, data in expected.data.items():
        got = (mnt / name).read_bytes()
        assert got == data, f"{name}: {len(got)} bytes differ from the expected {len(data)}"
        assert os.stat(mnt / name).st_size == len(data), name
    for name, value in expected.json.items():
        text = (mnt / name).read_bytes()
        assert text.endswith(b"\n"), name
        assert json.loads(text) == value, name


def check_np_load(mnt: Path, expected: Expected) -> None:
    for name, array in expected.arrays.items():
        for mmap_mode in (None, "r"):
            loaded = np.load(mnt / name, mmap_mode=mmap_mode, allow_pickle=False)
            if mmap_mode:
                assert isinstance(loaded, np.memmap), name
            assert loaded.dtype == array.dtype and loaded.shape == array.shape, name
            assert loaded.tobytes() == array.tobytes(), name  # bit-exact, NaN payloads included
            del loaded


def read_direct(path: Path, ranges: list[tuple[int, int]]) -> list[bytes]:
    """pread through O_DIRECT: each request reaches the daemon as asked (no page cache rounding)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        return [os.pread(fd, size, offset) for offset, size in ranges]
    finally:
        os.close(fd)


def odd_ranges(size: int, header: int, block_out: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Reads that probe every boundary: 1 byte, the header/data seam, block and page straddles, the whole
    file, EOF and past it, plus random ones."""
    ranges = [(0, 1), (1, 1), (header - 1, 2), (header, 1), (header + 1, 3), (4095, 2), (3 * 4096 - 1, 4097),
              (0, size), (0, 1 << 20), (size - 1, 10), (size, 10), (size + 4096, 10), (size // 2, size)]
    for k in (1, 2, 7):
        ranges.append((header + k * block_out - 5, 10))
    ranges.append((header + 256 * 1024 - 7, 20))  # a cache-group seam (about 256 KiB of output)
    for _ in range(40):
        offset = int(rng.integers(0, size))
        ranges.append((offset, int(rng.integers(1, 300_000))))
    return [(o, s) for o, s in ranges if o >= 0]


# ------------------------------------------------------------------------------------------ fixtures


def big_tensors() -> dict[str, tuple[np.ndarray, str]]:
    rng = np.random.default_rng(5)
    return {
        "big.q4_k": (quantized("Q4_K", (96, 1024), rng), "Q4_K"),   # 384 blocks: two cache groups
        "big.q6_k": (quantized("Q6_K", (40, 1024), rng), "Q6_K"),
        "big.q8_0": (rng.standard_normal((64, 1024)).astype(np.float32), "Q8_0"),
        "big.bf16": (rng.standard_normal((300, 301)).astype(np.float32), "BF16"),
        "big.f16": (rng.standard_normal((200, 333)).astype(np.float32), "F16"),
        "big.f32": (rng.standard_normal((70_000,)).astype(np.float32), "F32"),
    }


WRITE_ATTEMPTS = {
    "open O_WRONLY": lambda m: os.open(m / "f32.vec.raw", os.O_WRONLY),
    "open O_RDWR": lambda m: os.open(m / "f32.vec.raw", os.O_RDWR),
    "open O_TRUNC": lambda m: os.open(m / "f32.vec.raw", os.O_RDONLY | os.O_TRUNC),
    "create": lambda m: os.open(m / "new.npy", os.O_WRONLY | os.O_CREAT, 0o644),
    "mkdir": lambda m: os.mkdir(m / "d"),
    "rmdir": lambda m: os.rmdir(m / "f32.vec.raw"),
    "unlink": lambda m: os.unlink(m / "f32.vec.raw"),
    "rename": lambda m: os.rename(m / "f32.vec.raw", m / "x.raw"),
    "chmod": lambda m: os.chmod(m / "f32.vec.raw", 0o644),
    "chown": lambda m: os.chown(m / "f32.vec.raw", 1, 1),
    "truncate": lambda m: os.truncate(m / "f32.vec.raw", 0),
    "utime": lambda m: os.utime(m / "f32.vec.raw", (0, 0)),
    "symlink": lambda m: os.symlink("f32.vec.raw", m / "link"),
    "link": lambda m: os.link(m / "f32.vec.raw", m / "hard"),
    "mknod": lambda m: os.mknod(m / "fifo", 0o600 | stat.S_IFIFO),
    "setxattr": lambda m: os.setxattr(m / "f32.vec.raw", "user.x", b"1"),
    "removexattr": lambda m: os.removexattr(m, "user.ckptfs.stats"),
}


def check_same_file(mounted_file: Path, original: Path, seed: int = 0) -> None:
    """The mounted file is the original, byte for byte: size, sha256, O_DIRECT ranges, an mmap of it."""
    data = original.read_bytes()
    assert os.stat(mounted_file).st_size == len(data)
    assert hashlib.sha256(mounted_file.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    rng = np.random.default_rng(seed)
    ranges = [(0, 1), (0, 4096), (len(data) - 1, 10), (len(data), 10)]
    ranges += [(int(rng.integers(0, len(data))), int(rng.integers(1, 200_000))) for _ in range(20)]
    for (offset, size), got in zip(ranges, read_direct(mounted_file, ranges)):
        assert got == data[offset:offset + size], (offset, size)
    with open(mounted_file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert mapped[:] == data


def descriptors_on(pid: int, path: Path) -> int:
    """How many of process ``pid``'s descriptors are open on ``path``."""
    fds = Path(f"/proc/{pid}/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            count += os.readlink(fd) == str(path)
        except OSError:
            pass
    return count
