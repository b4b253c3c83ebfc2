"""What every packed scheme provides: a validated layer layout that decodes rows of its weight.

A scheme module (``gptq``, ``awq``, ``compressed``) turns one layer's stored parts and the checkpoint's
quantization settings into a :class:`Layout`, or raises :class:`Absent` with the one-line reason the view
cannot be offered (a shape that does not match the settings, a missing part, an unsupported parameter).
Shapes are checked at open from the headers alone, so a view that is listed can be decoded.

``Layout.decode_rows(parts, o0, o1)`` returns rows ``[o0, o1)`` of the weight in the layout transformers
uses (``[out_features, in_features]``), as float32 holding exactly the values the scheme's reference
implementation computes. ``parts`` is a :class:`PartReader`-like object (``ckptfs.packed.views``): whole
parts and derived per-layer arrays come from the shared cache, row ranges straight from the source.
A scheme may also give a ``kernel``: the same rows through the optional C extension (``native.py``), chosen
per call like ``ckptfs.quant``'s kernels (``backend`` auto, numpy or native).

Layouts decode behind the engine's one decode door: this module registers them there as the "packed" parts
backend (``ckptfs.engine.decode.decode_parts``), which is what a packed view's tiles decode through.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.engine.decode import register_parts_backend
from ckptfs.engine.values import CodeValues
from ckptfs.packed.bits import f16_normal, scale_to_f32
from ckptfs.packed.detect import Absent
from ckptfs.packed.native import use_kernel


@dataclass(frozen=True)
class Context:
    """What a scheme's ``build`` may ask of the checkpoint besides the parts' headers: the values of small
    stored tensors (read at open: compressed-tensors' ``weight_shape``, bitsandbytes' ``quant_state``
    JSON), and the release's dtype (``torch_dtype``, None when the config names none)."""

    small_ints: Callable[[TensorInfo], tuple[int, ...]]
    small_bytes: Callable[[TensorInfo, int], bytes]
    torch_dtype: str | None = None


class Parts(Protocol):  # what decode_rows reads through (ckptfs.packed.views.PartReader)
    def whole(self, role: str) -> np.ndarray: ...
    def read_whole(self, role: str) -> np.ndarray: ...
    def rows(self, role: str, r0: int, r1: int) -> np.ndarray: ...
    def flat_rows(self, role: str, r0: int, r1: int, width: int) -> np.ndarray: ...
    def source_of(self, role: str) -> object: ...
    def derived(self, what: str, roles: tuple[str, ...], shape: tuple[int, ...],
                build: Callable[[], np.ndarray]) -> np.ndarray: ...


@dataclass
class Layout:
    """One quantized linear layer: its parts, its weight's shape and how to decode rows of it."""

    scheme: str                                 # the Scheme id: "gptq", "fp8", "compressed-tensors", ...
    parameters: dict[str, Any]                  # what meta.json shows: bits, group_size, block, ...
    out_features: int
    in_features: int
    parts: dict[str, TensorInfo]                # role ("qweight", "scales", ...) -> stored tensor
    scale_type: str                             # F16 | BF16 | F32: the dtype the reference computes in
    decode: Callable[[Parts, int, int, np.ndarray | None], np.ndarray]
    row_align: int = 1                          # row tiles start at multiples of this
    # a read that cuts a tile decodes the rows it touches in one call: for gpt-oss' experts, whose every
    # call sweeps all of an expert's stored rows (a view row is a stored column) and whose kernel starts
    # inside a 32-row block column; straight into the read's buffer by ``window`` where it takes the call,
    # else into a scratch array whose bytes are copied. Otherwise the row_align runs wholly inside are
    # decoded into place and the (at most two) the ends cut by calls of their own.
    cut_in_one_call: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    # the same rows through the C kernel, into a float32/float16 buffer; False when it cannot take the call
    kernel: Callable[[Parts, int, int, np.ndarray], bool] | None = None
    # with cut_in_one_call: window(parts, o0, o1, skip, out) writes values [skip, skip + out.size) of rows
    # [o0, o1) (flattened) into out through the C kernel, the cut rows' other values left out; False when
    # it cannot take the call
    window: Callable[[Parts, int, int, int, np.ndarray], bool] | None = None
    # the view's shape when it is not [out_features, in_features] (gpt-oss experts [E, in, out]): rows are
    # then the flattened leading axes, prod(view_shape[:-1]) == out_features, view_shape[-1] == in_features
    view_shape: tuple[int, ...] | None = None
    # the values as codes a mount computes in C per read (engine.values.CodeValues: one code byte times a
    # scale per block, or 4-bit codes two a byte times a scale per block); None where there is no such form
    computed_codes: Callable[[Parts], CodeValues | None] | None = None

    def __post_init__(self) -> None:
        shape = self.view_shape
        if shape is not None and (not shape or shape[-1] != self.in_features
                                  or math.prod(shape[:-1]) != self.out_features):
            raise Absent(f"view shape {list(shape)} does not hold {self.out_features} rows of {self.in_features}")

    @property
    def shape(self) -> tuple[int, ...]:
        if self.view_shape is not None:
            return self.view_shape
        return self.out_features, self.in_features

    def decode_rows(self, parts: Parts, o0: int, o1: int, out: np.ndarray | None = None,
                    backend: str | None = None) -> np.ndarray:
        """Rows [o0, o1) as ``[o1 - o0, in_features]``: written into ``out`` (float32 or float16, that many
        elements, C-contiguous) and returned as a view of it when given, else a new float32 array.

        ``backend``: None or "auto" (the C kernel where built and the scheme has one, else numpy), "numpy"
        (the reference), "native" (the kernel; ValueError where there is none). A call the kernel does not
        take is decoded by numpy."""
        shape = (o1 - o0, self.in_features)
        kernel = self.kernel
        if use_kernel(backend, kernel is not None) and kernel is not None:
            dest = out if out is not None else np.empty(shape, np.float32)
            if kernel(parts, o0, o1, dest):
                return dest.reshape(shape)
        direct = out if out is not None and out.dtype == np.float32 else None
        values = self.decode(parts, o0, o1, direct)
        if out is None:
            return values
        if not np.may_share_memory(values, out):  # a new array (float16 out, or a fallback rounding)
            with np.errstate(over="ignore"):
                np.copyto(out.reshape(shape), values.reshape(shape), casting="unsafe")  # beyond fp16: inf
        return out.reshape(shape)


