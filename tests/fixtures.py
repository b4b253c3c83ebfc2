"""Test checkpoint generators, shared by every test that needs a real file.

Checkpoints are written at test time by the references - gguf-py's ``GGUFWriter`` and the safetensors
file layout (by hand where its numpy API lacks a dtype) - never by ckptfs, and nothing binary is committed.
Each writer returns a :class:`Written`: per tensor the bytes exactly as stored and, where an independent
decoder exists (numpy, ml_dtypes, ``gguf.quants.dequantize``), the values ckptfs must produce; plus the
metadata values a reader must return.

Import as ``from fixtures import ...`` (the tests directory is on ``sys.path`` under pytest).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType, GGUFEndian, GGUFValueType, GGUFWriter
from gguf import quants as gguf_quants

Q = GGMLQuantizationType
VT = GGUFValueType

#: Block geometry (elements, bytes) of the GGML types, transcribed from ggml-common.h via docs/block-formats.md. Not
#: gguf-py's table: it gives Q8_1 the pre-2024 40 bytes and lacks Q2_0 (id 42).
GGML_GEOMETRY: dict[str, tuple[int, int]] = {
    "F32": (1, 4), "F16": (1, 2), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "Q8_0": (32, 34), "Q8_1": (32, 36), "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144),
    "Q5_K": (256, 176), "Q6_K": (256, 210), "Q8_K": (256, 292), "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74),
    "IQ3_XXS": (256, 98), "IQ1_S": (256, 50), "IQ4_NL": (32, 18), "IQ3_S": (256, 110), "IQ2_S": (256, 82),
    "IQ4_XS": (256, 136), "I8": (1, 1), "I16": (1, 2), "I32": (1, 4), "I64": (1, 8), "F64": (1, 8),
    "IQ1_M": (256, 56), "BF16": (1, 2), "TQ1_0": (256, 54), "TQ2_0": (256, 66), "MXFP4": (32, 17),
    "NVFP4": (64, 36), "Q1_0": (128, 18), "Q2_0": (64, 18),
}
#: GGML type ids (ggml.h); Q2_0 is newer than gguf-py's enum.
GGML_TYPE_IDS: dict[str, int] = {**{t.name: int(t) for t in Q}, "Q2_0": 42}

#: Byte offsets of the fp16 scale fields in each block (docs/block-formats.md): random blocks get finite values there.
_FP16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q8_1": (0, 2),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ3_XXS": (0,), "IQ1_S": (0,), "IQ4_NL": (0,), "IQ3_S": (0,),
    "IQ2_S": (0,), "IQ4_XS": (0,), "TQ1_0": (52,), "TQ2_0": (64,), "Q1_0": (0,), "Q2_0": (0,),
}
#: Types whose big-endian layout is defined (gguf-py's gguf_convert_endian.py): fp16 fields swapped, rest bytes.
_BIG_ENDIAN_FP16_SWAPS: dict[str, tuple[int, ...]] = {"Q4_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,),
                                                      "MXFP4": (), "NVFP4": ()}
#: Types gguf-py can quantize (``quants.quantize``): the rest are written from random blocks.
_GGUF_PY_QUANTIZES = {"BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4"}
_PLAIN_GGML = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}

_VALUE_DTYPES = {VT.UINT8: "u1", VT.INT8: "i1", VT.UINT16: "<u2", VT.INT16: "<i2", VT.UINT32: "<u4",
                 VT.INT32: "<i4", VT.FLOAT32: "<f4", VT.UINT64: "<u8", VT.INT64: "<i8", VT.FLOAT64: "<f8"}

VOCAB_SIZE = 262_144


@dataclass(frozen=True)
class RefTensor:
    """One tensor as a reference wrote it."""

    name: str
    storage_type: str
    shape: tuple[int, ...]          # numpy order
    raw: bytes                      # the bytes in the file, exactly
    array: np.ndarray | None        # expected values (None where no independent decoder exists)


@dataclass
class Written:
    path: Path
    tensors: dict[str, RefTensor] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)   # expected decoded metadata values


# ---------------------------------------------------------------------------------------------- GGUF


def type_name(storage_type: str | GGMLQuantizationType) -> str:
    """A storage type given as a name ("Q4_K") or as gguf-py's enum, as its name."""
    return storage_type.name if isinstance(storage_type, GGMLQuantizationType) else storage_type


