"""The GGUF header reader, compared field by field with gguf-py, and fed hostile headers.

References: gguf-py's ``GGUFReader`` (tensor names, dims, types, data offsets, byte sizes, the bytes
themselves, metadata fields) on files its ``GGUFWriter`` wrote; the values the fixture generator wrote
(for nested arrays, which gguf-py flattens, and for the 262,144-token vocabulary, which gguf-py needs tens
of seconds to open); and independent arithmetic on the writer's layout rules (for types gguf-py cannot
read). Hostile headers are built by hand with :func:`gguf_blob`.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from fixtures import (GGML_GEOMETRY, GGML_TYPE_IDS, VT, Written, big_vocab_gguf, every_value_type, quantized,
                      vocab_metadata, write_gguf, write_mixed_gguf)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptfs.quant
from ckptfs.core.errors import CheckpointError
from ckptfs.formats import read_file
from ckptfs.formats.gguf import GGML_TYPE_NAMES, MAX_DIMS, read_gguf
from ckptfs.formats.gguf_values import MAX_ARRAY_DEPTH
from ckptfs.quant import Codec, codec_for


# ------------------------------------------------------------------------------------------ helpers

def file_bytes(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def assert_same_value(actual, expected, key=""):
    """Equal values of the same kind: numpy arrays by dtype and bits (NaN-aware), lists element-wise."""
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), key
        assert actual.dtype == expected.dtype.newbyteorder("<") or actual.dtype == expected.dtype, key
        assert actual.dtype.byteorder in "<|=", key
        np.testing.assert_array_equal(actual, expected, err_msg=key)
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), key
        for a, e in zip(actual, expected):
            assert_same_value(a, e, key)
    else:
        assert type(actual) is type(expected), (key, actual, expected)
        assert actual == expected or (actual != actual and expected != expected), (key, actual, expected)


def compare_with_gguf_py(path: Path, written: Written | None = None) -> None:
    """Every tensor and every metadata key of ``read_file(path)`` against gguf-py's reader."""
    parsed = read_file(str(path))
    reader = gguf.GGUFReader(path)
    assert [t.name for t in parsed.tensors] == [t.name for t in reader.tensors]
    for mine, ref in zip(parsed.tensors, reader.tensors):
        assert mine.gguf_dims == tuple(int(d) for d in ref.shape)
        assert mine.shape == tuple(reversed(mine.gguf_dims))
        assert mine.storage_type == ref.tensor_type.name
        assert mine.offset == ref.data_offset
        assert mine.stored_nbytes == ref.n_bytes
        assert (mine.block_elements, mine.block_bytes) == GGML_GEOMETRY[mine.storage_type]
        assert mine.source == str(path)
        assert file_bytes(path, mine.offset, mine.stored_nbytes) == ref.data.tobytes()
        if written is not None:
            assert written.tensors[mine.name].raw == ref.data.tobytes()
    gguf_keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert list(parsed.metadata) == gguf_keys
    for key in gguf_keys:
        field = reader.fields[key]
        types = [t.name for t in field.types]
        expected_type = f"ARRAY[{types[1]}]" if types[0] == "ARRAY" else types[0]
        assert parsed.metadata.value_type(key) == expected_type, key
        value = parsed.metadata[key]
        if types[0] == "ARRAY" and types[1] == "ARRAY":
            continue  # gguf-py flattens nested arrays: compared with the written values instead
        if types[-1] == "STRING":
            # gguf-py decodes strictly; compare bytes so that invalid UTF-8 compares too
            as_bytes = lambda s: s.encode("utf-8", "surrogateescape")  # noqa: E731
            if isinstance(value, list):
                ref_bytes = [bytes(field.parts[i]) for i in field.data]
                assert [as_bytes(v) for v in value] == ref_bytes, key
            else:
                assert as_bytes(value) == bytes(field.parts[-1]), key
        elif isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, np.array(field.contents(), dtype=value.dtype), err_msg=key)
        else:
            assert value == field.contents(), key
    if written is not None:
        assert set(parsed.metadata) == set(written.metadata)
        for key, expected in written.metadata.items():
            assert_same_value(parsed.metadata[key], expected, key)


