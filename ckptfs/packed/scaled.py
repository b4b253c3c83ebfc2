"""Layers of one code per weight times a scale per block: the FP8 family and compressed-tensors' int8.

``W[..., i, j] = (code(w[..., i, j]) - z[..., i // bh, j // bw]) * s[..., i // bh, j // bw]`` evaluated in
float32, where ``code`` is the stored element's value (E4M3 through ``quant.floats``' table, an int8 as its
integer), ``s`` the scale widened exactly to float32 (F32, BF16, F16, or an E8M0 byte: ``2^(e - 127)``) and
``z`` the optional zero point. One geometry covers every strategy: a block ``bh x bw`` (DeepSeek's 128 x
128; partial at the edges: a 576 x 7168 weight has a 5 x 56 grid), a row (``bh = 1, bw = in``: per-channel),
a group (``bh = 1, bw = g``), the tensor (``bh = out, bw = in``); or, with ``g_idx``, the group of each
column. Leading axes (experts ``[E, out, in]``) have a grid each.

The product of a code and a scale is exact in float32 where both have few significant bits (E4M3's 4 and
a 16-bit float's 8 or 11; not for F32 scales, where the one float32 multiply is what the references do), so
rounding it once to a 16-bit release dtype gives what a reference computing in that dtype gives.

Rows are the flattened leading axes (``rows = prod(shape[:-1])``): a tile of rows reads only its rows' codes
and the (cached, small) scale grid. The C kernel (``_kernels.scaled_rows``) computes the same float32
values in one pass (no ``g_idx``); the numpy path is the reference and the fallback.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.engine.values import ScaledCodes
from ckptfs.packed import native
from ckptfs.packed.base import Absent, Layout, Parts, check_type, require
from ckptfs.packed.bits import scale_to_f32
from ckptfs.quant.floats import F8_E4M3_TABLE, F8_E5M2_TABLE, F8_E8M0_TABLE

#: what a code of each storage type is worth (None: its integer value)
CODE_TABLES: dict[str, np.ndarray | None] = {"F8_E4M3": F8_E4M3_TABLE, "F8_E5M2": F8_E5M2_TABLE, "I8": None}
#: every byte's value for the C kernel: the tables above, and an int8's integer
BYTE_TABLES = {"F8_E4M3": F8_E4M3_TABLE, "F8_E5M2": F8_E5M2_TABLE,
               "I8": np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float32)}
SCALE_TYPES = ("F32", "BF16", "F16", "F8_E8M0")
ZERO_TYPES = ("I8", "U8", "I16", "I32", "F16", "BF16", "F32")


def scale_values(values: np.ndarray, storage_type: str) -> np.ndarray:
    """Stored scales as exact float32: F32/F16/BF16 as ``bits.scale_to_f32``; E8M0 bytes (``F8_E8M0``, or
    U8 read as E8M0) through ``quant.floats``' table, 255 being NaN (the OCP rule)."""
    if storage_type in ("F8_E8M0", "U8"):
        return F8_E8M0_TABLE[values.astype(np.uint8)]
    if storage_type == "F8_E4M3":
        return F8_E4M3_TABLE[values.astype(np.uint8)]
    return scale_to_f32(values, storage_type)


