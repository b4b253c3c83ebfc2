"""A virtual safetensors file: header from the GGUF header alone, data decoded per read.

Layout (safetensors' format): u64 little-endian header length N, N bytes of JSON (padded with spaces to a
multiple of 8, as the safetensors writer pads), then each tensor's bytes back to back, C order. The header
is known without decoding anything: names, shapes and the served dtype fix every offset.

A read of bytes [a, b) of one parameter decodes only the GGUF rows behind it (through the block engine and
its cache), applies the parameter's row order and value map (weights.py) in float32 — transformers' loader
works in float32 too — and converts to the served dtype: bfloat16 rounded to nearest-even exactly as
``torch.Tensor.to(torch.bfloat16)`` does on CPU (NaN becomes 0xFFFF as torch writes it), float16 with
numpy's IEEE rounding (torch's too; a NaN gets its quiet bit set, as torch sets it). A float32 parameter
stored as F32 with no transform is served straight from the stored bytes, as a ``.npy`` is.
"""

from __future__ import annotations

import bisect
import functools
import json
import struct

import numpy as np

from ..blocks import TensorData
from ..checkpoint import Checkpoint
from ..views import Ahead, View, header_and_body
from .weights import ParamSource

#: --hf-dtype -> (safetensors dtype name, bytes per element)
DTYPES = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest, ties to even; NaN -> 0xFFFF (torch CPU)."""
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
    """The served bytes of one parameter, produced by row range."""

    def __init__(self, param: ParamSource, checkpoint: Checkpoint, dtype: str):
        self.param = param
        self.dtype = dtype
        self.st_dtype, self.itemsize = DTYPES[dtype]
        tensor = param.tensor
        self.data = TensorData(tensor.info, tensor.codec, np.float32, checkpoint.sources, checkpoint.cache)
        self.n_elements = tensor.info.n_elements
        self.nbytes = self.n_elements * self.itemsize
        self.rows = param.shape[0] if len(param.shape) > 1 else 1
        self.row_elements = self.n_elements // self.rows if self.rows else 0
        self.passthrough = (dtype == "float32" and param.row_order is None and param.value_map is None)

    def rows_f32(self, r0: int, r1: int) -> np.ndarray:
        """Output rows [r0, r1) in float32, flat, transforms applied."""
        c = self.row_elements
        order = self.param.row_order
        if order is None:
            values = self.data.read(r0 * c, r1 * c)
        else:
            src = order[r0:r1]
            lo, hi = int(src.min()), int(src.max()) + 1
            values = self.data.read(lo * c, hi * c).reshape(hi - lo, c)[src - lo].reshape(-1)
        if self.param.value_map is not None:
            values = self.param.value_map(values.reshape(r1 - r0, c) if len(self.param.shape) > 1 else values)
            values = np.asarray(values, np.float32).reshape(-1)
        return values

    def segments(self, b0: int, b1: int) -> list:
        """Bytes [b0, b1) of the served values, as buffers to join."""
        b0, b1 = max(0, b0), min(b1, self.nbytes)
        if b1 <= b0:
            return []
        if self.passthrough:
            return self.data.byte_segments(b0, b1)
        item, c = self.itemsize, self.row_elements
        e1 = -(-b1 // item)
        r0, r1 = b0 // item // c, min(self.rows, -(-e1 // c))
        served = convert(self.rows_f32(r0, r1), self.dtype)
        start = b0 - r0 * c * item
        return [memoryview(served.view(np.uint8))[start: start + b1 - b0]]


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


class SafetensorsView(View):
    """model.safetensors of the hf/ folder."""

    reads_ahead = True

    def __init__(self, params: list[ParamSource], checkpoint: Checkpoint, dtype: str):
        if dtype not in DTYPES:
            raise ValueError(f"hf dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        self.params = [ParamData(p, checkpoint, dtype) for p in params]
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

    def body_segments(self, d0: int, d1: int) -> list:
        parts: list = []
        for start, p in self._covering(d0, d1):
            parts += p.segments(max(d0, start) - start, min(d1, start + p.nbytes) - start)
        return parts

    def read(self, offset: int, size: int) -> bytes:
        offset, size = self._clip(offset, size)
        return header_and_body(self.header, offset, offset + size, self.body_segments) if size else b""

    def ahead(self, start: int, stop: int) -> Ahead:
        """The stored blocks and the block groups behind bytes [start, stop) (see NpyView.ahead)."""
        hlen = len(self.header)
        advise, jobs = [], []
        for pstart, p in self._covering(max(0, start - hlen), max(0, stop - hlen)):
            item, data = p.itemsize, p.data
            e0 = max(0, start - hlen - pstart) // item
            e1 = min(p.n_elements, -(-(stop - hlen - pstart) // item))
            if e1 <= e0:
                continue
            advise.append((data.info.source, *data.stored_range(e0, e1)))
            if data.direct:
                continue
            group_elements = data.group_blocks * data.info.block_elements
            for g in range(data.group_of_element(e0), data.group_of_element(e1 - 1) + 1):
                until = hlen + pstart + min(p.nbytes, (g + 1) * group_elements * item)
                jobs.append((until, group_elements * 4, functools.partial(data.prefetch_group, g)))
        return Ahead(tuple(advise), tuple(jobs))