# --------------------------------------------------------------------------- matches gguf-py

@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Written:
    return write_mixed_gguf(tmp_path_factory.mktemp("mixed") / "mixed.gguf")


def test_mixed_file_matches_gguf_py(mixed):
    compare_with_gguf_py(mixed.path, mixed)
    parsed = read_file(str(mixed.path))
    assert parsed.format == "gguf" and parsed.version == 3 and parsed.files == (str(mixed.path),)
    assert all(t.byte_order == "<" and t.damaged is None for t in parsed.tensors)
    assert parsed.notes == []


def test_big_endian_file_matches_gguf_py(tmp_path):
    written = write_mixed_gguf(tmp_path / "be.gguf", big_endian=True)
    compare_with_gguf_py(written.path, written)
    parsed = read_file(str(written.path))
    assert parsed.version == 3 and parsed.notes
    for t in parsed.tensors:
        assert t.byte_order == ">"
        if codec_for(t.storage_type).swap is None:
            assert t.damaged == f"big-endian {t.storage_type} cannot be decoded: served raw only"
        else:
            assert t.damaged is None
    # the types docs/interfaces.md ("Codecs") calls swappable are decodable once their codecs say so
    swappable = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64", "Q4_0", "Q8_0", "Q4_K", "Q6_K", "MXFP4"}
    assert swappable <= {t.storage_type for t in parsed.tensors if t.damaged is None}


@pytest.mark.parametrize("big_endian", [False, True])
def test_version_2_file(tmp_path, big_endian):
    v3 = write_mixed_gguf(tmp_path / "v3.gguf", big_endian=big_endian)
    v2 = write_mixed_gguf(tmp_path / "v2.gguf", big_endian=big_endian, version=2)
    compare_with_gguf_py(v2.path, v2)
    a, b = read_file(str(v3.path)), read_file(str(v2.path))
    assert (a.version, b.version) == (3, 2)
    assert [(t.name, t.offset, t.stored_nbytes, t.shape) for t in a.tensors] == \
           [(t.name, t.offset, t.stored_nbytes, t.shape) for t in b.tensors]


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_custom_alignment(tmp_path, alignment):
    rng = np.random.default_rng(alignment)
    written = write_gguf(tmp_path / "a.gguf", {
        "a": (rng.standard_normal(3).astype(np.float32), "F32"),
        "b": (quantized("Q8_0", (1, 32), rng), gguf.GGMLQuantizationType.Q8_0),  # enum or name: both work
        "c": (rng.standard_normal(5).astype(np.float32), "F16"),
    }, alignment=alignment)
    compare_with_gguf_py(written.path, written)
    assert all(t.offset % alignment == 0 for t in read_file(str(written.path)).tensors)


def test_every_quant_type_geometry(tmp_path):
    """One tensor per GGML type that has a codec: sizes and bytes match gguf-py's view (Q8_1, whose size
    gguf-py gets wrong, and Q2_0, which it does not know, are checked against ggml's geometry)."""
    rng = np.random.default_rng(5)
    names = [n for n in GGML_TYPE_NAMES.values() if n not in ("Q8_1", "Q2_0")]
    tensors = {}
    for n in names:
        be, _ = GGML_GEOMETRY[n]
        shape = (2, 2 * be) if be > 1 else (2, 3)
        values = quantized(n, shape, rng) if be > 1 or n == "BF16" else rng.integers(-50, 50, shape)
        tensors[f"t.{n}"] = (values, n)
    written = write_gguf(tmp_path / "all.gguf", tensors)
    compare_with_gguf_py(written.path, written)
    extra = write_gguf(tmp_path / "extra.gguf", {
        "q8_1": (quantized("Q8_1", (2, 64), rng), "Q8_1"), "q2_0": (quantized("Q2_0", (3, 128), rng), "Q2_0")})
    parsed = read_file(str(extra.path))
    for t in parsed.tensors:
        be, bb = GGML_GEOMETRY[t.storage_type]
        assert (t.block_elements, t.block_bytes) == (be, bb)
        assert t.stored_nbytes == t.shape[0] * t.shape[1] // be * bb == len(extra.tensors[t.name].raw)
        assert file_bytes(extra.path, t.offset, t.stored_nbytes) == extra.tensors[t.name].raw