@dataclass(frozen=True)
class Grid:
    """Which scale covers which weight: leading axes ``lead``, ``out x in`` per matrix, blocks ``bh x bw``."""

    lead: tuple[int, ...]
    out: int
    in_features: int
    bh: int
    bw: int

    @property
    def rows(self) -> tuple[int, int]:
        """The scale grid of one matrix: (ceil(out / bh), ceil(in / bw))."""
        return -(-self.out // self.bh), -(-self.in_features // self.bw)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.lead + self.rows

    def scale_rows(self, o0: int, o1: int) -> np.ndarray:
        """The row of the flattened scale grid ``[prod(lead) * gh, gw]`` each weight row [o0, o1) uses."""
        r = np.arange(o0, o1, dtype=np.int64)
        return (r // self.out) * self.rows[0] + (r % self.out) // self.bh


def grid_for(weight: TensorInfo, scale: TensorInfo, block: tuple[int, int] | None, why: str,
             loose: bool = False) -> Grid:
    """The grid of ``weight`` ``[*lead, out, in]`` and its ``scale``: ``block`` (bh, bw) given by the config
    (the scale must then be ``[*lead, ceil(out/bh), ceil(in/bw)]``), else told by the scale's shape: one
    element (per tensor, or per matrix ``[*lead, 1, 1]``), ``[*lead, out, 1]`` / ``[*lead, out]`` (per row),
    ``[*lead, out, in / g]`` (groups of ``g`` columns). ``loose``: with ``block``, axes of size 1 in the
    scale's shape do not count (fbgemm's expert scales ``[E, 1, N]`` and ``[E, N, 1]``)."""
    if len(weight.shape) < 2:
        raise Absent(f"{weight.name} has shape {list(weight.shape)} (expected at least 2 dimensions)")
    *lead_list, out, in_features = weight.shape
    lead = tuple(lead_list)
    if out <= 0 or in_features <= 0 or 0 in lead:
        raise Absent(f"{weight.name} has an empty shape {list(weight.shape)}")
    shape = tuple(scale.shape)
    if block is not None:
        bh, bw = block
        if bh <= 0 or bw <= 0:
            raise Absent(f"block size {list(block)} is not valid ({why})")
        grid = Grid(lead, out, in_features, bh, bw)
        if shape != grid.shape and not (loose and _squeezed(shape) == _squeezed(grid.shape)):
            raise Absent(f"{scale.name} has shape {list(shape)}, {why} block {bh}x{bw} of {weight.name} "
                         f"{list(weight.shape)} expects {list(grid.shape)}")
        return grid
    if math.prod(shape) == 1:
        return Grid(lead, out, in_features, out, in_features) if not lead else \
            _per_matrix(weight, scale, lead, out, in_features, why)
    if shape in (lead + (out, 1), lead + (out,)):
        return Grid(lead, out, in_features, 1, in_features)
    if len(shape) == len(lead) + 2 and shape[:-1] == lead + (out,) and shape[-1] > 0 \
            and in_features % shape[-1] == 0:
        return Grid(lead, out, in_features, 1, in_features // shape[-1])
    if math.prod(shape) == math.prod(lead) and lead:
        return Grid(lead, out, in_features, out, in_features)
    raise Absent(f"{scale.name} has shape {list(shape)}, which fits no {why} scale of {weight.name} "
                 f"{list(weight.shape)} (one, [out, 1] per row, [out, in/g] per group)")


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def _per_matrix(weight: TensorInfo, scale: TensorInfo, lead, out, in_features, why) -> Grid:
    raise Absent(f"{scale.name} holds one scale for the {math.prod(lead)} matrices of {weight.name} ({why})")


def build_scaled(scheme: str, prefix: str, parts: Mapping[str, TensorInfo], *, weight_role: str,
                 scale_role: str, code_types: tuple[str, ...], block: tuple[int, int] | None,
                 parameters: dict[str, Any], scale_types: tuple[str, ...] = SCALE_TYPES,
                 scale_as: str | None = None, zero_role: str | None = None, g_idx_role: str | None = None,
                 why: str = "the config's", loose: bool = False) -> Layout:
    """The layout of a scaled-codes layer (module docstring). ``scale_as``: read the scale bytes as this
    type (``"F8_E8M0"`` for U8 scales a config says are ue8m0)."""
    weight = require(parts, weight_role, prefix)
    scale = require(parts, scale_role, prefix)
    check_type(weight, code_types)
    check_type(scale, scale_types)
    grid = grid_for(weight, scale, block, why, loose)
    table = CODE_TABLES[weight.storage_type]
    scale_type = scale_as or scale.storage_type
    used = {weight_role: weight, scale_role: scale}
    zero = None
    if zero_role is not None and zero_role in parts:
        zero = require(parts, zero_role, prefix)
        check_type(zero, ZERO_TYPES)
        if math.prod(zero.shape) != math.prod(scale.shape):
            raise Absent(f"{zero.name} has shape {list(zero.shape)}, its scale {list(scale.shape)}")
        used[zero_role] = zero
    g_idx = None
    if g_idx_role is not None and g_idx_role in parts:
        g_idx = require(parts, g_idx_role, prefix)
        check_type(g_idx, ("I32", "I64", "I16"))
        if tuple(g_idx.shape) != (grid.in_features,) or grid.lead or grid.bh != 1:
            raise Absent(f"{g_idx.name} has shape {list(g_idx.shape)} (expected [{grid.in_features}] for "
                         f"groups of a 2-D weight)")
        used[g_idx_role] = g_idx
    flat_scale = (math.prod(grid.lead) * grid.rows[0], grid.rows[1])
    rows = math.prod(grid.lead) * grid.out
    parameters = {**parameters, "block": [grid.bh, grid.bw], "scale_grid": list(grid.shape),
                  "code_type": weight.storage_type, "scale_type": scale_type}

    def scales(reader: Parts) -> np.ndarray:
        return reader.derived(f"scaled:{scale_type}", (scale_role,), flat_scale,
                              lambda: scale_values(reader.whole(scale_role), scale_type).reshape(flat_scale))

    zrole, grole = zero_role or "", g_idx_role or ""

    def zeros(reader: Parts) -> np.ndarray:
        def build() -> np.ndarray:
            stored = reader.whole(zrole)
            floats = zero is not None and zero.storage_type in ("F16", "BF16", "F32")
            values = scale_values(stored, zero.storage_type) if floats and zero is not None else stored
            return values.astype(np.float32).reshape(flat_scale)
        return reader.derived("scaled:zero", (zrole,), flat_scale, build)

    def column_groups(reader: Parts) -> np.ndarray:
        def build() -> np.ndarray:
            values = reader.whole(grole).astype(np.int64)
            if values.size and (values.min() < 0 or values.max() >= grid.rows[1]):
                raise Absent(f"{prefix}.{grole} holds a group outside 0..{grid.rows[1] - 1}")
            return values
        return reader.derived("scaled:g_idx", (grole,), (grid.in_features,), build)

    def decode(reader: Parts, o0: int, o1: int, dest: np.ndarray | None) -> np.ndarray:
        n, width = o1 - o0, grid.in_features
        codes = reader.flat_rows(weight_role, o0, o1, width)
        values = dest.reshape(n, width) if dest is not None else np.empty((n, width), np.float32)
        if table is not None:
            np.take(table, codes, out=values)
        else:
            np.copyto(values, codes, casting="unsafe")
        srows = grid.scale_rows(o0, o1)
        s = scales(reader)[srows]                                   # [n, gw]
        z = zeros(reader)[srows] if zero is not None else None
        if g_idx is not None:
            g = column_groups(reader)
            if z is not None:
                values -= z[:, g]
            values *= s[:, g]
            return values
        _apply_blocks(values, s, z, grid.bw)
        return values

    byte_table = BYTE_TABLES[weight.storage_type]

    def kernel(reader: Parts, o0: int, o1: int, dest: np.ndarray) -> bool:
        if g_idx is not None:
            return False
        codes = reader.flat_rows(weight_role, o0, o1, grid.in_features)
        return native.scaled_rows(dest, codes, byte_table, scales(reader), grid.scale_rows(o0, o1), grid.bw,
                                  zeros(reader) if zero is not None else None)

    def codes(reader: Parts) -> ScaledCodes | None:
        if g_idx is not None:
            return None
        return ScaledCodes(reader.source_of(weight_role), weight.offset, rows, grid.in_features, byte_table,
                           scales(reader), zeros(reader) if zero is not None else None, grid.bw, grid.out,
                           grid.rows[0], grid.bh)

    return Layout(scheme, parameters, rows, grid.in_features, used, "F32", decode, kernel=kernel,
                  view_shape=tuple(weight.shape) if grid.lead else None, computed_codes=codes)


def _apply_blocks(values: np.ndarray, s: np.ndarray, z: np.ndarray | None, bw: int) -> None:
    """``values[r, j] = (values[r, j] - z[r, j // bw]) * s[r, j // bw]`` in place (the last block may be
    partial)."""
    n, width = values.shape
    full = width // bw
    if full:
        body = values[:, :full * bw].reshape(n, full, bw)
        if z is not None:
            body -= z[:, :full, None]
        body *= s[:, :full, None]
    if full * bw < width:
        tail = values[:, full * bw:]
        if z is not None:
            tail -= z[:, full, None]
        tail *= s[:, full, None]