class LayoutRows:
    """The "packed" parts backend of ``ckptfs.engine.decode``: a layer's rows by its :class:`Layout`."""

    def decode_rows(self, layout: Layout, parts: Parts, o0: int, o1: int, out: np.ndarray | None,
                    backend: str | None) -> np.ndarray:
        return layout.decode_rows(parts, o0, o1, out, backend)


register_parts_backend("packed", LayoutRows())


# ------------------------------------------------------------------------------------------ header checks

INT32_TYPES = ("I32", "U32")
INT_TYPES = ("I8", "U8", "I16", "I32", "I64", "U16", "U32", "U64")
SCALE_TYPES = ("F16", "BF16", "F32")


def require(parts: Mapping[str, TensorInfo], role: str, prefix: str) -> TensorInfo:
    info = parts.get(role)
    if info is None:
        raise Absent(f"part {prefix}.{role} is missing")
    if info.damaged:
        raise Absent(f"part {info.name} is damaged: {info.damaged}")
    return info


def check_type(info: TensorInfo, allowed: tuple[str, ...]) -> None:
    if info.storage_type not in allowed:
        raise Absent(f"{info.name} is stored as {info.storage_type} (expected {' or '.join(allowed)})")
    if info.byte_order != "<":
        raise Absent(f"{info.name} is big-endian")


def check_shape(info: TensorInfo, expected: tuple[int, ...], why: str) -> None:
    if tuple(info.shape) != tuple(expected):
        raise Absent(f"{info.name} has shape {list(info.shape)}, {why} expects {list(expected)}")


def check_ndim(info: TensorInfo, ndim: int) -> None:
    if len(info.shape) != ndim:
        raise Absent(f"{info.name} has shape {list(info.shape)} (expected {ndim} dimensions)")


def int_setting(settings: Mapping[str, Any], *keys: str, default: Any = None) -> int:
    """The first of ``keys`` present in ``settings``, as an int (Absent when it is not one)."""
    for key in keys:
        if key in settings and settings[key] is not None:
            value = settings[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
                raise Absent(f"quantization setting {key}={value!r} is not an integer")
            return int(value)
    if default is None:
        raise Absent(f"quantization setting {keys[0]} is missing")
    return default


def group_index_fast(q: np.ndarray, zeros: np.ndarray, scales: np.ndarray, group_size: int,
                     out: np.ndarray | None = None) -> np.ndarray:
    """``(q - zeros[:, i // gs]) * scales[:, i // gs]`` for ``q[rows, in]`` and per-group ``zeros``/``scales``
    ``[rows, groups]`` (float32), without materializing the per-column gathers (the last group may be short);
    into ``out`` (float32, ``rows * in`` elements) when given."""
    rows, width = q.shape
    groups = zeros.shape[1]
    full = width // group_size
    result = out.reshape(rows, width) if out is not None else np.empty((rows, width), np.float32)
    if full:
        body = result[:, :full * group_size].reshape(rows, full, group_size)
        np.copyto(body, q[:, :full * group_size].reshape(rows, full, group_size))
        body -= zeros[:, :full, None]
        body *= scales[:, :full, None]
    if full < groups and full * group_size < width:
        tail = result[:, full * group_size:]
        np.copyto(tail, q[:, full * group_size:])
        tail -= zeros[:, full, None]
        tail *= scales[:, full, None]
    return result


def gathered(q: np.ndarray, zeros: np.ndarray, scales: np.ndarray, g: np.ndarray,
             out: np.ndarray | None = None) -> np.ndarray:
    """``(q - zeros[:, g]) * scales[:, g]`` for any group index ``g[in]`` (GPTQ's ``desc_act``)."""
    result = out.reshape(q.shape) if out is not None else np.empty(q.shape, np.float32)
    np.subtract(q, zeros[:, g], out=result)
    result *= scales[:, g]
    return result


def f16_fast(parts: Parts, role: str, storage_type: str, max_factor: int) -> bool:
    """Whether ``round_to`` may round this layer's values on their bits (``bits.f16_normal`` of all its
    scales, checked once per layer and cached)."""
    if storage_type != "F16":
        return False
    flag = parts.derived(f"f16-normal:{max_factor}", (role,), (1,), lambda: np.array(
        [f16_normal(scale_to_f32(parts.whole(role), storage_type), max_factor)], np.int8))
    return bool(flag[0])
