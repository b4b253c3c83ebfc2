"""bitsandbytes (transformers' ``load_in_4bit`` / ``load_in_8bit`` checkpoints): NF4/FP4 blocks and LLM.int8 rows.

4-bit (``bnb_4bit_quant_type`` ``nf4`` or ``fp4``), per linear layer ``X`` (roles are the names after ``X.``):

- ``weight``: the codes, the whole ``[out, in]`` weight flattened and packed two to a byte, **high nibble
  first** (element ``2k`` in the high nibble of byte ``k``), stored as ``U8 [ceil(n / 2), 1]`` (or the same
  bytes in another ``bnb_4bit_quant_storage`` type);
- ``weight.absmax``: one scale per block of ``blocksize`` flattened elements (F32), or with double
  quantization one 8-bit code per block (U8), decoded through ``weight.nested_quant_map`` (F32 ``[256]``) and
  ``weight.nested_absmax`` (F32, one per ``nested_blocksize`` blocks) plus ``nested_offset``;
- ``weight.quant_map``: the 16 code values; ``weight.quant_state.bitsandbytes__nf4`` (or ``__fp4``): a U8
  tensor holding JSON with ``quant_type``, ``blocksize``, ``dtype``, ``shape`` and the nested settings.

Blocks run over the flattened weight, so a block may straddle rows: rows ``[o0, o1)`` are the elements
``[o0 * in, o1 * in)``, decoded from the blocks that cover them. The values, as bitsandbytes computes them
(its pure-PyTorch ``dequantize_4bit`` / ``dequantize_blockwise``), in float32:

    absmax[k] = nested_quant_map[absmax_code[k]] * nested_absmax[k // nested_blocksize] + offset  (nested)
    W[e]      = code_table[nibble(e)] * absmax[e // blocksize]

each operation rounded to float32 on its own (two roundings for the nested scale: no fused multiply-add),
then rounded to the quant state's ``dtype`` by the reference; the view serves the float32 value. The code
table is bitsandbytes' own (``get_4bit_type``: NF4's 16 quantiles; FP4's values over 12), which every
bitsandbytes backend uses whatever ``quant_map`` holds: a stored ``quant_map`` that differs from it is
refused at the first read rather than decoded two ways.

LLM.int8 (``load_in_8bit``): ``weight`` I8 ``[out, in]``, ``SCB`` F32 ``[out]``, optional ``weight_format``
(0: row-major, the only layout bitsandbytes loads). ``W = (w * SCB[:, None]) * 7.874015718698502e-3`` in
float32 (``int8_vectorwise_dequant``: the reciprocal of 127 as a float32 constant, applied after the row
scale; a division by 127 differs in the last bit for some values).

Both have a C kernel (``_bnb.c``) computing the same float32 products into a float32 buffer in one pass,
chosen per call as the other packed kernels are (``ckptfs.packed.native.use_kernel``); a float16 output, or
a build without it, decodes through numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.engine.values import PairedNibbles
from ckptfs.packed.base import Absent, Context, Layout, Parts, check_type, require
from ckptfs.packed.detect import Method, Scheme
from ckptfs.quant.native import DISABLED
from ckptfs.util.jsonutil import loads

try:
    from ckptfs.packed import _bnb
except ImportError:  # not built (no compiler at install time, or a source checkout): numpy only
    _bnb = None  # type: ignore[assignment]  # not built: the Python path serves

#: bitsandbytes ``get_4bit_type("nf4")``: quantiles of N(0, 1) (already within [-1, 1])
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], np.float32)
#: bitsandbytes ``get_4bit_type("fp4")``: E2M1 with bias 2 in bit-pattern order, divided by its maximum (12)
#: in float32; code 8 ("-0" in its source, an integer) is +0.0
FP4 = np.array([0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0],
               np.float32) / np.float32(12.0)
TABLES = {"nf4": NF4, "fp4": FP4}
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)  # what bitsandbytes' dequantize_4bit accepts
DTYPES = ("float32", "float16", "bfloat16")      # a quant state's dtype: what the reference rounds to
INT8_RECIPROCAL = np.float32(7.874015718698502e-3)       # bitsandbytes' 1 / 127 constant, as float32

QUANT_STATE = "weight.quant_state.bitsandbytes__"
ROLES_4BIT = ("weight", "weight.absmax", "weight.quant_map", "weight.nested_absmax", "weight.nested_quant_map",
              QUANT_STATE + "nf4", QUANT_STATE + "fp4")
ROLES_8BIT = ("weight", "SCB", "weight_format")
MAX_QUANT_STATE_BYTES = 64 * 1024
F32 = ("F32",)
#: what ``bnb_4bit_quant_storage`` may hold the code bytes as (the bytes are the same whatever the type)
CODE_TYPES = ("U8", "I8", "U16", "I16", "F16", "BF16", "U32", "I32", "F32", "U64", "I64")


def formats(settings: Mapping[str, Any]) -> tuple[str, ...]:
    """Both layouts whichever mode the config names: a layer is recognized by its parts, and one whose parts
    contradict the config's ``load_in_4bit`` / ``load_in_8bit`` is named with the reason it has no view."""
    if not settings.get("load_in_4bit") and not settings.get("load_in_8bit"):
        raise Absent("the bitsandbytes config sets neither load_in_4bit nor load_in_8bit")
    return ("4bit", "int8")