def test_type_table_matches_gguf_py():
    for qtype in gguf.GGMLQuantizationType:
        assert GGML_TYPE_NAMES[int(qtype)] == qtype.name
    assert GGML_TYPE_NAMES[42] == "Q2_0" and GGML_TYPE_IDS["Q2_0"] == 42
    assert not {4, 5, 31, 32, 33, 36, 37, 38} & set(GGML_TYPE_NAMES)


# --------------------------------------------------------------------------------- metadata

def test_every_value_type(mixed):
    md = read_file(str(mixed.path)).metadata
    spec = every_value_type()
    assert md.value_type("t.u64") == "UINT64" and md.value_type("a.str") == "ARRAY[STRING]"
    assert md.value_type("a.nested") == "ARRAY[ARRAY]" and md.value_type("t.bool_true") == "BOOL"
    assert md["t.str_bad_utf8"] == b"ok\xff\xfe".decode("utf-8", "surrogateescape")
    assert md["a.str_bad"] == ["\udcff", "x\udc80y"]
    assert md["a.nested2"][0][1].tolist() == [2, 3]
    for key in spec:
        assert_same_value(md[key], mixed.metadata[key], key)


def test_metadata_is_lazy_and_values_are_safe(mixed):
    md = read_file(str(mixed.path)).metadata
    assert not any(md.is_decoded(k) for k in md)
    assert "a.str" in md and "missing" not in md and len(md) == len(list(md))
    assert not any(md.is_decoded(k) for k in md)
    with pytest.raises(KeyError):
        md["missing"]
    array = md["a.f32"]
    assert md.is_decoded("a.f32") and not md.is_decoded("a.str")
    with pytest.raises(ValueError):
        array[0] = 9
    strings = md["a.str"]
    strings.append("changed")
    assert md["a.str"] == ["a", "bé", "", "中文"]
    nested = md["a.nested"]
    nested.clear()
    assert len(md["a.nested"]) == 3
    assert md.get("t.u8") == 255 and md.get("missing", 1) == 1


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Written:
    return big_vocab_gguf(tmp_path_factory.mktemp("vocab") / "vocab.gguf")


def test_big_vocabulary(vocab):
    parsed = read_file(str(vocab.path))
    md = parsed.metadata
    assert not md.is_decoded("tokenizer.ggml.tokens")
    expected = vocab_metadata()
    tokens = md["tokenizer.ggml.tokens"]
    assert len(tokens) == 262_144
    assert tokens == vocab.metadata["tokenizer.ggml.tokens"]
    assert tokens[5] == "\udcff\udcfe5"
    np.testing.assert_array_equal(md["tokenizer.ggml.scores"], np.array(expected["tokenizer.ggml.scores"][0], "<f4"))
    np.testing.assert_array_equal(md["tokenizer.ggml.token_type"],
                                  np.array(expected["tokenizer.ggml.token_type"][0], "<i4"))
    assert md["tokenizer.ggml.scores"].dtype == np.dtype("<f4")
    for t in parsed.tensors:
        ref = vocab.tensors[t.name]
        assert (t.storage_type, t.shape) == (ref.storage_type, ref.shape)
        assert file_bytes(vocab.path, t.offset, t.stored_nbytes) == ref.raw


# ------------------------------------------------------------------------------- hand-built files

class Blob:
    """Builds GGUF bytes field by field, in either byte order, so tests can write anything."""

    def __init__(self, order: str = "<"):
        self.o = order
        self.b = bytearray()

    def raw(self, data: bytes) -> Blob:
        self.b += data
        return self

    def u32(self, v: int) -> Blob:
        return self.raw(struct.pack(self.o + "I", v))

    def u64(self, v: int) -> Blob:
        return self.raw(struct.pack(self.o + "Q", v))

    def str(self, s: str | bytes, length: int | None = None) -> Blob:
        data = s.encode() if isinstance(s, str) else s
        return self.u64(len(data) if length is None else length).raw(data)