def random_blocks(storage_type: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """``u8[n_blocks, block_bytes]`` of random blocks whose scale fields are finite (no inf/NaN blow-ups)."""
    storage_type = type_name(storage_type)
    _, block_bytes = GGML_GEOMETRY[storage_type]
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for offset in _FP16_FIELDS.get(storage_type, ()):
        scale = rng.uniform(-1.0, 1.0, n_blocks).astype(np.float16)
        blocks[:, offset:offset + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    if storage_type == "Q8_K":
        blocks[:, 0:4] = rng.uniform(-1.0, 1.0, n_blocks).astype("<f4").view(np.uint8).reshape(n_blocks, 4)
    elif storage_type == "MXFP4":
        blocks[:, 0] = rng.integers(110, 140, n_blocks, dtype=np.uint8)
    elif storage_type == "IQ1_M":
        # d is scattered over the top nibbles of the four u16 scales at byte 48 (docs/block-formats.md, IQ1_M)
        d = rng.uniform(0.01, 1.0, n_blocks).astype(np.float16).view(np.uint16)
        scales = blocks[:, 48:56].copy().view("<u2")
        for i in range(4):
            nibble = ((d >> (4 * i)) & 0xF).astype(np.uint16)
            scales[:, i] = (scales[:, i] & 0x0FFF) | (nibble << 12)
        blocks[:, 48:56] = scales.view(np.uint8)
    return blocks


def quantized(storage_type: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Stored bytes of a tensor of numpy ``shape`` in ``storage_type``: byte shape ``(*shape[:-1], row_bytes)``.

    Quantized by gguf-py where it can (from random floats), random blocks otherwise.
    """
    storage_type = type_name(storage_type)
    block_elements, block_bytes = GGML_GEOMETRY[storage_type]
    if shape[-1] % block_elements:
        raise ValueError(f"{storage_type}: last dimension {shape[-1]} is not a multiple of {block_elements}")
    if storage_type in _GGUF_PY_QUANTIZES:
        values = rng.standard_normal(shape).astype(np.float32)
        return gguf_quants.quantize(values, Q[storage_type]).view(np.uint8).reshape(*shape[:-1], -1)
    n_blocks = int(np.prod(shape)) // block_elements
    row_bytes = shape[-1] // block_elements * block_bytes
    return random_blocks(storage_type, n_blocks, rng).reshape(*shape[:-1], row_bytes)


def _gguf_reference(storage_type: str, stored: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """Values of little-endian stored bytes, decoded by gguf-py or numpy (None where neither can)."""
    if storage_type in _PLAIN_GGML:
        return np.frombuffer(stored.tobytes(), _PLAIN_GGML[storage_type]).reshape(shape)
    try:
        values = gguf_quants.dequantize(stored.view(np.uint8), Q[storage_type])
    except (NotImplementedError, KeyError):
        return None
    return np.asarray(values, dtype=np.float32).reshape(shape)


def _to_big_endian(storage_type: str, stored: np.ndarray) -> np.ndarray | None:
    """Stored bytes in a big-endian file's layout, or None where that layout is undefined."""
    if storage_type in _PLAIN_GGML or storage_type == "BF16":
        width = 2 if storage_type == "BF16" else np.dtype(_PLAIN_GGML[storage_type]).itemsize
        return stored.view(np.uint8).reshape(-1, width)[:, ::-1].reshape(stored.view(np.uint8).shape).copy()
    if storage_type not in _BIG_ENDIAN_FP16_SWAPS:
        return None
    blocks = stored.view(np.uint8).reshape(-1, GGML_GEOMETRY[storage_type][1]).copy()
    for offset in _BIG_ENDIAN_FP16_SWAPS[storage_type]:
        blocks[:, [offset, offset + 1]] = blocks[:, [offset + 1, offset]]
    return blocks.reshape(stored.view(np.uint8).shape)


def write_gguf(path: str | Path, tensors: Mapping[str, tuple[np.ndarray, str]],
               metadata: Mapping[str, Any] | None = None, *, big_endian: bool = False, version: int = 3,
               alignment: int | None = None, big_vocab: bool = False, arch: str = "test") -> Written:
    """Write a GGUF with gguf-py's writer.

    ``tensors``: name -> (values, storage type name or ``GGMLQuantizationType``). Values are a numpy array of the logical (numpy-order)
    shape: plain types (F32, F16, F64, I8..I64) are stored as given; BF16 and quantized types are quantized
    by gguf-py from float values where it can. A ``uint8`` array for a non-plain type is taken as the
    stored bytes themselves, byte shape ``(*shape[:-1], row_bytes)`` (see :func:`quantized`). A storage type
    may also be ``"GGML_TYPE_<id>"`` for an id no reader knows (values: uint8 bytes, written as one row).

    ``metadata``: key -> value (auto-typed as gguf-py does: int -> INT32, float -> FLOAT32, list -> ARRAY),
    or ``(value, GGUFValueType)``, or ``(list, GGUFValueType.ARRAY, element type)``. Strings may be bytes
    (invalid UTF-8 allowed). ``version=2`` patches the version field (v2 and v3 share the layout).
    """
    path = Path(path)
    endian = GGUFEndian.BIG if big_endian else GGUFEndian.LITTLE
    writer = GGUFWriter(str(path), arch, endianess=endian)
    out = Written(path)
    out.metadata["general.architecture"] = arch
    if alignment is not None:
        writer.add_custom_alignment(alignment)
        out.metadata["general.alignment"] = alignment
    items = dict(metadata or {})
    if big_vocab:
        items.update(vocab_metadata())
    for key, spec in items.items():
        value, vtype, sub_type = _value_spec(spec)
        writer.add_key_value(key, value, vtype, sub_type)
        out.metadata[key] = expected_value(value, vtype, sub_type)
    for name, (values, storage_type) in tensors.items():
        ref, stored, type_id, logical_shape = _prepare_tensor(name, values, storage_type, big_endian)
        if ref.storage_type in _PLAIN_GGML and not big_endian:
            writer.add_tensor(name, stored)
        else:
            # any bytes, any id: int8 data skips gguf-py's size table and its byte swapping
            data = np.ascontiguousarray(stored).view(np.int8)
            writer.add_tensor(name, data, raw_shape=logical_shape, raw_dtype=type_id)
        out.tensors[name] = ref
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if version != 3:
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(struct.pack(">I" if big_endian else "<I", version))
    return out


def _prepare_tensor(name: str, values: np.ndarray, storage_type: str,
                    big_endian: bool) -> tuple[RefTensor, np.ndarray, int, tuple[int, ...]]:
    """(reference, bytes to store, type id, numpy shape) for one tensor of :func:`write_gguf`."""
    values = np.asarray(values)
    storage_type = type_name(storage_type)
    if storage_type.startswith("GGML_TYPE_"):
        stored = values.astype(np.uint8).reshape(1, -1)
        ref = RefTensor(name, storage_type, (stored.size,), stored.tobytes(), None)
        return ref, stored, int(storage_type.removeprefix("GGML_TYPE_")), (stored.size,)
    block_elements, block_bytes = GGML_GEOMETRY[storage_type]
    if storage_type in _PLAIN_GGML:
        stored = np.ascontiguousarray(values.astype(_PLAIN_GGML[storage_type]))
        shape = stored.shape
    elif values.dtype == np.uint8:
        stored = np.ascontiguousarray(values)
        shape = (*stored.shape[:-1], stored.shape[-1] // block_bytes * block_elements)
    else:
        shape = values.shape
        stored = quantized_from_values(storage_type, values)
    array = _gguf_reference(storage_type, stored, shape)
    if big_endian:
        swapped = _to_big_endian(storage_type, stored)
        if swapped is None:
            array = None  # no defined big-endian layout: the file holds the little-endian bytes, raw only
        else:
            stored = swapped
    raw = np.ascontiguousarray(stored).tobytes()
    return RefTensor(name, storage_type, tuple(shape), raw, array), stored, GGML_TYPE_IDS[storage_type], tuple(shape)


def quantized_from_values(storage_type: str, values: np.ndarray) -> np.ndarray:
    """gguf-py's quantization of float ``values`` (byte shape), for the types it implements."""
    storage_type = type_name(storage_type)
    if storage_type not in _GGUF_PY_QUANTIZES:
        raise ValueError(f"gguf-py cannot quantize {storage_type}: pass stored bytes (see quantized())")
    return gguf_quants.quantize(values.astype(np.float32), Q[storage_type]).view(np.uint8)


def _value_spec(spec: Any) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    if isinstance(spec, tuple):
        if len(spec) == 3:
            return spec[0], spec[1], spec[2]
        return spec[0], spec[1], None
    return spec, VT.get_type(spec), None


def expected_value(value: Any, vtype: GGUFValueType, sub_type: GGUFValueType | None = None) -> Any:
    """What a reader must return for a value gguf-py wrote with this type (docs/interfaces.md, "Library API")."""
    if vtype == VT.STRING:
        return value.decode("utf-8", "surrogateescape") if isinstance(value, (bytes, bytearray)) else value
    if vtype == VT.BOOL:
        return bool(value)
    if vtype == VT.FLOAT32:
        return float(np.float32(value))
    if vtype in (VT.FLOAT64,):
        return float(value)
    if vtype != VT.ARRAY:
        return int(value)
    elem = sub_type if sub_type is not None else VT.get_type(value[0])
    if elem == VT.STRING:
        return [expected_value(v, VT.STRING) for v in value]
    if elem == VT.ARRAY:
        return [expected_value(v, VT.ARRAY) for v in value]
    if elem == VT.BOOL:
        return np.array(value, dtype=bool)
    return np.array(value, dtype=_VALUE_DTYPES[elem])


def every_value_type() -> dict[str, Any]:
    """Metadata of every GGUF value type, scalar and array, including nested arrays and odd strings."""
    return {
        "t.u8": (255, VT.UINT8), "t.i8": (-128, VT.INT8), "t.u16": (65535, VT.UINT16), "t.i16": (-32768, VT.INT16),
        "t.u32": (2**32 - 1, VT.UINT32), "t.i32": (-2**31, VT.INT32), "t.f32": (3.14159, VT.FLOAT32),
        "t.bool_true": (True, VT.BOOL), "t.bool_false": (False, VT.BOOL), "t.str": "hello, wörld ✓",
        "t.str_empty_ok": (b"", VT.STRING), "t.str_bad_utf8": (b"ok\xff\xfe", VT.STRING),
        "t.u64": (2**64 - 1, VT.UINT64), "t.i64": (-2**63, VT.INT64), "t.f64": (-2.5e300, VT.FLOAT64),
        "a.u8": ([0, 1, 255], VT.ARRAY, VT.UINT8), "a.i8": ([-1, 2], VT.ARRAY, VT.INT8),
        "a.u16": ([1, 65535], VT.ARRAY, VT.UINT16), "a.i16": ([-5, 5], VT.ARRAY, VT.INT16),
        "a.u32": ([7, 2**32 - 1], VT.ARRAY, VT.UINT32), "a.i32": [1, -2, 3],
        "a.f32": [0.5, -1.25, 1e-3], "a.bool": ([True, False, True], VT.ARRAY, VT.BOOL),
        "a.str": ["a", "bé", "", "中文"], "a.str_bad": ([b"\xff", b"x\x80y"], VT.ARRAY, VT.STRING),
        "a.u64": ([2**64 - 1, 0], VT.ARRAY, VT.UINT64), "a.i64": ([-2**63, 1], VT.ARRAY, VT.INT64),
        "a.f64": ([1.5, -0.0], VT.ARRAY, VT.FLOAT64),
        "a.nested": [[1, 2], [3.5], ["x", "y"]], "a.nested2": [[[1], [2, 3]], [[4]]],
        "a.single": [42],
    }


def vocab_metadata(n: int = VOCAB_SIZE) -> dict[str, Any]:
    """A tokenizer as big as Gemma's: ``n`` token strings (a few not valid UTF-8), f32 scores, i32 types."""
    tokens: list[Any] = [f"tok{i}" for i in range(n)]
    for i in range(0, n, 997):
        tokens[i] = f"▁{chr(0x4E00 + i % 20000)}{i}"
    for i in range(5, n, 40_009):
        tokens[i] = b"\xff\xfe" + str(i).encode()
    scores = (-np.arange(n, dtype=np.float32) / 7).tolist()
    types = [1 + (i % 6) for i in range(n)]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": (tokens, VT.ARRAY, VT.STRING),
        "tokenizer.ggml.scores": (scores, VT.ARRAY, VT.FLOAT32),
        "tokenizer.ggml.token_type": (types, VT.ARRAY, VT.INT32),
    }


def mixed_tensors(rng: np.random.Generator | None = None) -> dict[str, tuple[np.ndarray, str]]:
    """Small tensors in many storage types and ranks (for :func:`write_gguf`)."""
    rng = rng or np.random.default_rng(1234)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    return {
        "f32.vec": (f(7), "F32"),
        "f32.mat": (f(3, 5), "F32"),
        "f32.scalar_like": (f(1), "F32"),
        "f16.mat": (f(4, 6), "F16"),
        "bf16.mat": (f(2, 8), "BF16"),
        "f64.vec": (rng.standard_normal(3), "F64"),
        "i8.vec": (rng.integers(-128, 128, 9), "I8"),
        "i16.vec": (rng.integers(-30000, 30000, 5), "I16"),
        "i32.mat": (rng.integers(-2**31, 2**31, (2, 3)), "I32"),
        "i64.vec": (rng.integers(-2**62, 2**62, 4), "I64"),
        "q8_0.mat": (f(3, 64), "Q8_0"),
        "q4_0.mat": (f(2, 64), "Q4_0"),
        "q4_1.mat": (f(2, 32), "Q4_1"),
        "q5_0.mat": (f(2, 32), "Q5_0"),
        "q5_1.vec": (f(32), "Q5_1"),
        "q4_k.mat": (quantized("Q4_K", (2, 256), rng), "Q4_K"),
        "q6_k.cube": (quantized("Q6_K", (2, 1, 256), rng), "Q6_K"),
        "q2_k.vec": (quantized("Q2_K", (256,), rng), "Q2_K"),
        "iq4_nl.mat": (quantized("IQ4_NL", (2, 32), rng), "IQ4_NL"),
        "mxfp4.vec": (f(64), "MXFP4"),
        "tq2_0.vec": (f(256), "TQ2_0"),
        "f32.4d": (f(2, 1, 3, 4), "F32"),
    }


def write_mixed_gguf(path: str | Path, *, big_endian: bool = False, version: int = 3,
                     metadata: Mapping[str, Any] | None = None) -> Written:
    """A GGUF holding :func:`mixed_tensors` (F32, F16, BF16, F64, I8-I64, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
    Q4_K, Q6_K, Q2_K, IQ4_NL, MXFP4, TQ2_0; ranks 1-4) and :func:`every_value_type` metadata."""
    return write_gguf(path, mixed_tensors(), {**every_value_type(), **(metadata or {})},
                      big_endian=big_endian, version=version)


def big_vocab_gguf(path: str | Path) -> Written:
    """A GGUF with a 262,144-entry tokenizer vocabulary and a few small tensors (the open-speed case)."""
    rng = np.random.default_rng(7)
    tensors = {
        "token_embd.weight": (quantized("Q8_0", (4, 64), rng), "Q8_0"),
        "output_norm.weight": (rng.standard_normal(64).astype(np.float32), "F32"),
        "blk.0.attn_q.weight": (quantized("Q4_K", (2, 256), rng), "Q4_K"),
    }
    return write_gguf(path, tensors, big_vocab=True, arch="llama")


# ------------------------------------------------------------------------------------------ safetensors

#: safetensors dtype name -> numpy dtype (ml_dtypes for the small floats); F4 and F6 have none (packed).
ST_NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(bool), "U8": np.dtype("u1"), "I8": np.dtype("i1"), "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"), "U32": np.dtype("<u4"), "I32": np.dtype("<i4"), "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8"),
    "C64": np.dtype("<c8"), "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz), "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
}
ST_BITS: dict[str, int] = {**{k: v.itemsize * 8 for k, v in ST_NUMPY_DTYPES.items()},
                           "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


def _st_dtype_of(array: np.ndarray) -> str:
    for name, dtype in ST_NUMPY_DTYPES.items():
        if array.dtype == dtype:
            return name
    raise ValueError(f"no safetensors dtype for numpy {array.dtype}")


def write_safetensors(path: str | Path, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None,
                      *, header_padding: bool = True) -> Written:
    """Write a safetensors file by hand, laid out as the reference writer does.

    ``tensors``: name -> numpy array (numpy or ml_dtypes dtype, mapped to its safetensors name), or
    ``(stored bytes, dtype name, shape)`` for any dtype (F4 and F6 have no numpy type). Tensors are stored
    by decreasing element size then name (as safetensors does, keeping data aligned); the header is padded
    with spaces to a multiple of 8.
    """
    path = Path(path)
    out = Written(path, metadata=dict(metadata or {}))
    entries = []
    for name, spec in tensors.items():
        if isinstance(spec, tuple):
            raw, dtype, shape = bytes(spec[0]), spec[1], tuple(spec[2])
            array = None
        else:
            array = np.array(spec, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
            dtype, shape = _st_dtype_of(array), array.shape
            raw = array.tobytes()
        entries.append((name, dtype, shape, raw, array))
    entries.sort(key=lambda e: (-ST_BITS[e[1]], e[0]))
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    position = 0
    for name, dtype, shape, raw, array in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [position, position + len(raw)]}
        position += len(raw)
        out.tensors[name] = RefTensor(name, dtype, shape, raw, array)
    text = json.dumps(header, separators=(",", ":")).encode()
    if header_padding:
        text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, _, raw, _ in entries:
            f.write(raw)
    return out


def all_dtype_tensors(rng: np.random.Generator | None = None) -> dict[str, Any]:
    """One small tensor per safetensors dtype (every one 0.8.0 knows), plus a scalar and an empty tensor."""
    rng = rng or np.random.default_rng(99)
    tensors: dict[str, Any] = {}
    for name, dtype in ST_NUMPY_DTYPES.items():
        shape = (3, 4)
        if dtype.kind == "b":
            values = rng.integers(0, 2, shape).astype(bool)
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            values = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        elif dtype.kind == "c":
            values = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
        elif dtype.itemsize == 1:  # 8-bit floats: every bit pattern, NaNs included
            values = rng.integers(0, 256, shape, dtype=np.uint8).view(dtype)
        else:
            values = rng.standard_normal(shape).astype(dtype)
        tensors[f"t.{name.lower()}"] = values
    tensors["t.f4"] = (rng.integers(0, 256, 6, dtype=np.uint8).tobytes(), "F4", (3, 4))
    tensors["t.f6_e2m3"] = (rng.integers(0, 256, 9, dtype=np.uint8).tobytes(), "F6_E2M3", (3, 4))
    tensors["t.f6_e3m2"] = (rng.integers(0, 256, 6, dtype=np.uint8).tobytes(), "F6_E3M2", (2, 4))
    tensors["t.scalar"] = np.array(2.5, dtype=np.float32)
    tensors["t.empty"] = np.zeros((0, 3), dtype=np.float32)
    return tensors


def write_all_dtypes_safetensors(path: str | Path) -> Written:
    """A safetensors file with every dtype (see :func:`all_dtype_tensors`) and some ``__metadata__``."""
    return write_safetensors(path, all_dtype_tensors(), {"format": "pt", "note": "ünïcode ✓"})


def jsonable(value: Any) -> Any:
    """A metadata value as its JSON (parsed) form: arrays as lists, non-finite floats as strings."""
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value
