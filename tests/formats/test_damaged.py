"""Damaged checkpoints are served around (docs/interfaces.md, "Damage: refuse or serve").

Truncated GGUF and safetensors files cut at many points, tensors whose offset or end lies past the end of the
file, and storage types without a layout: the checkpoint opens and mounts, every tensor is listed, metadata is
whole, every page whose bytes are all present is served exactly, and a read that touches a missing byte fails
(CheckpointError in the API, EIO at the mount, with one log line naming the tensor and the range).

What "present" means is computed here from the reference layout alone (gguf-py's reader for GGUF offsets,
the header JSON for safetensors, the block geometry of ggml-common.h): a .raw page is present when its bytes
lie before the cut; a .npy page when every quant block under its elements does.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import re
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from conftest import ckptfs_cli, cli_env, mount_stats, pid_alive, wait_until
from fixtures import GGML_GEOMETRY, Written, jsonable, quantized, write_gguf, write_safetensors

import ckptfs
import ckptfs.quant
from ckptfs.core.errors import CheckpointError
from ckptfs.tree.mount_tree import MountTree
from mount_expect import npy_bytes

PAGE = 4096
GGUF_EXACT = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "|i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}
ST_EXACT = {"BOOL": "|b1", "U8": "|u1", "I8": "|i1", "U16": "<u2", "I16": "<i2", "U32": "<u4", "I32": "<i4",
            "U64": "<u8", "I64": "<i8", "F16": "<f2", "F32": "<f4", "F64": "<f8", "C64": "<c8"}
ST_ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
                 "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8, "C64": 8}


# ------------------------------------------------------------------------------------------ references

@dataclass(frozen=True)
class RefLayout:
    """One tensor as the reference sees it: where its bytes are and what its files must hold."""

    name: str
    storage_type: str
    shape: tuple[int, ...]
    offset: int                 # absolute, in the intact file
    stored: int                 # stored bytes (raw-only types: up to the next tensor or the end of file)
    block_elements: int         # 0: no layout known (raw only)
    block_bytes: int
    raw: bytes                  # the stored bytes in the intact file
    npy: bytes | None           # np.save of the reference values in the served dtype; None: no .npy
    npy_header: int             # length of the .npy header

    def available_blocks(self, file_size: int) -> int:
        present = max(0, min(self.stored, file_size - self.offset))
        return present // self.block_bytes

    def end(self) -> int:
        return self.offset + self.stored


def served_npy(ref_array: np.ndarray, storage_type: str, exact: dict[str, str]) -> tuple[bytes, int]:
    """(the .npy bytes, its header length) for dtype "auto": exact types as stored, the rest float32."""
    dtype = np.dtype(exact.get(storage_type, "<f4"))
    array = np.asarray(ref_array).astype(dtype)
    data = npy_bytes(array)
    return data, len(data) - array.nbytes


def gguf_layout(written: Written, twin: Path) -> list[RefLayout]:
    """Offsets from gguf-py's reader; raw-only extents to the next tensor (or the end of the file).

    gguf-py refuses unknown type ids, so offsets are read from ``twin``: the same file written with I8 in
    place of each unknown type (same names, shapes and byte counts, hence the same layout - checked below).
    """
    reader = gguf.GGUFReader(twin)
    file_bytes = written.path.read_bytes()
    offsets = {t.name: int(t.data_offset) for t in reader.tensors}
    ordered = sorted(offsets.values())
    out = []
    assert twin.stat().st_size == len(file_bytes)
    for t in reader.tensors:
        ref = written.tensors[t.name]
        offset = offsets[t.name]
        assert file_bytes[offset:offset + len(ref.raw)] == ref.raw
        if ref.storage_type in GGML_GEOMETRY:
            block_elements, block_bytes = GGML_GEOMETRY[ref.storage_type]
            stored = len(ref.raw)
            npy, header = served_npy(ref.array, ref.storage_type, GGUF_EXACT)
        else:
            later = [o for o in ordered if o > offset]
            stored = (later[0] if later else len(file_bytes)) - offset
            block_elements = block_bytes = 0
            npy, header = None, 0
        out.append(RefLayout(t.name, ref.storage_type, tuple(ref.shape), offset, stored, block_elements,
                             block_bytes, file_bytes[offset:offset + stored], npy, header))
    return out


def safetensors_layout(written: Written) -> list[RefLayout]:
    """Offsets from the header JSON, parsed here with the json module."""
    data = written.path.read_bytes()
    (length,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + length])
    header.pop("__metadata__", None)
    out = []
    for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        begin, end = entry["data_offsets"]
        ref = written.tensors[name]
        assert data[8 + length + begin: 8 + length + end] == ref.raw
        values = ref.array.astype(np.float32) if entry["dtype"] not in ST_EXACT else ref.array
        npy, header_len = served_npy(values, entry["dtype"], ST_EXACT)
        item = ST_ITEM_BYTES[entry["dtype"]]
        out.append(RefLayout(name, entry["dtype"], tuple(entry["shape"]), 8 + length + begin, end - begin, 1, item,
                             ref.raw, npy, header_len))
    return out


def truncation_reason(ref: RefLayout, file_size: int) -> str | None:
    if not ref.block_bytes:
        return None
    if ref.end() <= file_size or ref.stored == 0:
        return None
    return f"truncated: needs bytes {ref.offset}..{ref.end()}, file has {file_size}"


def raw_pages(ref: RefLayout, file_size: int) -> list[tuple[int, int, bool]]:
    """(start, end, all bytes present) for each page of the .raw file (size as served)."""
    size = served_raw_size(ref, file_size)
    return [(p, min(p + PAGE, size), ref.offset + min(p + PAGE, size) <= file_size) for p in range(0, size, PAGE)]


def served_raw_size(ref: RefLayout, file_size: int) -> int:
    """Decodable tensors keep their stored size; raw-only ones own only what the file still holds."""
    if ref.block_bytes:
        return ref.stored
    return max(0, min(ref.end(), file_size) - ref.offset)


def npy_pages(ref: RefLayout, file_size: int) -> list[tuple[int, int, bool]]:
    """(start, end, present) for each .npy page: present when every quant block under it is in the file."""
    assert ref.npy is not None
    size, header = len(ref.npy), ref.npy_header
    itemsize = (size - header) // math.prod(ref.shape)
    available = ref.available_blocks(file_size)
    pages = []
    for p in range(0, size, PAGE):
        q = min(p + PAGE, size)
        if q <= header:
            present = True
        else:
            e1 = -(-(q - header) // itemsize)
            present = -(-e1 // ref.block_elements) <= available
        pages.append((p, q, present))
    return pages


def same_metadata(actual: Any, expected: Any) -> bool:
    return json.dumps(jsonable(actual), sort_keys=True) == json.dumps(jsonable(expected), sort_keys=True)


# ---------------------------------------------------------------------------------------------- fixtures

GGUF_METADATA = {"damage.note": "still here", "damage.list": [1, 2, 3], "damage.scores": [0.5, -1.25]}


def write_damage_gguf(path: Path, stand_in: bool = False) -> Written:
    """Every block geometry the block engine distinguishes, a raw-only tensor in the middle and at the end
    (``stand_in``: I8 instead of the unknown type ids, for gguf-py's reader)."""
    rng = np.random.default_rng(5)
    tensors = {
        "blk.0.emb": (rng.standard_normal((16, 256)).astype(np.float32), "F32"),      # served straight
        "odd": (rng.integers(0, 256, 100, dtype=np.uint8), "GGML_TYPE_31"),           # removed id: raw only
        "blk.0.q4k": (quantized("Q4_K", (16, 512), rng), "Q4_K"),                      # 144-byte blocks
        "blk.0.q8": (rng.standard_normal((24, 64)).astype(np.float32), "Q8_0"),       # 34-byte blocks
        "f16.vec": (rng.standard_normal(1333).astype(np.float16), "F16"),
        "bf16.mat": (rng.standard_normal((8, 100)).astype(np.float32), "BF16"),
        "q6k": (quantized("Q6_K", (4, 256), rng), "Q6_K"),
        "tail": (rng.standard_normal(50).astype(np.float32), "F32"),
        "future": (rng.integers(0, 256, 37, dtype=np.uint8), "GGML_TYPE_77"),         # unknown id, last
    }
    if stand_in:
        tensors = {name: ((values.view(np.int8), "I8") if kind.startswith("GGML_TYPE_") else (values, kind))
                   for name, (values, kind) in tensors.items()}
    return write_gguf(path, tensors, GGUF_METADATA)


def write_damage_safetensors(path: Path) -> Written:
    import ml_dtypes

    rng = np.random.default_rng(6)
    tensors = {
        "model.embed": rng.standard_normal((24, 256)).astype(np.float32),
        "layer.bf16": rng.standard_normal((50, 70)).astype(ml_dtypes.bfloat16),
        "layer.f16": rng.standard_normal(999).astype(np.float16),
        "layer.i64": rng.integers(-2**62, 2**62, (3, 300), dtype=np.int64),
        "layer.u8": rng.integers(0, 256, 5000, dtype=np.uint8),
        # finite values only: the .npy pages are compared byte for byte, and NaN payloads may differ
        "layer.f8": rng.standard_normal((40, 50)).astype(ml_dtypes.float8_e4m3fn),
    }
    return write_safetensors(path, tensors, {"format": "pt", "why": "damage tests"})


@pytest.fixture(scope="module")
def gguf_case(tmp_path_factory) -> tuple[Written, list[RefLayout]]:
    folder = tmp_path_factory.mktemp("damage")
    written = write_damage_gguf(folder / "model.gguf")
    twin = write_damage_gguf(folder / "twin.gguf", stand_in=True)
    return written, gguf_layout(written, twin.path)


@pytest.fixture(scope="module")
def st_case(tmp_path_factory) -> tuple[Written, list[RefLayout]]:
    written = write_damage_safetensors(tmp_path_factory.mktemp("damage") / "model.safetensors")
    return written, safetensors_layout(written)


def cut_points(layout: list[RefLayout], file_size: int) -> list[int]:
    """Before the data, at and around every tensor's start, a block boundary inside it, its end, the end."""
    first = min(r.offset for r in layout)
    points = {first, file_size - 1}
    for r in layout:
        points.update({r.offset, r.offset + 1, r.end() - 1, r.end()})
        if r.block_bytes:
            middle = r.offset + (r.stored // r.block_bytes // 2) * r.block_bytes
            points.update({middle - 1, middle, middle + 1})
    return sorted(p for p in points if first <= p < file_size)


def cut(source: Path, size: int, target: Path) -> Path:
    target.write_bytes(source.read_bytes()[:size])
    return target


# -------------------------------------------------------------------------------------- the library

def check_library(path: Path, layout: list[RefLayout], expected_metadata: dict, file_size: int) -> None:
    """Everything through ckptfs.open and the views the mount serves from."""
    with ckptfs.open(str(path)) as ck:
        assert [t.name for t in ck.tensors] == [r.name for r in layout]
        assert same_metadata(dict(ck.metadata), expected_metadata)
        tree = MountTree(ck)
        for ref in layout:
            t = ck[ref.name]
            reason = truncation_reason(ref, file_size)
            if ref.block_bytes:
                assert t.info.damaged == reason, (ref.name, t.info.damaged)
            else:
                assert t.info.damaged.startswith(f"unknown storage type {ref.storage_type[10:]}: served raw only")
                assert (ref.name + ".npy") not in tree
            raw = tree.view(ref.name + ".raw")
            assert raw.size == served_raw_size(ref, file_size)
            for p, q, present in raw_pages(ref, file_size):
                if present:
                    assert raw.read(p, q - p) == ref.raw[p:q], (ref.name, p)
                else:
                    with pytest.raises(CheckpointError, match=re.escape(repr(ref.name))):
                        raw.read(p, q - p)
            meta = json.loads(tree.view(ref.name + ".meta.json").read(0, 1 << 20))
            assert meta["damaged"] == t.info.damaged
            if ref.npy is None:
                continue
            npy = tree.view(ref.name + ".npy")
            assert npy.size == len(ref.npy)
            for p, q, present in npy_pages(ref, file_size):
                if present:
                    assert npy.read(p, q - p) == ref.npy[p:q], (ref.name, p)
                else:
                    with pytest.raises(CheckpointError, match=re.escape(f"tensor {ref.name!r}: stored bytes")):
                        npy.read(p, q - p)
            check_api_arrays(t, ref, reason, file_size)


def check_api_arrays(t: ckptfs.Tensor, ref: RefLayout, reason: str | None, file_size: int) -> None:
    """np.asarray, raw() and row slices: exact where every block is present, CheckpointError otherwise."""
    expected = np.load(io.BytesIO(ref.npy))
    if reason is None:
        assert np.asarray(t).tobytes() == expected.tobytes()
        assert t.raw() == ref.raw
        return
    with pytest.raises(CheckpointError, match="are missing"):
        np.asarray(t)
    with pytest.raises(CheckpointError):
        t.raw()
    if expected.ndim == 0 or len(expected) == 0:
        return
    rows = len(expected)
    good_rows = ref.available_blocks(file_size) * ref.block_elements // (expected.size // rows)
    if good_rows:
        assert t[:good_rows].tobytes() == expected[:good_rows].tobytes()
        assert t[good_rows - 1].tobytes() == expected[good_rows - 1].tobytes()
    if good_rows < rows:
        with pytest.raises(CheckpointError, match="are missing"):
            t[good_rows]


def in_context(point: int, check, *args) -> None:
    try:
        check(*args)
    except AssertionError as exc:
        raise AssertionError(f"file cut at byte {point}: {exc}") from exc


def test_gguf_cut_anywhere_in_the_data_serves_what_is_intact(gguf_case, tmp_path):
    written, layout = gguf_case
    size = written.path.stat().st_size
    points = cut_points(layout, size)
    assert len(points) > 40
    for point in points:
        path = cut(written.path, point, tmp_path / "cut.gguf")
        in_context(point, check_library, path, layout, written.metadata, point)


def test_safetensors_cut_anywhere_in_the_data_serves_what_is_intact(st_case, tmp_path):
    written, layout = st_case
    size = written.path.stat().st_size
    points = cut_points(layout, size)
    assert len(points) > 25
    for point in points:
        path = cut(written.path, point, tmp_path / "cut.safetensors")
        in_context(point, check_library, path, layout, written.metadata, point)


def test_intact_files_are_not_damaged(gguf_case, st_case):
    """The same checks on the whole files: nothing missing, nothing but the raw-only tensors marked."""
    for written, layout in (gguf_case, st_case):
        check_library(written.path, layout, written.metadata, written.path.stat().st_size)


def test_relative_path_survives_a_change_of_directory(gguf_case, tmp_path, monkeypatch):
    """Sources open lazily: a checkpoint opened by a relative name must still read after os.chdir."""
    written, layout = gguf_case
    monkeypatch.chdir(written.path.parent)
    with ckptfs.open(written.path.name) as ck:
        monkeypatch.chdir(tmp_path)
        ref = next(r for r in layout if r.name == "blk.0.q4k")
        assert ck[ref.name].raw() == ref.raw
        assert ck[ref.name].meta["source"] == written.path.name


# ------------------------------------------------------------------------------ offsets past the end

GGUF_RELATIVE_OFFSET_FIELD = 8  # u64 after name, n_dims, dims and the u32 type


def patch_tensor_offsets(written: Written, moves: dict[str, int], target: Path) -> dict[str, int]:
    """Copy the GGUF with the data-relative offsets of some tensors replaced; their new absolute offsets
    (field positions from gguf-py's reader of the stand-in twin, whose header has the same layout)."""
    reader = gguf.GGUFReader(written.path.with_name("twin.gguf"))
    data = bytearray(written.path.read_bytes())
    absolute = {}
    for t in reader.tensors:
        if t.name not in moves:
            continue
        name_bytes = t.name.encode()
        at = t.field.offset + 8 + len(name_bytes) + 4 + 8 * len(t.shape) + 4
        (old,) = struct.unpack_from("<Q", data, at)
        assert reader.data_offset + old == t.data_offset
        struct.pack_into("<Q", data, at, moves[t.name])
        absolute[t.name] = reader.data_offset + moves[t.name]
    target.write_bytes(bytes(data))
    return absolute


def moved_layout(layout: list[RefLayout], absolute: dict[str, int], file_bytes: bytes) -> list[RefLayout]:
    """The reference after moving tensors: raw bytes from the new place, F32 values decoded by numpy from
    the bytes found there, raw-only extents to the next tensor of the new order."""
    offsets = sorted(absolute.get(r.name, r.offset) for r in layout)
    out = []
    for r in layout:
        offset = absolute.get(r.name, r.offset)
        stored, npy, header = r.stored, r.npy, r.npy_header
        if not r.block_bytes:
            later = [o for o in offsets if o > offset]
            stored = (later[0] if later else len(file_bytes)) - offset
        raw = file_bytes[offset:offset + stored]
        if r.name in absolute and offset < len(file_bytes):
            assert r.storage_type == "F32", "only F32 is re-decoded here"
            values = np.frombuffer(raw + bytes(r.stored - len(raw)), "<f4").reshape(r.shape)
            npy, header = served_npy(values, "F32", GGUF_EXACT)
        out.append(RefLayout(r.name, r.storage_type, r.shape, offset, stored, r.block_elements, r.block_bytes, raw,
                             npy, header))
    return out


def past_the_end_case(gguf_case, folder: Path) -> tuple[Path, list[RefLayout]]:
    """Q8_0 moved to 1 TiB, BF16 to 2^64 - 64 past the data start, F32 ``tail`` straddling the end."""
    written, layout = gguf_case
    size = written.path.stat().st_size
    reader = gguf.GGUFReader(written.path.with_name("twin.gguf"))
    straddle = (size - reader.data_offset - 64) // 32 * 32   # 200 bytes of F32 starting < 100 bytes before EOF
    path = folder / "moved.gguf"
    absolute = patch_tensor_offsets(written, {"blk.0.q8": 1 << 40, "bf16.mat": 2**64 - 64, "tail": straddle}, path)
    return path, moved_layout(layout, absolute, path.read_bytes())


def test_tensors_past_the_end_are_listed_and_fail_only_where_missing(gguf_case, tmp_path):
    path, layout = past_the_end_case(gguf_case, tmp_path)
    size = path.stat().st_size
    by_name = {r.name: r for r in layout}
    assert by_name["bf16.mat"].offset > 2**64 and by_name["tail"].offset < size < by_name["tail"].end()
    check_library(path, layout, gguf_case[0].metadata, size)


# ----------------------------------------------------------------------------- no codec (safetensors)

def test_safetensors_dtype_without_codec_is_raw_only(st_case, monkeypatch):
    """safetensors names every dtype it allows (an unknown name is refused with the header); one ckptfs has
    no codec for is served like GGUF's unknown types: raw only, its stored size known from the header."""
    written, layout = st_case
    monkeypatch.delitem(ckptfs.quant._registry, "F8_E4M3")
    with ckptfs.open(str(written.path)) as ck:
        tree = MountTree(ck)
        t = ck["layer.f8"]
        ref = next(r for r in layout if r.name == "layer.f8")
        assert "layer.f8.npy" not in tree and "layer.f8.raw" in tree
        assert t.info.damaged.startswith("no codec for dtype F8_E4M3: served raw only")
        assert tree.view("layer.f8.raw").read(0, 1 << 20) == ref.raw
        with pytest.raises(CheckpointError, match="cannot decode"):
            np.asarray(t)
        assert json.loads(tree.view("layer.f8.meta.json").read(0, 1 << 20))["npy_dtype"] is None


# ----------------------------------------------------------------------------------------- the mount

def expected_files(layout: list[RefLayout]) -> set[str]:
    names = {"metadata.json"}
    for r in layout:
        names |= {r.name + ".raw", r.name + ".meta.json"} | ({r.name + ".npy"} if r.npy is not None else set())
    return names


def check_pages(path: Path, reference: bytes, pages: list[tuple[int, int, bool]], name: str, log: Path) -> int:
    """Every page through the page cache (readahead off): present pages exact, missing ones EIO. A missing page
    is first read with O_DIRECT, which reaches the daemon exactly once: exactly one log line naming the tensor
    and the range. Through the page cache the same page then fails twice more (the kernel's readahead, then
    its own retry) for the same cause: no further line (one line per cause, service/logs.py).
    Returns the number of missing pages."""
    fd = os.open(path, os.O_RDONLY)
    direct = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        assert os.fstat(fd).st_size == len(reference)
        for p, q, present in pages:
            before = log.stat().st_size
            if present:
                assert os.pread(fd, q - p, p) == reference[p:q], (path.name, p)
                assert log.stat().st_size == before, log.read_text()[before:]
                continue
            with pytest.raises(OSError) as info:
                os.pread(direct, PAGE, p)
            assert info.value.errno == errno.EIO
            lines = log.read_bytes()[before:].decode().splitlines()
            assert len(lines) == 1, lines
            line = lines[0]
            assert f" ERROR ckptfs.fuse.operations: EIO: /{path.name} bytes {p}..{p + PAGE}: " in line, line
            assert f"tensor {name!r}: " in line and re.search(r"bytes \d+\.\.\d+ (are missing|lie past)", line)
            before = log.stat().st_size
            with pytest.raises(OSError) as info:
                os.pread(fd, q - p, p)
            assert info.value.errno == errno.EIO
            again = log.read_bytes()[before:].decode().splitlines()
            assert again == [], (line, again)  # the same cause (the kernel's readahead, then its retry): not again
    finally:
        os.close(fd)
        os.close(direct)
    return sum(not present for _, _, present in pages)


def _message(line: str) -> str:
    """A log line without its timestamp."""
    return line.split(" ", 2)[2]


def check_mount(mnt: Path, layout: list[RefLayout], file_size: int, metadata: dict, log: Path,
                src: Path) -> dict[str, int]:
    """Everything through a real mount; returns the number of missing pages per file checked."""
    missing = {}
    assert set(os.listdir(mnt)) == expected_files(layout) | {src.name}
    assert (mnt / src.name).read_bytes() == src.read_bytes()  # the damaged file itself, as it is
    assert json.loads((mnt / "metadata.json").read_bytes()) == jsonable(metadata)
    for ref in layout:
        meta = json.loads((mnt / f"{ref.name}.meta.json").read_bytes())
        if ref.npy is None:
            assert meta["damaged"].startswith("unknown storage type") and meta["npy_dtype"] is None
            with pytest.raises(FileNotFoundError):
                os.stat(mnt / f"{ref.name}.npy")
        else:
            assert meta["damaged"] == truncation_reason(ref, file_size), ref.name
            missing[ref.name + ".npy"] = check_pages(mnt / f"{ref.name}.npy", ref.npy, npy_pages(ref, file_size),
                                                     ref.name, log)
        size = served_raw_size(ref, file_size)
        raw = (ref.raw + bytes(max(0, size - len(ref.raw))))[:size]   # bytes past the cut are never compared
        missing[ref.name + ".raw"] = check_pages(mnt / f"{ref.name}.raw", raw, raw_pages(ref, file_size), ref.name,
                                                 log)
    assert pid_alive(mount_stats(mnt)["pid"])
    # the kernel sends RELEASE after close() has returned: the last handles may still be on their way
    assert wait_until(lambda: mount_stats(mnt)["open_handles"] == 0, timeout=10)
    return missing


def mount_logged(mounted, src: Path, log: Path) -> Path:
    """Mounted by a path relative to the test's working directory (the common ``ckptfs mount m.gguf mnt``)."""
    mnt = mounted(os.path.relpath(src), "--log-file", str(log))
    assert "mounted" in log.read_text()
    return mnt


def mid_cut(layout: list[RefLayout], name: str) -> int:
    """A cut a few bytes into the middle block of ``name``: its first half intact, the rest missing."""
    ref = next(r for r in layout if r.name == name)
    return ref.offset + ref.stored // ref.block_bytes // 2 * ref.block_bytes + 5


def test_mount_of_a_gguf_cut_in_half(mounted, gguf_case, tmp_path):
    written, layout = gguf_case
    point = mid_cut(layout, "blk.0.q4k")
    path = cut(written.path, point, tmp_path / "cut.gguf")
    log = tmp_path / "daemon.log"
    missing = check_mount(mount_logged(mounted, path, log), layout, point, written.metadata, log, path)
    pages = len(npy_pages(next(r for r in layout if r.name == "blk.0.q4k"), point))
    assert 0 < missing["blk.0.q4k.npy"] < pages and 0 < missing["blk.0.q4k.raw"]  # cut in half: both halves seen
    assert missing["blk.0.emb.npy"] == 0 and missing["tail.npy"] > 0


def test_mount_of_a_safetensors_cut_in_half(mounted, st_case, tmp_path):
    written, layout = st_case
    point = mid_cut(layout, "layer.bf16")
    path = cut(written.path, point, tmp_path / "cut.safetensors")
    log = tmp_path / "daemon.log"
    missing = check_mount(mount_logged(mounted, path, log), layout, point, written.metadata, log, path)
    pages = len(npy_pages(next(r for r in layout if r.name == "layer.bf16"), point))
    assert 0 < missing["layer.bf16.npy"] < pages and missing["model.embed.npy"] == 0


def test_mount_of_tensors_past_the_end(mounted, gguf_case, tmp_path):
    path, layout = past_the_end_case(gguf_case, tmp_path)
    log = tmp_path / "daemon.log"
    missing = check_mount(mount_logged(mounted, path, log), layout, path.stat().st_size, gguf_case[0].metadata, log,
                          path)
    assert (missing["blk.0.q8.npy"], missing["blk.0.q8.raw"], missing["bf16.mat.raw"]) == (2, 1, 1)  # all missing
    assert missing["blk.0.emb.npy"] == missing["q6k.npy"] == 0


# ---------------------------------------------------------------------------------------- ckptfs info

def test_info_lists_damaged_tensors_and_why(gguf_case, tmp_path):
    written, layout = gguf_case
    point = mid_cut(layout, "blk.0.q4k")
    path = cut(written.path, point, tmp_path / "cut.gguf")
    expected = []
    for ref in layout:
        if ref.npy is None:
            reason = f"unknown storage type {ref.storage_type[10:]}: served raw only"
            if ref.offset > point:
                reason += f"; starts past the end of the file (byte {ref.offset}, file has {point})"
        else:
            reason = truncation_reason(ref, point)
        if reason is not None:
            expected.append({"name": ref.name, "storage_type": ref.storage_type, "reason": reason})
    assert {row["name"] for row in expected} >= {"odd", "blk.0.q4k", "tail", "future"}

    run = [*ckptfs_cli(), "info", str(path)]
    as_json = subprocess.run([*run, "--json"], env=cli_env(), capture_output=True, text=True, timeout=60)
    assert as_json.returncode == 0 and as_json.stderr == "", as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["damaged"] == expected
    assert report["tensor_count"] == len(layout)

    text = subprocess.run(run, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert text.returncode == 0 and text.stderr == "", text.stderr
    lines = text.stdout.splitlines()
    start = lines.index(f"damaged tensors: {len(expected)}")
    assert lines[start + 1:start + 1 + len(expected)] == [
        f"  {row['name']!r} ({row['storage_type']}): {row['reason']}" for row in expected]


# --------------------------------------------------------------------------- a tensor too big for a file

def test_tensor_decoding_to_more_than_a_file_holds(mounted, tmp_path):
    """2^62 Q4_0 elements: 2^64 bytes of float32, more than a file's size (a signed 64-bit off_t) can say.
    Its .npy is left out (listed, its size would wrap around to the header's 128 bytes); its .raw is listed at
    its stored size (18 bytes per 32 elements, past the end of the file: every read fails); the rest serves."""
    def string(text: bytes) -> bytes:
        return struct.pack("<Q", len(text)) + text

    header = b"GGUF" + struct.pack("<IQQ", 3, 2, 0)
    header += string(b"huge") + struct.pack("<IQIQ", 1, 2**62, 2, 0)     # Q4_0 (type 2) at data offset 0
    header += string(b"ok") + struct.pack("<IQIQ", 1, 4, 0, 0)           # F32, the 16 bytes that exist
    values = np.array([1, 2, 3, 4], "<f4")
    path = tmp_path / "huge.gguf"
    path.write_bytes(header + bytes(-len(header) % 32) + values.tobytes())

    with ckptfs.open(str(path)) as ck:
        assert ck["huge"].nbytes == 2**64 and ck["huge"].info.damaged.startswith("truncated")
        assert set(MountTree(ck).names()) == {"huge.raw", "huge.meta.json", "ok.npy", "ok.raw", "ok.meta.json",
                                              "metadata.json", "huge.gguf"}
    mnt = mounted(path)
    assert sorted(os.listdir(mnt)) == ["huge.gguf", "huge.meta.json", "huge.raw", "metadata.json", "ok.meta.json",
                                       "ok.npy", "ok.raw"]
    assert os.stat(mnt / "huge.raw").st_size == 2**62 // 32 * 18
    fd = os.open(mnt / "huge.raw", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            os.pread(fd, 10, 0)
    finally:
        os.close(fd)
    assert info.value.errno == errno.EIO
    assert (mnt / "ok.npy").read_bytes() == npy_bytes(values)


def test_safetensors_trailing_bytes_are_a_note_not_damage(st_case, tmp_path):
    written, layout = st_case
    path = tmp_path / "trailing.safetensors"
    path.write_bytes(written.path.read_bytes() + b"\x00" * 100)
    size = path.stat().st_size
    with ckptfs.open(str(path)) as ck:
        assert ck.damaged() == []
        assert any("100 trailing bytes" in note for note in ck.notes), ck.notes
    check_library(path, layout, written.metadata, size)