def gguf_blob(kvs=(), tensors=(), *, version=3, order="<", counts=None, data=b"", alignment=32) -> bytes:
    """A GGUF file: ``kvs`` = [(key, type id, value bytes)], ``tensors`` = [(name, dims, type id, rel offset)]."""
    b = Blob(order).raw(b"GGUF").u32(version)
    n_tensors, n_kvs = counts if counts is not None else (len(tensors), len(kvs))
    b.u64(n_tensors).u64(n_kvs)
    for key, vtype, value in kvs:
        b.str(key).u32(vtype).raw(value)
    for name, dims, type_id, offset in tensors:
        b.str(name).u32(len(dims))
        for d in dims:
            b.u64(d)
        b.u32(type_id).u64(offset)
    b.raw(b"\0" * (-len(b.b) % alignment))
    return bytes(b.b) + data


def le(fmt: str, *v) -> bytes:
    return struct.pack("<" + fmt, *v)


def write(tmp_path: Path, data: bytes, name: str = "bad.gguf") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


F32 = 0
ONE_F32 = [("t", [1], F32, 0)]

BAD_HEADERS = {
    "empty": (b"", "bad magic"),
    "short magic": (b"GGU", "bad magic"),
    "bad magic": (b"GGUX" + bytes(20), "bad magic"),
    "no version": (b"GGUF\x03\x00", "header cut short"),
    "version 1": (b"GGUF" + le("I", 1) + bytes(16), "obsolete v1 format"),
    "version 0": (b"GGUF" + le("I", 0) + bytes(16), "unsupported GGUF version 0"),
    "version 4": (b"GGUF" + le("I", 4) + bytes(16), "unsupported GGUF version 4"),
    "counts cut": (b"GGUF" + le("I", 3) + le("Q", 0), "header cut short"),
    "tensor count 2^60": (gguf_blob(counts=(2**60, 0)), "cannot fit"),
    "kv count 2^60": (gguf_blob(counts=(0, 2**60)), "cannot fit"),
    "kv count 2^64-1": (gguf_blob(counts=(0, 2**64 - 1)), "cannot fit"),
    "kv missing": (gguf_blob(counts=(0, 1)), "cannot fit"),
    "key length huge": (gguf_blob(counts=(0, 1), alignment=1) + le("Q", 2**63) + bytes(8), "exceeds"),
    "key cut": (gguf_blob(counts=(0, 1), alignment=1) + le("Q", 10) + b"abc" + bytes(2), "exceeds"),
    "value type cut": (gguf_blob(counts=(0, 1), alignment=1) + Blob().str("kkkk").b + b"\x00\x00", "header cut short"),
    "unknown value type": (gguf_blob([("k", 13, bytes(8))]), "unknown value type 13"),
    "string value too long": (gguf_blob([("k", 8, le("Q", 1000) + b"abc")]), "exceeds"),
    "u64 value cut": (gguf_blob([("k", 10, b"\x01\x02")], alignment=1), "header cut short"),
    "array count 2^60 u8": (gguf_blob([("k", 9, le("IQ", 0, 2**60))]), "needs at least"),
    "array count 2^60 str": (gguf_blob([("k", 9, le("IQ", 8, 2**60))]), "needs at least"),
    "array count 2^60 arr": (gguf_blob([("k", 9, le("IQ", 9, 2**60))]), "needs at least"),
    "array elem type 13": (gguf_blob([("k", 9, le("IQ", 13, 1) + bytes(8))]), "unknown array element type 13"),
    "string element past end": (gguf_blob([("k", 9, le("IQ", 8, 3) + Blob().str("ab").str("c").b + le("Q", 99))],
                                          alignment=1), "k'[2] length 99 exceeds"),
    "string element length 2^63": (gguf_blob([("k", 9, le("IQ", 8, 2) + le("Q", 2**63) + le("Q", 0))],
                                             alignment=1), "k'[0] length"),
    "nested too deep": (gguf_blob([("k", 9, b"".join(le("IQ", 9, 1) for _ in range(MAX_ARRAY_DEPTH))
                                    + le("IQ", 0, 0))]), "nested deeper"),
    "duplicate key": (gguf_blob([("k", 4, le("I", 1)), ("k", 4, le("I", 2))]), "duplicate metadata key 'k'"),
    "alignment 0": (gguf_blob([("general.alignment", 4, le("I", 0))]), "non-zero power of two"),
    "alignment 48": (gguf_blob([("general.alignment", 4, le("I", 48))]), "non-zero power of two"),
    "alignment i32": (gguf_blob([("general.alignment", 5, le("i", 32))]), "must be an unsigned integer"),
    "alignment string": (gguf_blob([("general.alignment", 8, Blob().str("32").b)]), "must be an unsigned"),
    "tensor info missing": (gguf_blob(counts=(1, 0)), "cannot fit"),
    "tensor name huge": (gguf_blob(counts=(1, 0), alignment=1) + le("Q", 2**62) + bytes(24), "exceeds"),
    "too many dims": (gguf_blob([], [("t", [1] * (MAX_DIMS + 1), F32, 0)]), f"at most {MAX_DIMS}"),
    "n_dims 2^32-1": (gguf_blob(counts=(1, 0), alignment=1) + Blob().str("t").u32(2**32 - 1).b + bytes(20), "dimensions"),
    "dims cut": (gguf_blob(counts=(1, 0), alignment=1) + Blob().str("t").u32(2).u64(4).b + bytes(4),
                 "header cut short"),
    "dims overflow": (gguf_blob([], [("t", [2**32, 2**32], F32, 0)]), "more elements than int64"),
    "dim 2^63": (gguf_blob([], [("t", [2**63], F32, 0)]), "overflows int64"),
    "bytes overflow": (gguf_blob([], [("t", [2**63 - 32], 8, 0)]), "overflows int64"),
    "q8_0 row 33": (gguf_blob([], [("t", [33, 2], 8, 0)]), "not a multiple of the Q8_0 block size 32"),
    "q4_k scalar": (gguf_blob([], [("t", [], 12, 0)]), "not a multiple of the Q4_K block size 256"),
}