#: a 4-bit layer is marked by its block scales, an LLM.int8 layer by its row scales; the view is the
#: weight, in the name of the stored codes
SCHEMES = [Scheme("bitsandbytes-4bit", "bitsandbytes", "4bit", "bnb", "weight.absmax", ROLES_4BIT,
                  requires=("weight",)),
           Scheme("bitsandbytes-int8", "bitsandbytes", "int8", "bnb", "SCB", ROLES_8BIT, marker_types=F32,
                  requires=("weight",))]
METHODS = [Method("bitsandbytes", formats)]


def build(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any], context: Context) -> Layout:
    """The layout of layer ``prefix`` (``parts`` by role); ``context.small_bytes`` reads the quant state's
    JSON at open. The config's skip list is applied before (``detect.not_quantized``)."""
    states = sorted(role for role in parts if role.startswith(QUANT_STATE))
    if "SCB" not in parts:
        if not settings.get("load_in_4bit"):
            raise Absent("the layer stores 4-bit parts but the config does not say load_in_4bit")
        if len(states) != 1:
            raise Absent(f"{len(states)} quant states are stored ({QUANT_STATE}nf4 or fp4: one expected)")
        return _build_4bit(prefix, parts, states[0], context.small_bytes)
    if not settings.get("load_in_8bit"):
        raise Absent("the layer stores LLM.int8 parts but the config does not say load_in_8bit")
    return _build_int8(prefix, parts)


# ------------------------------------------------------------------------------------------------- 4-bit

def _quant_state(info: TensorInfo, read_small: Callable[[TensorInfo, int], bytes]) -> dict[str, Any]:
    if info.storage_type not in ("U8", "I8"):
        raise Absent(f"{info.name} is stored as {info.storage_type} (expected U8 bytes of JSON)")
    if info.stored_nbytes > MAX_QUANT_STATE_BYTES:
        raise Absent(f"{info.name} holds {info.stored_nbytes} bytes, too many for a quant state")
    try:
        doc = loads(read_small(info, MAX_QUANT_STATE_BYTES).decode("utf-8"), info.name)
    except (UnicodeDecodeError, ValueError) as exc:
        raise Absent(f"{info.name} is not a JSON quant state: {exc}") from None
    if not isinstance(doc, dict):
        raise Absent(f"{info.name} is not a JSON object")
    return doc


