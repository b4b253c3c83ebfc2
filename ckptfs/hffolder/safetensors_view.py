"""A virtual safetensors file: header from the tensors' names and shapes alone, data decoded per read.

Layout (safetensors' format): u64 little-endian header length N, N bytes of JSON (padded with spaces to a
multiple of 8, as the safetensors writer pads), then each tensor's bytes back to back, C order. The header
is known without decoding anything: names, shapes and the served dtype fix every offset.

One builder serves both hf/ folders: model.safetensors of a GGUF and the shards of a quantized folder's
unquantized release. A read of bytes [a, b) of one parameter decodes only the stored blocks behind it (a GGUF
tensor's rows through the block engine, a quantized layer's tiles through its view, both with their cache),
applies the parameter's row order and value map (weights.py) in float32 — transformers' loader works in
float32 too — and converts to the served dtype: bfloat16 rounded to nearest-even exactly as
``torch.Tensor.to(torch.bfloat16)`` does on CPU (NaN becomes 0xFFFF as torch writes it), float16 with
numpy's IEEE rounding (torch's too; a NaN gets its quiet bit set, as torch sets it). A float32 parameter
stored as F32 (or a view served in float32) with no transform is served straight from its values' bytes, as a
``.npy`` is, and one stored in the served type already (BF16 served as bfloat16, F16 as float16) from its stored
bytes; an integer tensor keeps its stored type.
"""

from __future__ import annotations

import bisect
import functools
import json
import struct

import numpy as np

from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.engine.blocks import GROUP_TARGET_BYTES, TensorData
from ckptfs.engine.parallel import spread
from ckptfs.engine.values import ComputedSegment, TensorValues
from ckptfs.cache.tiered import TieredCache, cache_key
from ckptfs.sources import ByteSource, SourcePool
from ckptfs.ahead.decode import Ahead
from ckptfs.engine.views import HeaderBodyView
from ckptfs.hffolder.weights import ParamSource
from ckptfs.quant.native import encode_bf16

#: --hf-dtype -> (safetensors dtype name, bytes per element)
DTYPES = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}
#: numpy dtype (no byte order) -> safetensors dtype name, for the non-float tensors served as stored
SAFETENSORS_NAMES = {"i1": "I8", "u1": "U8", "i2": "I16", "u2": "U16", "i4": "I32", "u4": "U32", "i8": "I64",
                     "u8": "U64", "b1": "BOOL"}