@pytest.mark.parametrize("case", list(BAD_HEADERS))
def test_bad_header_is_refused(tmp_path, case):
    data, expected = BAD_HEADERS[case]
    path = write(tmp_path, data, f"bad-{case.replace(' ', '_')}.gguf")
    with pytest.raises(CheckpointError) as info:
        read_gguf(path)
    assert path in str(info.value)
    assert expected in str(info.value)
    assert info.value.offset is not None


def test_bad_header_counts_fail_before_any_loop(tmp_path):
    """2^64-1 strings in an array: refused from the count alone (the file has 60 bytes)."""
    path = write(tmp_path, gguf_blob([("k", 9, le("IQ", 8, 2**64 - 1))]))
    with pytest.raises(CheckpointError, match="array of 18446744073709551615 STRING"):
        read_gguf(path)


@pytest.mark.parametrize("cut", [10, 24, 30, 60, 120, 300, 700])
def test_header_cut_short_anywhere_is_refused(tmp_path, mixed, cut):
    path = write(tmp_path, mixed.path.read_bytes()[:cut])
    with pytest.raises(CheckpointError, match=r"header cut short|exceeds|cannot fit|needs at least"):
        read_gguf(path)


def test_accepted_oddities(tmp_path):
    """Things ggml or gguf-py refuse but that cost nothing to serve (see docs/formats.md)."""
    kvs = [
        ("general.alignment", 0, le("B", 64)),         # any unsigned type for the alignment
        ("", 7, b"\x02"),                                # empty key; bool stored as 2 reads as True
        ("nest", 9, le("IQ", 9, 2) + le("IQ", 0, 2) + b"\x01\x02" + le("IQ", 8, 1) + Blob().str("x").b),
    ]
    tensors = [("dup", [2], F32, 0), ("dup", [2], F32, 64), ("scalar", [], F32, 128)]
    path = write(tmp_path, gguf_blob(kvs, tensors, alignment=64, data=bytes(256)))
    parsed = read_gguf(path)
    md = parsed.metadata
    assert md["general.alignment"] == 64 and md.value_type("general.alignment") == "UINT8"
    assert md[""] is True
    nest = md["nest"]
    assert nest[0].tolist() == [1, 2] and nest[0].dtype == np.uint8 and nest[1] == ["x"]
    assert [t.name for t in parsed.tensors] == ["dup", "dup", "scalar"]
    scalar = parsed.tensors[2]
    assert scalar.shape == () and scalar.gguf_dims == () and scalar.stored_nbytes == 4
    assert parsed.tensors[0].offset % 64 == 0 and parsed.tensors[1].offset == parsed.tensors[0].offset + 64