def _positive(doc: Mapping[str, Any], key: str, where: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise Absent(f"{where}: {key}={value!r} is not a positive integer")
    return value


def _count(info: TensorInfo, count: int, why: str) -> None:
    if math.prod(info.shape) != count:
        raise Absent(f"{info.name} has shape {list(info.shape)}, {why} expects {count} values")


def _build_4bit(prefix: str, parts: Mapping[str, TensorInfo], state_role: str,
                read_small: Callable[[TensorInfo, int], bytes]) -> Layout:
    state_info = require(parts, state_role, prefix)
    doc = _quant_state(state_info, read_small)
    where = state_info.name
    quant_type = doc.get("quant_type")
    if quant_type not in TABLES or state_role != QUANT_STATE + quant_type:
        raise Absent(f"{where}: quant_type {quant_type!r} is not nf4 or fp4 (or not the one its name says)")
    blocksize = _positive(doc, "blocksize", where)
    if blocksize not in BLOCKSIZES:
        raise Absent(f"{where}: blocksize {blocksize} is not one bitsandbytes decodes ({BLOCKSIZES})")
    dtype = doc.get("dtype")
    if dtype not in DTYPES:
        raise Absent(f"{where}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    shape = doc.get("shape")
    if not isinstance(shape, list) or len(shape) != 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape):
        raise Absent(f"{where}: shape {shape!r} is not a 2-D weight shape")
    out, in_features = shape
    n = out * in_features
    blocks = -(-n // blocksize)

    codes = require(parts, "weight", prefix)
    check_type(codes, CODE_TYPES)
    if codes.stored_nbytes != -(-n // 2) or not codes.shape or codes.stored_nbytes % codes.shape[0]:
        raise Absent(f"{codes.name} holds {codes.stored_nbytes} bytes as {list(codes.shape)}, the 4-bit codes "
                     f"of {shape} take {-(-n // 2)} bytes in rows")
    quant_map = require(parts, "weight.quant_map", prefix)
    check_type(quant_map, F32)
    _count(quant_map, 16, "a 4-bit code table")
    absmax = require(parts, "weight.absmax", prefix)
    used = {"weight": codes, "weight.absmax": absmax, "weight.quant_map": quant_map, state_role: state_info}
    nested = any(key.startswith("nested_") for key in doc) or any(role.startswith("weight.nested_") for role in parts)
    parameters: dict[str, Any] = {"quant_type": quant_type, "blocksize": blocksize, "blocks": blocks,
                                  "double_quant": nested, "dtype": dtype, "shape": [out, in_features]}
    offset = np.float32(0)
    nested_blocksize = 0
    if nested:
        nested_blocksize = _positive(doc, "nested_blocksize", where)
        if doc.get("nested_dtype", "float32") != "float32":
            raise Absent(f"{where}: nested_dtype {doc.get('nested_dtype')!r} is not supported (float32)")
        raw_offset = doc.get("nested_offset")
        if isinstance(raw_offset, bool) or not isinstance(raw_offset, (int, float)) \
                or not abs(raw_offset) <= float(np.finfo(np.float32).max):
            raise Absent(f"{where}: nested_offset {raw_offset!r} is not a finite float32 number")
        offset = np.float32(raw_offset)  # QuantState.from_dict: torch.tensor(float(...)), a float32
        check_type(absmax, ("U8",))
        _count(absmax, blocks, f"{blocks} blocks of {blocksize}")
        nested_absmax = require(parts, "weight.nested_absmax", prefix)
        nested_map = require(parts, "weight.nested_quant_map", prefix)
        check_type(nested_absmax, F32)
        check_type(nested_map, F32)
        _count(nested_absmax, -(-blocks // nested_blocksize), f"{blocks} block scales in groups of {nested_blocksize}")
        _count(nested_map, 256, "an 8-bit code table")
        used.update({"weight.nested_absmax": nested_absmax, "weight.nested_quant_map": nested_map})
        parameters.update({"nested_blocksize": nested_blocksize, "nested_offset": float(offset)})
    else:
        check_type(absmax, F32)
        _count(absmax, blocks, f"{blocks} blocks of {blocksize}")
    table = TABLES[quant_type]
    pairs = _pair_table(table)
    row_bytes = codes.stored_nbytes // codes.shape[0]

    small_roles = ("weight.quant_map",) + (("weight.nested_quant_map", "weight.nested_absmax") if nested else ())
    small_size = 1 + (256 + math.prod(used["weight.nested_absmax"].shape) if nested else 0)

    def small(reader: Parts) -> np.ndarray:
        """The layer's small parts in one cached float32 array (one cache lookup per tile): 1.0 when the
        stored quant_map is bitsandbytes' table, then the nested code table and the nested scales."""
        def build() -> np.ndarray:
            same = np.array_equal(reader.read_whole("weight.quant_map").reshape(-1).view(np.uint32),
                                  table.view(np.uint32))
            rest = [reader.read_whole(role).reshape(-1) for role in small_roles[1:]]
            return np.concatenate([np.array([float(same)], np.float32), *rest])

        values = reader.derived(f"bnb:{quant_type}:small", small_roles, (small_size,), build)
        if not values[0]:
            raise Absent(f"{quant_map.name} is not bitsandbytes' {quant_type} table, which its dequantization uses")
        return values

    def scales(stored: np.ndarray, held: np.ndarray, k0: int, k1: int) -> np.ndarray:
        """absmax of blocks [k0, k1) as float32 from their stored values (the nested ones decoded as
        bitsandbytes does: code value times its group's scale, then plus the offset, each rounded to
        float32)."""
        if not nested:
            return stored.astype(np.float32)
        values = held[1:257].take(stored)
        nested_scales = held[257:]
        for g in range(k0 // nested_blocksize, (k1 - 1) // nested_blocksize + 1):  # a few groups per tile
            values[max(k0, g * nested_blocksize) - k0: min(k1, (g + 1) * nested_blocksize) - k0] *= nested_scales[g]
        values += offset
        return values

    def code_bytes(reader: Parts, b0: int, b1: int) -> np.ndarray:
        r0, r1 = b0 // row_bytes, -(-b1 // row_bytes)
        raw = np.ascontiguousarray(reader.rows("weight", r0, r1)).reshape(-1).view(np.uint8)
        return raw[b0 - r0 * row_bytes: b1 - r0 * row_bytes]

    def inputs(reader: Parts, o0: int, o1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int]:
        """What rows [o0, o1) decode from: the code bytes and stored block scales of the blocks covering
        them, the layer's small parts (:func:`small`), the first block, its first element and the elements
        of the run."""
        held = small(reader)
        e0, e1 = o0 * in_features, o1 * in_features
        k0, k1 = e0 // blocksize, -(-e1 // blocksize)
        s0, s1 = k0 * blocksize, min(k1 * blocksize, n)      # s0 is even: the run starts on a byte
        stored = reader.rows("weight.absmax", k0, k1).reshape(-1)
        return code_bytes(reader, s0 // 2, -(-s1 // 2)), stored, held, k0, s0, s1 - s0

    def decode(reader: Parts, o0: int, o1: int, dest: np.ndarray | None) -> np.ndarray:
        data, stored, held, k0, s0, span = inputs(reader, o0, o1)
        absmax_values = scales(stored, held, k0, k0 + len(stored))
        values = pairs.take(data).view(np.float32)[:span]
        full = span // blocksize
        body = values[:full * blocksize].reshape(full, blocksize)
        body *= absmax_values[:full, None]
        if full < len(absmax_values):
            values[full * blocksize:] *= absmax_values[full]
        skip = o0 * in_features - s0
        result = values[skip: skip + (o1 - o0) * in_features].reshape(o1 - o0, in_features)
        if dest is None:
            return result
        target = dest.reshape(o1 - o0, in_features)
        np.copyto(target, result)
        return target

    def kernel(reader: Parts, o0: int, o1: int, dest: np.ndarray) -> bool:
        if dest.dtype != np.float32 or not dest.flags.c_contiguous or not dest.flags.writeable:
            return False
        data, stored, held, k0, s0, _ = inputs(reader, o0, o1)
        if nested:
            _bnb.dequantize_4bit(data, table, np.ascontiguousarray(stored), blocksize, o0 * in_features - s0,
                                 (o1 - o0) * in_features, dest.reshape(-1), held[1:257], held[257:],
                                 nested_blocksize, k0, float(offset))
        else:
            _bnb.dequantize_4bit(data, table, np.ascontiguousarray(stored, np.float32), blocksize,
                                 o0 * in_features - s0, (o1 - o0) * in_features, dest.reshape(-1), None, None, 1, 0,
                                 0.0)
        return True

    def computed(reader: Parts) -> PairedNibbles | None:
        """The layer for a mount's reads in C: its codes as the flat run they are (blocks may straddle rows),
        each block's absmax read with them (in their file): float32, or with double quantization a byte
        decoded as bitsandbytes does (``scales``), by the nested code table and second-level scales."""
        if absmax.source != codes.source:
            return None
        held = small(reader)
        values = pairs.view(np.float32)
        if not nested:
            return PairedNibbles(reader.source_of("weight"), codes.offset, out, in_features, values, blocksize,
                                 blocks, absmax.offset, "f32")
        return PairedNibbles(reader.source_of("weight"), codes.offset, out, in_features, values, blocksize,
                             blocks, absmax.offset, "nested", held[1:257], held[257:], nested_blocksize,
                             float(offset))

    return Layout("bitsandbytes-4bit", parameters, out, in_features, used, "F32", decode,
                  kernel=kernel if _kernel_built() else None, computed_codes=computed)


def _pair_table(table: np.ndarray) -> np.ndarray:
    """Each byte's two values (high nibble first) as one uint64: ``take`` over the bytes yields the values
    in element order, one lookup per byte."""
    pairs = np.empty((256, 2), np.float32)
    pairs[:, 0] = table[np.arange(256) >> 4]
    pairs[:, 1] = table[np.arange(256) & 15]
    return pairs.view(np.uint64).reshape(256)


# ------------------------------------------------------------------------------------------------ int8

def _build_int8(prefix: str, parts: Mapping[str, TensorInfo]) -> Layout:
    weight = require(parts, "weight", prefix)
    scb = require(parts, "SCB", prefix)
    check_type(weight, ("I8",))
    check_type(scb, F32)
    if len(weight.shape) != 2 or 0 in weight.shape:
        raise Absent(f"{weight.name} has shape {list(weight.shape)} (expected a 2-D weight)")
    out, in_features = weight.shape
    _count(scb, out, f"one scale per row of {weight.name}")
    used = {"weight": weight, "SCB": scb}
    fmt = parts.get("weight_format")
    if fmt is not None:
        check_type(fmt, ("U8", "I8", "I32", "I64"))
        _count(fmt, 1, "one format code")
        used["weight_format"] = fmt

    def checked(reader: Parts) -> None:
        if fmt is not None:
            code = int(reader.whole("weight_format").reshape(-1)[0])
            if code != 0:
                raise Absent(f"{fmt.name} is {code}, not 0 (row-major), the only layout bitsandbytes loads")

    def decode(reader: Parts, o0: int, o1: int, dest: np.ndarray | None) -> np.ndarray:
        checked(reader)
        result = dest.reshape(o1 - o0, in_features) if dest is not None else \
            np.empty((o1 - o0, in_features), np.float32)
        np.copyto(result, reader.rows("weight", o0, o1), casting="unsafe")
        result *= reader.whole("SCB").reshape(-1)[o0:o1, None]
        result *= INT8_RECIPROCAL
        return result

    def kernel(reader: Parts, o0: int, o1: int, dest: np.ndarray) -> bool:
        if dest.dtype != np.float32 or not dest.flags.c_contiguous or not dest.flags.writeable:
            return False
        checked(reader)
        _bnb.dequantize_int8(np.ascontiguousarray(reader.rows("weight", o0, o1)),
                             np.ascontiguousarray(reader.whole("SCB").reshape(-1)[o0:o1]), o1 - o0, in_features,
                             dest.reshape(-1))
        return True

    return Layout("bitsandbytes-int8", {"bits": 8, "format": "row"}, out, in_features, used, "F32", decode,
                  kernel=kernel if _kernel_built() else None)


def _kernel_built() -> bool:
    """Whether ``_bnb`` is built and not disabled (``CKPTFS_NO_NATIVE``)."""
    return _bnb is not None and not DISABLED