def bfloat16_bits(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest, ties to even; NaN -> 0xFFFF (torch CPU).
    By the C loop when the extension is built (one pass; into ``out`` when given), else numpy's
    (:func:`bfloat16_bits_numpy`, the reference the tests compare it with)."""
    values = np.ascontiguousarray(values, np.float32).reshape(-1)
    target = np.empty(values.size, np.uint16) if out is None else out
    if encode_bf16(values, target):
        return target
    if out is None:
        return bfloat16_bits_numpy(values)
    out[...] = bfloat16_bits_numpy(values)
    return out


def bfloat16_bits_numpy(values: np.ndarray) -> np.ndarray:
    """:func:`bfloat16_bits` in numpy (the fallback without the C extension, and its reference)."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16))
    out = rounded.astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        out[nan] = 0xFFFF
    return out


def convert(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values in the served dtype's bit layout (a contiguous array)."""
    if dtype == "bfloat16":
        return bfloat16_bits(values)
    if dtype == "float16":
        with np.errstate(over="ignore", invalid="ignore"):
            half = values.astype(np.float16)
        nan = np.isnan(values)
        if nan.any():  # torch sets the quiet bit of a NaN (numpy keeps a signalling one signalling)
            half.view(np.uint16)[nan] |= np.uint16(0x0200)
        return half
    return np.ascontiguousarray(values, np.float32)


class ParamData:
    """The served bytes of one parameter, in cached groups of rows.

    A parameter served as its float32 values untouched reads through the block engine like a .npy. Any other
    (a transform, or bfloat16/float16) is produced in *served groups* of about ``GROUP_TARGET_BYTES``: whole
    output rows, decoded (uncached: the float32 values are needed once), transformed, converted, and cached as
    bytes under a key naming the dtype, the parameter and its maker (``key_tag``). Reads then only slice cached
    groups, and read-ahead (``SafetensorsView.ahead``) builds the next groups in the background, as it decodes
    a .npy's block groups.
    """

    def __init__(self, param: ParamSource, values: TensorValues, dtype: str, key_tag: str, cache: TieredCache,
                 sources: SourcePool | None = None):
        """``values``: the parameter's stored values by element range, float32 for a float parameter (a GGUF
        tensor's ``TensorData``, a quantized layer's view), or a non-float tensor's own values, which are
        served as stored; ``key_tag``: what its served groups' cache keys say they are made by (hf/ of a GGUF
        names transformers' version, whose tables the transforms come from); ``cache``: the checkpoint's;
        ``sources``: its pool, from which a tensor stored in the served layout already (a BF16 tensor served as
        bfloat16, untransformed) is served byte for byte, with no conversion and no cache."""
        self.param = param
        self.dtype = dtype
        self.data = values
        self.st_dtype, self.itemsize = DTYPES[dtype]
        floating = values.dtype.kind == "f"
        if not floating:  # an integer or boolean tensor of the release keeps its type (a buffer of indices)
            self.st_dtype, self.itemsize = SAFETENSORS_NAMES[values.dtype.str.lstrip("<>|=")], values.dtype.itemsize
        self._cache = cache
        self.n_elements = values.n_elements
        self.nbytes = self.n_elements * self.itemsize
        self.rows = param.shape[0] if len(param.shape) > 1 else 1
        self.row_elements = self.n_elements // self.rows if self.rows else 0
        plain = param.row_order is None and param.value_map is None
        self.passthrough = not floating or (dtype == "float32" and plain)
        info = values.info
        self._sources = sources
        self.stored = (sources is not None and floating and plain and info.storage_type == self.st_dtype
                       and info.byte_order == "<" and info.stored_nbytes == self.nbytes)
        self._source, self._offset = info.source, info.offset
        self.group_rows = max(1, GROUP_TARGET_BYTES // max(1, self.row_elements * self.itemsize))
        self.group_bytes = self.group_rows * self.row_elements * self.itemsize
        self._key_tag = f"{key_tag}:{dtype}:{param.name}"
        self._key_prefix: tuple[str, int, str, str] | None = None

    def _stored_source(self) -> ByteSource:
        assert self._sources is not None  # self.stored says so
        return self._sources.get(self._source)

    def rows_f32(self, r0: int, r1: int, *, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        """Output rows [r0, r1) in float32, flat, transforms applied."""
        c = self.row_elements
        order = self.param.row_order
        if order is None:
            values = self.data.read(r0 * c, r1 * c, use_cache=False, scope=scope)
        else:
            src = order[r0:r1]
            lo, hi = int(src.min()), int(src.max()) + 1
            values = self.data.read(lo * c, hi * c, use_cache=False, scope=scope).reshape(hi - lo, c)[src - lo]
            values = values.reshape(-1)
        if self.param.value_map is not None:
            values = self.param.value_map(values.reshape(r1 - r0, c) if len(self.param.shape) > 1 else values)
            values = np.asarray(values, np.float32).reshape(-1)
        return values

    def plain_segment(self) -> tuple[object, int] | None:
        """The parameter's bytes as one piece a mount reads in C (``View.plain_segments``): a tensor stored as
        served (its source, its offset), one served as its stored bytes (a type read as it is), or a
        view computed from its codes with no transform (a :class:`ComputedSegment` of its codes, rounded once to the
        served dtype in C as ``convert`` rounds it); None for any other (decoded, transformed: Python's)."""
        data = self.data
        if self.stored:
            return self._stored_source(), self._offset
        if isinstance(data, TensorData):
            return (data.source, data.info.offset) if self.passthrough and data.direct else None
        if self.param.row_order is not None or self.param.value_map is not None or data.dtype != np.float32:
            return None
        codes = data.computed_codes()
        return None if codes is None else (ComputedSegment(codes, self.dtype), codes.offset)

    def _key(self, g: int) -> str:
        if self._key_prefix is None:
            info = self.data.info
            self._key_prefix = (self.data.content_id(), info.offset, info.storage_type, self._key_tag)
        r0 = g * self.group_rows
        return cache_key(*self._key_prefix, r0, min(self.rows, r0 + self.group_rows))

    def _served_group(self, g: int, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        return self._cache.get_or_load(self._key(g), lambda: self._built(g, scope))

    def decode_group(self, g: int, scope: ReadScope = NOTHING_SAID) -> None:
        """Build served group ``g`` into the cache unless it is there (read-ahead)."""
        if self._key(g) not in self._cache:
            self._served_group(g, scope)

    def bytes_into(self, b0: int, target: np.ndarray, keep: bool = True, *, scope: ReadScope = NOTHING_SAID) -> None:
        """Bytes [b0, b0 + len(target)) of the served values written into ``target`` (uint8; a mount's reply
        buffer): served groups the range covers whole are built straight there, spread over the cores (with
        ``keep`` a copy is cached), the groups its ends cut come from the cache."""
        b1 = b0 + len(target)
        if self.stored:
            self._stored_source().pread_into(self._offset + b0, target.data, scope=scope)
            return
        if self.passthrough:
            self.data.bytes_into(b0, target, keep, scope=scope)
            return
        whole = []
        for g in range(b0 // self.group_bytes, (b1 - 1) // self.group_bytes + 1):
            lo, hi = g * self.group_bytes, min((g + 1) * self.group_bytes, self.nbytes)
            if lo >= b0 and hi <= b1:
                whole.append(g)
            else:
                a, b = max(b0, lo), min(b1, hi)
                target[a - b0: b - b0] = np.frombuffer(self._served_group(g, scope), np.uint8)[a - lo: b - lo]
        if not whole:
            return

        def out(g: int) -> np.ndarray:
            return target[g * self.group_bytes - b0: min((g + 1) * self.group_bytes, self.nbytes) - b0]

        def build(picked: list[int]) -> None:
            spread([functools.partial(self._build_into, whole[i], out(whole[i]), scope) for i in picked])

        self._cache.fill_into([(self._key(g), out(g)) for g in whole], build,
                              lambda i: self._built(whole[i], scope), keep)

    def _built(self, g: int, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        r0 = g * self.group_rows
        return convert(self.rows_f32(r0, min(self.rows, r0 + self.group_rows), scope=scope),
                       self.dtype).view(np.uint8)

    def _build_into(self, g: int, out: np.ndarray, scope: ReadScope) -> None:
        """Served group ``g`` built into ``out`` (uint8, its size): bfloat16 encoded straight there."""
        r0 = g * self.group_rows
        values = self.rows_f32(r0, min(self.rows, r0 + self.group_rows), scope=scope)
        if self.dtype == "bfloat16":
            bfloat16_bits(values, out.view(np.uint16))
        else:
            out[...] = convert(values, self.dtype).view(np.uint8)

    def ahead(self, d0: int, d1: int, at: int) -> tuple[list, list]:
        """(ranges to advise, decoding jobs) for bytes [d0, d1) of this parameter, which starts at view
        offset ``at`` (see ``ckptfs.ahead.decode.Ahead``)."""
        data = self.data
        e0, e1 = d0 // self.itemsize, min(self.n_elements, -(-d1 // self.itemsize))
        if e1 <= e0:
            return [], []
        advise = [(data.info.source, *data.stored_range(e0, e1))]
        if self.stored:
            return [(self._source, self._offset + d0, d1 - d0)], []
        if self.passthrough:
            if data.direct:
                return advise, []
            group = data.group_blocks * data.info.block_elements
            return advise, [(at + min(self.nbytes, (g + 1) * group * 4), group * 4,
                             functools.partial(data.decode_group, g))
                            for g in range(data.group_of_element(e0), data.group_of_element(e1 - 1) + 1)]
        return advise, [(at + min(self.nbytes, (g + 1) * self.group_bytes), self.group_bytes,
                         functools.partial(self.decode_group, g))
                        for g in range(d0 // self.group_bytes, (d1 - 1) // self.group_bytes + 1)]


def build_header(params: list[ParamData], metadata: dict[str, str] | None = None) -> bytes:
    """The length prefix and JSON header; data offsets follow ``params`` in order."""
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for p in params:
        header[p.param.name] = {"dtype": p.st_dtype, "shape": list(p.param.shape),
                                "data_offsets": [offset, offset + p.nbytes]}
        offset += p.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


class SafetensorsView(HeaderBodyView):
    """A safetensors file of an hf/ folder: ``params`` in order (model.safetensors of a GGUF, a shard of a
    quantized folder's release)."""

    reads_ahead = True

    def __init__(self, params: list[ParamData]):
        self.params = params
        self.header = build_header(self.params)
        self.starts = []  # where each parameter's bytes start in the body (after the header)
        pos = 0
        for p in self.params:
            self.starts.append(pos)
            pos += p.nbytes
        self.size = len(self.header) + pos

    def _covering(self, d0: int, d1: int):
        """(body offset, ParamData) of the parameters overlapping body bytes [d0, d1)."""
        i = max(0, bisect.bisect_right(self.starts, d0) - 1)
        while i < len(self.params) and self.starts[i] < d1:
            yield self.starts[i], self.params[i]
            i += 1

    def plain_segments(self) -> list[tuple[int, int, object, int]] | None:
        """The header, then each parameter's piece (``ParamData.plain_segment``), when every one has one: such
        a file is read in C (a quantized folder's release of scaled-codes layers and BF16 tensors)."""
        hlen = len(self.header)
        segments: list[tuple[int, int, object, int]] = [(0, hlen, self.header, 0)]
        for start, p in zip(self.starts, self.params):
            if p.nbytes == 0:
                continue
            piece = p.plain_segment()
            if piece is None:
                return None
            segments.append((hlen + start, p.nbytes, *piece))
        return segments

    def body_into(self, d0: int, target: np.ndarray, keep: bool = True, scope: ReadScope = NOTHING_SAID) -> None:
        d1 = d0 + len(target)
        for start, p in self._covering(d0, d1):
            lo, hi = max(d0, start), min(d1, start + p.nbytes)
            p.bytes_into(lo - start, target[lo - d0: hi - d0], keep, scope=scope)


    def ahead(self, start: int, stop: int) -> Ahead:
        """The stored blocks behind bytes [start, stop), and the groups that serve them as decoding jobs."""
        hlen = len(self.header)
        advise, jobs = [], []
        for pstart, p in self._covering(max(0, start - hlen), max(0, stop - hlen)):
            more_advise, more_jobs = p.ahead(max(0, start - hlen - pstart), min(p.nbytes, stop - hlen - pstart),
                                             hlen + pstart)
            advise += more_advise
            jobs += more_jobs
        return Ahead(tuple(advise), tuple(jobs))