def test_invalid_utf8_names_use_surrogateescape(tmp_path):
    b = Blob().raw(b"GGUF").u32(3).u64(1).u64(1)
    b.str(b"k\xff").u32(8).str(b"v\xfe")
    b.str(b"t\xc3").u32(1).u64(4).u32(F32).u64(0)
    b.raw(b"\0" * (-len(b.b) % 32)).raw(bytes(16))
    parsed = read_gguf(write(tmp_path, bytes(b.b)))
    assert list(parsed.metadata) == ["k\udcff"]
    assert parsed.metadata["k\udcff"] == "v\udcfe"
    assert parsed.tensors[0].name == "t\udcc3"


# ----------------------------------------------------------------------------------- served around

def test_unknown_type_ids_are_served_raw(tmp_path):
    rng = np.random.default_rng(3)
    odd = rng.integers(0, 256, 40, dtype=np.uint8)
    last = rng.integers(0, 256, 7, dtype=np.uint8)
    written = write_gguf(tmp_path / "u.gguf", {
        "a": (rng.standard_normal(3).astype(np.float32), "F32"),
        "removed": (odd, "GGML_TYPE_31"),
        "b": (rng.standard_normal(5).astype(np.float32), "F32"),
        "future": (last, "GGML_TYPE_77"),
    })
    size = written.path.stat().st_size
    parsed = read_file(str(written.path))
    by_name = {t.name: t for t in parsed.tensors}
    # the writer pads each tensor to 32 bytes: the raw extent of a type without layout runs to the next
    # tensor (padding included), the last one to the end of the file
    assert by_name["removed"].offset + 64 == by_name["b"].offset
    assert by_name["removed"].stored_nbytes == 64
    assert by_name["future"].stored_nbytes == size - by_name["future"].offset == 32
    for name, type_id in (("removed", 31), ("future", 77)):
        t = by_name[name]
        assert t.storage_type == f"GGML_TYPE_{type_id}"
        assert (t.block_elements, t.block_bytes) == (0, 0)
        assert t.damaged == f"unknown storage type {type_id}: served raw only"
        assert file_bytes(written.path, t.offset, len(written.tensors[name].raw)) == written.tensors[name].raw
    assert by_name["a"].damaged is None and by_name["b"].damaged is None


