"""A packed layer's dequantized weight as a tensor-like object, decoded by tiles of output rows.

:class:`PackedTensor` is what ``checkpoint.tensors`` and ``checkpoint[PREFIX + ".weight"]`` hold for a view:
a ``ckptfs.Tensor`` (indexing, ``numpy()``, pickling, ``to_torch``) marked ``virtual`` (the mount gives it
``.npy`` and ``.meta.json``, no ``.raw``). Its :class:`PackedData` offers what ``NpyView`` and the read-ahead
use from a ``TensorData``: ``read`` (values) and ``bytes_into`` (a range of the served bytes: a mount's reads,
decoded straight into the reply), and groups (here: tiles of rows) to decode ahead.

A tile is ``rows_per_tile`` whole rows of the weight (about ``TILE_TARGET_BYTES`` of output), so a read
decodes only the tiles its bytes cover. Tiles go to the checkpoint's cache like GGUF block groups; so do the
per-layer arrays every tile needs (zero points unpacked, scales as float32, GPTQ's g_idx, and for GPTQ and
AWQ GEMM the ``qweight`` transposed: its columns are the weight's rows), under keys that start with the
content identity of the files holding the parts. Row-major parts (compressed-tensors, AWQ GEMV) are read
row range by row range instead.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ckptfs.cache.keys import CacheKey
from ckptfs.checkpoint.api import Tensor
from ckptfs.core.descriptors import TensorInfo
from ckptfs.core.errors import CheckpointError
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.engine.blocks import covering_groups, group_slices, range_into, spread_runs
from ckptfs.engine.decode import decode_parts
from ckptfs.engine.values import CodeValues, TensorValues
from ckptfs.engine.views import npy_header
from ckptfs.packed import native
from ckptfs.packed.base import Absent, Layout
from ckptfs.packed.native import use_kernel

TILE_TARGET_BYTES = 256 * 1024
WHOLE_STEP_BYTES = 1024 * 1024

#: numpy dtype of each stored part type (BF16 scales stay raw 16-bit patterns; ``bits`` widens them).
PART_DTYPES = {"I8": "i1", "U8": "u1", "I16": "<i2", "U16": "<u2", "I32": "<i4", "U32": "<u4", "I64": "<i8",
               "U64": "<u8", "F16": "<f2", "F32": "<f4", "BF16": "<u2",
               "F8_E4M3": "u1", "F8_E5M2": "u1", "F8_E8M0": "u1"}  # 8-bit floats as their codes


class PartReader:
    """Reads one layer's stored parts: whole (cached), by row range (not cached), and derived arrays; every
    read under one caller's scope (``under``: a mount's read's deadline, a stream decided above)."""

    def __init__(self, checkpoint, layout: Layout, name: str):
        self._ck = checkpoint
        self._layout = layout
        self._name = name
        self._ids: dict[str, str] = {}
        self._scope = NOTHING_SAID

    def under(self, scope: ReadScope) -> PartReader:
        """This reader for the reads of one caller who said ``scope`` (the layouts read their parts through
        the reader they are handed; the identities learnt are shared)."""
        if scope is self._scope:
            return self
        scoped = copy.copy(self)
        scoped._scope = scope
        return scoped

    def ident(self, roles) -> str:
        """The content identity of the parts ``roles`` (file identity and offset of each)."""
        out = []
        for role in roles:
            key = self._ids.get(role)
            if key is None:
                info = self._layout.parts[role]
                source_id = self._ck.sources.get(info.source).content_id()
                key = self._ids[role] = f"{source_id}@{info.offset}:{info.stored_nbytes}:{info.storage_type}"
            out.append(key)
        return "+".join(out)

    def source_of(self, role: str) -> object:
        """The byte source holding part ``role``."""
        return self._ck.sources.get(self._layout.parts[role].source)

    def _pread(self, info: TensorInfo, offset: int, size: int) -> bytes:
        try:
            return self._ck.sources.get(info.source).pread(info.offset + offset, size, scope=self._scope)
        except CheckpointError as exc:
            raise exc.about_tensor(f"{self._name} (part {info.name})") from None

    def whole(self, role: str) -> np.ndarray:
        """A whole (small) part, cached: zero points, scales, g_idx."""
        info = self._layout.parts[role]
        key = CacheKey(self.ident([role]), 0, "packed-part", PART_DTYPES[info.storage_type], 0, math.prod(info.shape))
        return self._ck.cache.get_or_load(key, lambda: self.read_whole(role).reshape(-1)).reshape(info.shape)

    def read_whole(self, role: str) -> np.ndarray:
        """A whole part, read now and not cached (what a derived array is built from)."""
        info = self._layout.parts[role]
        raw = self._pread(info, 0, info.stored_nbytes)
        return np.frombuffer(raw, PART_DTYPES[info.storage_type]).reshape(info.shape)

    def rows(self, role: str, r0: int, r1: int) -> np.ndarray:
        info = self._layout.parts[role]
        width = math.prod(info.shape[1:])
        dtype = np.dtype(PART_DTYPES[info.storage_type])
        raw = self._pread(info, r0 * width * dtype.itemsize, (r1 - r0) * width * dtype.itemsize)
        return np.frombuffer(raw, dtype).reshape((r1 - r0,) + tuple(info.shape[1:]))

    def flat_rows(self, role: str, r0: int, r1: int, width: int) -> np.ndarray:
        """Rows [r0, r1) of a part read as ``[-1, width]`` elements (a ``[E, out, in]`` weight's rows are
        its flattened leading axes), read now, not cached."""
        info = self._layout.parts[role]
        dtype = np.dtype(PART_DTYPES[info.storage_type])
        raw = self._pread(info, r0 * width * dtype.itemsize, (r1 - r0) * width * dtype.itemsize)
        return np.frombuffer(raw, dtype).reshape(r1 - r0, width)

    def derived(self, what: str, roles: tuple[str, ...], shape: tuple[int, ...],
                build: Callable[[], np.ndarray]) -> np.ndarray:
        key = CacheKey(self.ident(roles), 0, f"packed:{what}", "", 0, math.prod(shape))
        return self._ck.cache.get_or_load(key, lambda: np.ascontiguousarray(build()).reshape(-1)).reshape(shape)