def test_known_type_without_codec_is_served_raw(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    written = write_gguf(tmp_path / "n.gguf", {"q": (quantized("Q4_1", (2, 32), rng), "Q4_1"),
                                               "f": (np.ones(4, np.float32), "F32")})
    monkeypatch.delitem(ckptfs.quant._registry, "Q4_1")
    assert codec_for("Q4_1") is None
    t = read_file(str(written.path)).tensors[0]
    assert t.storage_type == "Q4_1" and (t.block_elements, t.block_bytes) == (0, 0)
    assert t.damaged == "no codec for storage type Q4_1: served raw only"
    # the geometry table knows Q4_1 without its codec: the exact 2 blocks of 20 bytes, not the old guess of
    # 64 (40 bytes + the padding up to the next tensor)
    assert t.stored_nbytes == 40


def test_big_endian_damage_follows_codec_swap(tmp_path, monkeypatch):
    rng = np.random.default_rng(6)
    written = write_gguf(tmp_path / "be.gguf", {"q": (quantized("Q8_0", (1, 32), rng), "Q8_0")}, big_endian=True)
    real = codec_for("Q8_0")
    without_swap = Codec("Q8_0", 32, 34, real.dtype, real.decode)
    with_swap = Codec("Q8_0", 32, 34, real.dtype, real.decode, swap=lambda blocks: blocks)
    monkeypatch.setitem(ckptfs.quant._registry, "Q8_0", without_swap)
    assert read_file(str(written.path)).tensors[0].damaged == "big-endian Q8_0 cannot be decoded: served raw only"
    monkeypatch.setitem(ckptfs.quant._registry, "Q8_0", with_swap)
    assert read_file(str(written.path)).tensors[0].damaged is None


@pytest.mark.parametrize("big_endian", [False, True])
def test_truncated_data_is_served_around(tmp_path, mixed, big_endian):
    source = mixed if not big_endian else write_mixed_gguf(tmp_path / "be.gguf", big_endian=True)
    full = read_file(str(source.path))
    ordered = sorted(full.tensors, key=lambda t: t.offset)
    victim = ordered[len(ordered) // 2]
    cut = victim.offset + victim.stored_nbytes // 2 + 1
    path = write(tmp_path, source.path.read_bytes()[:cut], "cut.gguf")
    parsed = read_gguf(path)
    assert [t.name for t in parsed.tensors] == [t.name for t in full.tensors]
    for before, after in zip(full.tensors, parsed.tensors):
        assert (after.offset, after.stored_nbytes, after.shape) == (before.offset, before.stored_nbytes, before.shape)
        end = before.offset + before.stored_nbytes
        if end <= cut:
            assert after.damaged == before.damaged
        else:
            reason = f"truncated: needs bytes {before.offset}..{end}, file has {cut}"
            assert after.damaged is not None and reason in after.damaged


def test_data_section_entirely_missing(tmp_path, mixed):
    full = read_file(str(mixed.path))
    first = min(t.offset for t in full.tensors)
    path = write(tmp_path, mixed.path.read_bytes()[:first - 5], "nodata.gguf")
    parsed = read_gguf(path)
    assert all(t.damaged and t.damaged.startswith("truncated") for t in parsed.tensors if t.stored_nbytes)


def test_unknown_type_past_the_end(tmp_path):
    path = write(tmp_path, gguf_blob([], [("t", [4], 31, 4096)]))
    t = read_gguf(path).tensors[0]
    assert t.stored_nbytes == 0 and "starts past the end of the file" in t.damaged
    assert t.damaged.startswith("unknown storage type 31: served raw only")


def test_only_checkpoint_errors_escape(tmp_path):
    with pytest.raises(CheckpointError, match="cannot open"):
        read_gguf(str(tmp_path / "missing.gguf"))
    with pytest.raises(CheckpointError):
        read_gguf(str(tmp_path))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_headers_never_crash(tmp_path, data):
    """Random byte edits in the header of a valid file: a parse or a CheckpointError, nothing else."""
    base = _fuzz_base(tmp_path)
    blob = bytearray(base)
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, min(len(blob), 600) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.just(len(blob)), st.integers(0, len(blob))))
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(blob[:cut]))
    try:
        parsed = read_gguf(str(path))
    except CheckpointError:
        return
    for key in parsed.metadata:
        parsed.metadata[key]


_FUZZ_BASE: dict[str, bytes] = {}


def _fuzz_base(tmp_path: Path) -> bytes:
    if "base" not in _FUZZ_BASE:
        rng = np.random.default_rng(0)
        written = write_gguf(tmp_path / "base.gguf", {
            "a": (rng.standard_normal(8).astype(np.float32), "F32"),
            "q": (quantized("Q8_0", (1, 32), rng), "Q8_0"),
        }, {"s": ["x", "yy"], "n": [[1, 2], [3]], "u": (7, VT.UINT64), "f": 1.5})
        _FUZZ_BASE["base"] = written.path.read_bytes()
        os.remove(written.path)
    return _FUZZ_BASE["base"]