class PackedData(TensorValues):
    """Decoded values of a packed layer's weight, by element range; its groups are tiles of rows."""

    direct = False
    group_blocks = 1  # read-ahead groups: one tile each (``info.block_elements`` is a tile's elements)
    decodes_into_reply = True  # the layouts decode rows into any float32/float16 buffer (``bytes_into``)
    backend: str | None = None  # Layout.decode_rows' choice: None/"auto", "numpy" or "native"

    def __init__(self, info: TensorInfo, layout: Layout, reader: PartReader, dtype: np.dtype, cache):
        self.info = info
        self.layout = layout
        self.dtype = np.dtype(dtype)
        self.n_elements = info.n_elements
        self.row_elements = layout.in_features
        self.rows_per_tile = info.block_elements // layout.in_features
        self._reader = reader
        self._cache = cache
        self._key_prefix: CacheKey | None = None

    @property
    def n_tiles(self) -> int:
        return -(-self.layout.out_features // self.rows_per_tile)

    # a tile is a "block" (``info.block_elements`` is a tile's elements) and a group of one block
    n_blocks = n_tiles

    def available_blocks(self) -> int:
        """Every tile: a layer whose parts are not all there gets no view (``ckptfs.packed.attach``)."""
        return self.n_tiles

    def present_blocks(self, e0: int, e1: int) -> tuple[int, int]:
        """The tiles covering elements [e0, e1) (every tile is there)."""
        be = self.info.block_elements
        return e0 // be, min(-(-e1 // be), self.n_tiles)

    def content_id(self) -> str:
        """The identities of every part the values are computed from (files, offsets, sizes, types)."""
        return self._reader.ident(tuple(self.layout.parts))

    def _decode(self, o0: int, o1: int, out: np.ndarray | None = None, *, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        """Rows [o0, o1) as flat ``self.dtype`` values, into ``out`` when given (a float16 view gets its
        buffer here, so that the C kernel writes float16 straight into it)."""
        if out is None and self.dtype != np.float32:
            out = np.empty((o1 - o0) * self.row_elements, self.dtype)
        try:
            values = decode_parts("packed", self.layout, self._reader.under(scope), o0, o1, out, self.backend)
        except Absent as exc:  # a fact only the stored values reveal (a g_idx out of range)
            marker = next(iter(self.layout.parts.values()))
            raise CheckpointError(marker.source, marker.offset, f"tensor {self.info.name!r}: {exc}") from None
        return values.reshape(-1)

    def _key(self, t: int) -> CacheKey:
        if self._key_prefix is None:
            self._key_prefix = CacheKey(self.content_id(), 0,
                                        f"packed:{self.layout.scheme}", f"{self.dtype.str}/{self.rows_per_tile}", 0, 0)
        o0 = t * self.rows_per_tile
        return self._key_prefix.with_range(o0, min(o0 + self.rows_per_tile, self.layout.out_features))

    def _tile(self, t: int, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        return self._cache.get_or_load(self._key(t), lambda: self._decode_tile(t, scope))

    def _decode_tile(self, t: int, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        o0 = t * self.rows_per_tile
        return self._decode(o0, min(o0 + self.rows_per_tile, self.layout.out_features), scope=scope)

    def _segments(self, e0: int, e1: int, scope: ReadScope) -> list[np.ndarray]:
        return group_slices(lambda t: self._tile(t, scope), self.info.block_elements, e0, e1)

    def read(self, e0: int, e1: int, use_cache: bool = True, *, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        """Elements [e0, e1) of the flattened weight; ``use_cache=False`` (whole-tensor reads) decodes in
        large aligned steps straight into the result instead of filling the cache with tiles."""
        e0, e1 = max(0, e0), min(e1, self.n_elements)
        if e1 <= e0:
            return np.empty(0, self.dtype)
        if use_cache:
            segments = self._segments(e0, e1, scope)
            return segments[0] if len(segments) == 1 else np.concatenate(segments)
        row, align = self.row_elements, self.layout.row_align
        r0, r1 = e0 // row // align * align, -(-e1 // row)
        step = max(align, WHOLE_STEP_BYTES // (row * self.dtype.itemsize) // align * align)
        out = np.empty((r1 - r0) * row, self.dtype)
        for start in range(r0, r1, step):
            stop = min(start + step, r1)
            self._decode(start, stop, out=out[(start - r0) * row:(stop - r0) * row], scope=scope)
        return out[e0 - r0 * row: e1 - r0 * row]

    def bytes_into(self, d0: int, target: np.ndarray, keep: bool = True, *, scope: ReadScope = NOTHING_SAID) -> None:
        """Bytes [d0, d0 + len(target)) of the values written into ``target`` (a mount's reply buffer): the
        tiles the range covers whole decoded straight there by the layout (``decode_rows(..., out=)``), runs
        of them spread over the cores, a copy of each cached only with ``keep``; of a tile the range's ends
        cut, the part inside is sliced from the cache when the tile is there (or waited for while another
        reader decodes it), else only the rows under it are decoded, into place (``_rows_into``)."""
        item = self.dtype.itemsize
        tile_bytes, end = self.info.block_elements * item, self.n_elements * item
        d1 = min(d0 + len(target), end)
        if d1 <= d0:
            return
        if not keep and self._none_at_hand(d0 // tile_bytes, (d1 - 1) // tile_bytes + 1):
            # a stream's request: nothing to copy from the cache and nothing to keep, so its rows are decoded
            # into the reply in as few calls as the layout allows, not tile by tile (a 1 MiB request cuts a
            # tile at each end: two calls each, and the whole tiles between them two more)
            self._rows_into(d0, d1, target[:d1 - d0], scope, spread=True)
            self._cache.count_decoded(d1 - d0)
            return
        whole, cut = covering_groups(d0, d1, tile_bytes, end)
        for t, a, b in cut:
            self._part_into(t, a, b, target[a - d0: b - d0], scope)
        if not whole:
            return
        rows, out_rows = self.rows_per_tile, self.layout.out_features

        def out(t0: int, t1: int | None = None) -> np.ndarray:
            """The place of tiles t0..t1 (inclusive; t1 = t0 by default) in ``target``, as served values."""
            stop = min(((t0 if t1 is None else t1) + 1) * tile_bytes, end)
            return target[t0 * tile_bytes - d0: stop - d0].view(self.dtype)

        def run_into(t0: int, t1: int) -> None:
            self._decode(t0 * rows, min((t1 + 1) * rows, out_rows), out(t0, t1), scope=scope)

        self._cache.fill_into([(self._key(t), out(t)) for t in whole],
                              lambda picked: spread_runs([whole[i] for i in picked], run_into),
                              lambda i: self._decode_tile(whole[i], scope), keep)

    def _part_into(self, t: int, a: int, b: int, target: np.ndarray, scope: ReadScope) -> None:
        """Bytes [a, b) of the values, all in tile ``t`` but not the whole of it, written into ``target``. The
        tile is looked up once; with disk/Redis tiers it goes through them (what another process decoded is
        not decoded again)."""
        key = self._key(t)
        values = self._cache.memory.get(key)
        if values is None and (self._cache.shared_tiers or self._cache.pending(key)):
            values = self._tile(t, scope)
        if values is not None:
            lo = t * self.info.block_elements * self.dtype.itemsize
            target[:] = values.view(np.uint8)[a - lo: b - lo]
            return
        self._rows_into(a, b, target, scope)

    def _none_at_hand(self, t0: int, t1: int) -> bool:
        """Whether none of tiles [t0, t1) is in the memory cache or being decoded by another reader, and there
        are no shared tiers (which another process may have filled)."""
        cache = self._cache
        return not cache.shared_tiers and not any(
            self._key(t) in cache or cache.pending(self._key(t)) for t in range(t0, t1))

    def _rows_into(self, a: int, b: int, target: np.ndarray, scope: ReadScope, spread: bool = False) -> None:
        """Bytes [a, b) decoded without the cache: the runs of ``row_align`` rows wholly inside straight into
        ``target`` (``spread``: cut in parts decoded on every core, ``spread_runs``), the (at most two) the
        ends cut through a scratch array (``range_into``); with the layout's ``cut_in_one_call``, every row
        the range touches in one call, into ``target`` (whole rows, or any whole values by the layout's
        ``window``; else through a scratch array)."""
        align, out_rows = self.layout.row_align, self.layout.out_features
        unit = align * self.row_elements
        if self.layout.cut_in_one_call:
            row_bytes = self.row_elements * self.dtype.itemsize
            r0, r1 = a // row_bytes, -(-b // row_bytes)
            if a == r0 * row_bytes and b == min(r1, out_rows) * row_bytes:
                self._decode(r0, r1, target.view(self.dtype), scope=scope)
            elif not self._window_into(a, r0, r1, target, scope):
                target[:] = self._decode(r0, r1, scope=scope).view(np.uint8)[a - r0 * row_bytes: b - r0 * row_bytes]
            return

        def decode(u0: int, u1: int, out: np.ndarray | None = None) -> np.ndarray:
            if out is None or not spread or u1 - u0 < 2:
                return self._decode(u0 * align, min(u1 * align, out_rows), out, scope=scope)

            def run_into(g0: int, g1: int) -> None:  # units g0..g1 (inclusive) into their place in ``out``
                assert out is not None
                self._decode(g0 * align, min((g1 + 1) * align, out_rows), out[(g0 - u0) * unit:(g1 + 1 - u0) * unit],
                             scope=scope)

            spread_runs(list(range(u0, u1)), run_into)
            return out

        range_into(a, b, target, unit * self.dtype.itemsize, self.dtype, decode)

    def _window_into(self, a: int, r0: int, r1: int, target: np.ndarray, scope: ReadScope) -> bool:
        """Bytes [a, a + len(target)) of rows [r0, r1) written in place by the layout's ``window`` kernel,
        when the range is whole values: no scratch rows and no copy. False when it cannot (no window
        kernel, the numpy backend, a range cut inside a value): the caller decodes the rows whole."""
        item, window = self.dtype.itemsize, self.layout.window
        if window is None or a % item or len(target) % item or not use_kernel(self.backend, True):
            return False
        return window(self._reader.under(scope), r0, r1, a // item - r0 * self.row_elements, target.view(self.dtype))

    # read-ahead (ckptfs.ahead.decode) treats tiles as block groups
    def group_of_element(self, e: int) -> int:
        return e // self.info.block_elements

    def decode_group(self, g: int, scope: ReadScope = NOTHING_SAID) -> None:
        if 0 <= g < self.n_tiles and self._key(g) not in self._cache:
            self._tile(g, scope)

    def prime(self) -> None:
        """Nothing: a view's decode runs through the layout's kernels, primed by the first tile it decodes."""

    def computed_codes(self) -> CodeValues | None:
        """The layout's codes a mount computes in C (FP8, int8, NVFP4, MXFP4, bitsandbytes 4-bit), unless shared tiers are on: their decoded tiles
        are what another daemon reads, so reads keep going through the cache that fills them; nor with the C
        kernels off (``CKPTFS_NO_NATIVE=1``, the numpy backend): then every value comes from the reference."""
        if self.layout.computed_codes is None or self._cache.shared_tiers or self.backend == "numpy" \
                or not native.available():
            return None
        return self.layout.computed_codes(self._reader)

    def stored_range(self, e0: int, e1: int) -> tuple[int, int]:
        """(file offset, size) of the marker part's bytes in proportion to the rows asked for: a hint for the
        kernel's read-ahead only (the transposed layouts need the whole part, which is then cached)."""
        info = self.layout.parts[next(iter(self.layout.parts))]
        frac0, frac1 = max(0, e0) / max(1, self.n_elements), min(e1, self.n_elements) / max(1, self.n_elements)
        start = int(info.stored_nbytes * frac0)
        return info.offset + start, max(0, int(info.stored_nbytes * frac1) - start)


class PackedTensor(Tensor):
    """The dequantized weight of one quantized layer (a virtual tensor), ``[out_features, in_features]`` or
    the layout's ``view_shape``."""

    virtual = True

    def __init__(self, checkpoint, layout: Layout, name: str, index: int, origin: str,
                 stored: TensorInfo | None = None):
        """``stored``: the stored tensor of the same name the view stands in for (its codes), if any."""
        dtype = np.dtype("<f2") if checkpoint.dtype_mode == "float16" else np.dtype("<f4")
        marker = next(iter(layout.parts.values()))
        rows = max(layout.row_align, TILE_TARGET_BYTES // max(1, layout.in_features * dtype.itemsize)
                   // layout.row_align * layout.row_align)
        info = TensorInfo(name, layout.scheme, layout.shape, marker.source, marker.offset,
                          sum(p.stored_nbytes for p in layout.parts.values()),
                          block_elements=rows * layout.in_features, block_bytes=0)
        super().__init__(checkpoint, info, index)   # no codec: the layout decodes (see data)
        self.layout = layout
        self.origin = origin
        self.stored_info = stored
        self.dtype = dtype
        self._served = dtype  # what dtype is, never None for a view (Tensor.dtype may be)
        self._packed: PackedData | None = None
        self.extra_meta: dict[str, Any] = {}

    @property
    def decodable(self) -> bool:
        return True

    @property
    def data(self) -> PackedData:
        if self._packed is None:
            reader = PartReader(self._ck, self.layout, self.name)
            self._packed = self._data = PackedData(self.info, self.layout, reader, self._served, self._ck.cache)
        return self._packed

    def values_as(self, dtype: np.dtype) -> PackedData:
        """The view's values decoded as ``dtype`` (hf/ takes float32 under ``--dtype float16`` too)."""
        if np.dtype(dtype) == self._served:
            return self.data
        return PackedData(self.info, self.layout, PartReader(self._ck, self.layout, self.name), np.dtype(dtype),
                          self._ck.cache)

    @property
    def meta(self) -> dict[str, Any]:
        if self._meta is None:
            layout = self.layout
            self._meta = {
                "name": self.name,
                "virtual": True,
                "scheme": layout.scheme,
                "parameters": dict(layout.parameters),
                "config": self.origin,
                "shape": list(self.shape),
                "npy_dtype": self._served.str,
                "npy_data_offset": len(npy_header(self.shape, self._served)),
                "npy_nbytes": self.nbytes,
                "computed_in": layout.scale_type,
                "parts": {role: {"name": p.name, "storage_type": p.storage_type, "shape": list(p.shape),
                                 "source": p.source, "offset": p.offset, "stored_nbytes": p.stored_nbytes}
                          for role, p in layout.parts.items()},
                "damaged": None,
            }
            if self.stored_info is not None:
                info = self.stored_info
                self._meta["stored"] = {"storage_type": info.storage_type, "shape": list(info.shape),
                                        "offset": info.offset, "stored_nbytes": info.stored_nbytes,
                                        "reach": "its .raw file; ckptfs.Checkpoint.stored(name) in Python"}
        return self._meta

    def raw(self) -> bytes:
        if self.stored_info is not None:  # the view stands in a stored tensor's name: its bytes are those
            return self._ck.stored(self.name).raw()
        raise CheckpointError(self.info.source, None, f"tensor {self.name!r} is a view of packed parts "
                                                      f"({', '.join(p.name for p in self.layout.parts.values())}): "
                                                      f"it has no stored bytes of its own")

    def __repr__(self) -> str:
        return f"<ckptfs.Tensor {self.name!r} {self.layout.scheme} view shape={self.shape} dtype={self.dtype}>"
