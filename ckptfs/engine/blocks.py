"""The heart of the read path: an element range of a tensor -> decoded values.

A request for elements [e0, e1) is mapped to the quant blocks that cover it, the blocks to fixed-size
*groups*, and each group is taken from the cache or decoded from just its stored bytes. Groups, not single
blocks, are the cache unit because one K-quant block is only 1 KiB of float32 while the kernel asks in
readahead-sized requests (about 128 KiB); a group is sized to about ``GROUP_TARGET_BYTES`` of output.

Stored types whose bytes already are the served values (little-endian F32 served as F32, ...) skip the
decode and the cache: their bytes are read straight from the source (and the kernel page cache keeps them).

Truncated tensors: blocks whose bytes are all present are served; touching a missing block raises
``CheckpointError`` naming the tensor and the missing byte range.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from ckptfs.cache.tiered import TieredCache, cache_key
from ckptfs.core.descriptors import TensorInfo
from ckptfs.core.errors import CheckpointError
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.engine import batch
from ckptfs.engine.decode import decode_blocks
from ckptfs.engine.parallel import spread
from ckptfs.engine.values import TensorValues
from ckptfs.util.procinfo import cores
from ckptfs.quant import Codec
from ckptfs.sources import ByteSource, SourcePool

T = TypeVar("T")

GROUP_TARGET_BYTES = 256 * 1024
#: A run of groups one request decodes is cut into at most this many tasks: one per core (engine/parallel.py).
DECODE_TASKS = cores()
UNCACHED_STEP_BYTES = 16 * 1024 * 1024


def split(items: list[T], n: int) -> list[list[T]]:
    """``items`` cut into at most ``n`` consecutive parts of nearly equal length."""
    n = max(1, min(n, len(items)))
    step, extra = divmod(len(items), n)
    parts, at = [], 0
    for i in range(n):
        size = step + (i < extra)
        parts.append(items[at: at + size])
        at += size
    return parts


def group_slices(group: Callable[[int], np.ndarray], group_elements: int, e0: int, e1: int) -> list[np.ndarray]:
    """Elements [e0, e1) as read-only slices of the groups (of ``group_elements`` each; the last may be
    shorter) covering them, ``group(g)`` giving group ``g``'s values."""
    return [group(g)[max(e0 - g * group_elements, 0): e1 - g * group_elements]
            for g in range(e0 // group_elements, (e1 - 1) // group_elements + 1)]


def covering_groups(d0: int, d1: int, group_bytes: int, end: int) -> tuple[list[int], list[tuple[int, int, int]]]:
    """The groups (of ``group_bytes`` each, the last ending at ``end``) under bytes [d0, d1): those the range
    covers whole, and ``(group, a, b)`` for each one its ends cut (bytes [a, b) of it are asked for)."""
    whole, cut = [], []
    for g in range(d0 // group_bytes, (d1 - 1) // group_bytes + 1):
        lo, hi = g * group_bytes, min((g + 1) * group_bytes, end)
        if lo >= d0 and hi <= d1:
            whole.append(g)
        else:
            cut.append((g, max(d0, lo), min(d1, hi)))
    return whole, cut


def spread_runs(groups: list[int], run_into: Callable[[int, int], None]) -> None:
    """``run_into(g0, g1)`` for runs of consecutive ``groups`` (ascending; g1 inclusive), each run cut into at
    most ``DECODE_TASKS`` parts, spread over the cores (``ckptfs.engine.parallel``): one decode each."""
    tasks, run = [], [groups[0]]
    for g in groups[1:] + [None]:
        if g is not None and g == run[-1] + 1:
            run.append(g)
            continue
        for part in split(run, DECODE_TASKS):
            tasks.append(functools.partial(run_into, part[0], part[-1]))
        if g is not None:
            run = [g]
    spread(tasks)


def range_into(a: int, b: int, target: np.ndarray, unit_bytes: int, dtype: np.dtype,
               decode: Callable[..., np.ndarray]) -> None:
    """Bytes [a, b) of values made of units of ``unit_bytes`` (blocks, aligned row runs; the last may be
    shorter) decoded into ``target[: b - a]`` without the cache: ``decode(u0, u1, out)`` writes units
    [u0, u1) into ``out`` (a ``dtype`` array) for the units wholly inside, ``decode(u0, u1)`` returns the (at
    most two) units the ends cut, copied from a scratch array."""
    first, last = a // unit_bytes, -(-b // unit_bytes)
    inner, outer = -(-a // unit_bytes), b // unit_bytes  # the units wholly inside [a, b)
    if inner < outer:
        place = target[inner * unit_bytes - a: outer * unit_bytes - a]
        decode(inner, outer, place.view(dtype))
        cut = [(first, inner), (outer, last)]
    else:
        cut = [(first, last)]
    for u0, u1 in cut:
        if u1 > u0:
            values = decode(u0, u1).view(np.uint8)
            lo, hi = max(a, u0 * unit_bytes), min(b, u1 * unit_bytes)
            target[lo - a: hi - a] = values[lo - u0 * unit_bytes: hi - u0 * unit_bytes]


class TensorData(TensorValues):
    """Decoded values of one stored tensor, by element range."""

    def __init__(self, info: TensorInfo, codec: Codec, dtype: np.dtype, sources: SourcePool,
                 cache: TieredCache) -> None:
        self.info = info
        self.codec = codec
        self.dtype = np.dtype(dtype)
        self.n_elements = info.n_elements
        self.n_blocks = info.n_blocks
        self._sources = sources
        self._cache = cache
        self.direct = codec.exact and info.byte_order == "<" and codec.dtype == self.dtype
        # a decoded type whose codec writes the served dtype (a cast one goes through the cached group)
        self.decodes_into_reply = not self.direct and codec.dtype == self.dtype
        out_block_bytes = info.block_elements * self.dtype.itemsize
        self.group_blocks = max(1, GROUP_TARGET_BYTES // max(1, out_block_bytes))
        self._available_blocks: int | None = None
        self._content_id: str | None = None

    @property
    def source(self) -> ByteSource:
        return self._sources.get(self.info.source)

    def available_blocks(self) -> int:
        """How many leading blocks have all their bytes in the file (as it was at open)."""
        if self._available_blocks is None:
            present = max(0, min(self.info.stored_nbytes, self.source.size - self.info.offset))
            self._available_blocks = min(self.n_blocks, present // self.info.block_bytes)
        return self._available_blocks

    def _missing(self, b0: int, b1: int) -> CheckpointError:
        bb = self.info.block_bytes
        start, end = self.info.offset + b0 * bb, self.info.offset + b1 * bb
        return CheckpointError(self.info.source, start,
                               f"tensor {self.info.name!r}: stored bytes {start}..{end} are missing "
                               f"(file has {self.source.size} bytes)")

    def present_blocks(self, e0: int, e1: int) -> tuple[int, int]:
        """The blocks [b0, b1) covering elements [e0, e1), or CheckpointError if any of them is missing."""
        be = self.info.block_elements
        b0, b1 = e0 // be, -(-e1 // be)
        if b1 > self.available_blocks():
            raise self._missing(max(b0, self.available_blocks()), b1)
        return b0, b1

    def read(self, e0: int, e1: int, use_cache: bool = True, *, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        """Elements [e0, e1) of the flattened (C-order) tensor as a 1-D array of ``self.dtype``.

        ``use_cache=False`` is for whole-tensor reads (``np.asarray``): they decode straight into the
        result in large steps instead of churning the shared cache with groups nobody will ask for again.
        """
        e0, e1 = max(0, e0), min(e1, self.n_elements)
        if e1 <= e0:
            return np.empty(0, self.dtype)
        be = self.info.block_elements
        b0, b1 = self.present_blocks(e0, e1)
        if self.direct:
            raw = self._pread_blocks(b0, b1, scope)
            return np.frombuffer(raw, self.dtype)[e0 - b0 * be: e1 - b0 * be]
        if not use_cache:
            return self._decode_uncached(b0, b1, scope)[e0 - b0 * be: e1 - b0 * be]
        segments = self._group_segments(e0, e1, scope)
        return segments[0] if len(segments) == 1 else np.concatenate(segments)

    def bytes_into(self, d0: int, target: np.ndarray, keep: bool = True, *, scope: ReadScope = NOTHING_SAID) -> None:
        """Bytes [d0, d0 + len(target)) of the served values (within the tensor) written into ``target`` (a
        writable uint8 array: a mount's reply buffer), each byte once: a direct type is ``pread`` there; the
        block groups the range covers whole are decoded straight into their places, at once on every core
        (``TieredCache.fill_into``, ``ckptfs.engine.parallel``; with ``keep`` a copy of each is cached); of a
        group the range's ends cut, the part inside is sliced from the cache or decoded (``_part_into``)."""
        d1 = d0 + len(target)
        item = self.dtype.itemsize
        e0, e1 = d0 // item, -(-d1 // item)
        if e1 <= e0:
            return
        self.present_blocks(e0, e1)  # CheckpointError if blocks are missing
        if self.direct:
            try:
                self.source.pread_into(self.info.offset + d0, target.data, scope=scope)
            except CheckpointError as exc:
                raise exc.about_tensor(self.info.name) from None
            return
        group_bytes = self.group_blocks * self.info.block_elements * item
        end = self.n_elements * item
        whole, cut = covering_groups(d0, d1, group_bytes, end)
        if self.codec.dtype != self.dtype:  # a cast dtype goes through the cached group (``_part_into``)
            cut = sorted(cut + [(g, g * group_bytes, min((g + 1) * group_bytes, end)) for g in whole])
            whole = []
        for g, a, b in cut:
            self._part_into(g, a, b, target[a - d0:], scope)
        if not whole:
            return

        def out(g0: int, g1: int | None = None) -> np.ndarray:
            """The place of groups g0..g1 (inclusive; g1 = g0 by default) in ``target``, as served values."""
            stop = min(((g0 if g1 is None else g1) + 1) * group_bytes, end)
            return target[g0 * group_bytes - d0: stop - d0].view(self.dtype)

        self._cache.fill_into([(self._key(g), out(g)) for g in whole],
                              lambda picked: self._decode_groups_into([whole[i] for i in picked], out, scope),
                              lambda i: self._decode_group(whole[i], scope), keep)

    def _part_into(self, g: int, a: int, b: int, target: np.ndarray, scope: ReadScope) -> None:
        """Bytes [a, b) of the values, all in group ``g`` but not the whole of it, written at ``target[0]``:
        from the cache when the group is there (or being decoded: waited for), else only the blocks under
        them decoded straight into place (a 4 KiB first read decodes 4 KiB, not the group's 256 KiB; a
        stream's neighbouring request decodes the rest of the group). The group is looked up once either
        way, so a miss still means a decode. A cast dtype (float16 mode) goes through the cached group."""
        key = self._key(g)
        values = self._cache.memory.get(key)
        if values is None and (self.codec.dtype != self.dtype or self._cache.shared_tiers
                               or self._cache.pending(key)):
            values = self._group(g, scope)
        if values is not None:
            lo = g * self.group_blocks * self.info.block_elements * self.dtype.itemsize
            target[: b - a] = values.view(np.uint8)[a - lo: b - lo]
            return
        self._range_into(a, b, target, scope)

    def _range_into(self, a: int, b: int, target: np.ndarray, scope: ReadScope = NOTHING_SAID) -> None:
        """Bytes [a, b) of the values (present blocks) decoded into ``target[: b - a]`` without the cache: the
        blocks wholly inside straight there, the (at most two) blocks the ends cut through a scratch array."""
        range_into(a, b, target, self.info.block_elements * self.dtype.itemsize, self.dtype,
                   functools.partial(self._decode_blocks, scope=scope))

    def computed_codes(self) -> None:
        """None: a stored tensor's decoded types go through the decode engine (its cache, its read-ahead)."""
        return None

    def prime(self) -> None:
        """Decode the first block into a scratch array, past the cache (no lookup counted, nothing kept): a
        mount runs each storage type's read path once before its first reader (``fuse.operations``)."""
        if not self.direct and self.available_blocks():
            self._range_into(0, self.info.block_elements * self.dtype.itemsize,
                             np.empty(self.info.block_elements * self.dtype.itemsize, np.uint8))

    def _decode_groups_into(self, groups: list[int], out: Callable[..., np.ndarray], scope: ReadScope) -> None:
        """Groups ``groups`` (ascending) decoded into their places ``out(g0, g1)``: each run of consecutive
        groups cut into at most ``DECODE_TASKS`` parts, one ``pread`` and one decode each, spread over the
        cores."""
        spread_runs(groups, functools.partial(self._decode_run_into, out=out, scope=scope))

    def _decode_run_into(self, g0: int, g1: int, *, out: Callable[..., np.ndarray], scope: ReadScope) -> None:
        b0 = g0 * self.group_blocks
        self._decode_blocks(b0, min((g1 + 1) * self.group_blocks, self.available_blocks()), out(g0, g1), scope=scope)

    def _group_segments(self, e0: int, e1: int, scope: ReadScope) -> list[np.ndarray]:
        """Elements [e0, e1) (present, non-direct) as read-only slices of the cached groups covering them."""
        return group_slices(functools.partial(self._group, scope=scope), self.group_blocks * self.info.block_elements,
                            e0, e1)

    def content_id(self) -> str:
        """The content identity of the file the tensor is stored in (asked once)."""
        if self._content_id is None:
            self._content_id = self.source.content_id()
        return self._content_id

    def _key(self, g: int) -> str:
        b0 = g * self.group_blocks
        b1 = min(b0 + self.group_blocks, self.available_blocks())
        return cache_key(self.content_id(), self.info.offset, self.info.storage_type, self.dtype.str, b0, b1)

    def _group(self, g: int, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        return self._cache.get_or_load(self._key(g), lambda: self._decode_group(g, scope))

    def _decode_group(self, g: int, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        b0 = g * self.group_blocks
        return self._decode_blocks(b0, min(b0 + self.group_blocks, self.available_blocks()), scope=scope)

    def _decode_uncached(self, b0: int, b1: int, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        """Blocks [b0, b1) decoded into a new array past the memory tier: a batch of one request
        (``ckptfs.engine.batch``: bounded runs, one ``pread`` per piece, spread over the cores), or with
        disk/Redis tiers group by group through them."""
        if self._cache.shared_tiers:
            return self._from_shared_tiers(b0, b1, scope)
        be = self.info.block_elements
        out = np.empty((b1 - b0) * be, self.dtype)
        request = batch.Request(self, b0 * be, b1 * be, batch.ArrayDestination(out), self.codec)
        batch.run(batch.plan([request]), self._sources, scope)
        return out

    def _from_shared_tiers(self, b0: int, b1: int, scope: ReadScope) -> np.ndarray:
        """Blocks [b0, b1) group by group through the disk/Redis tiers (what another process decoded is not
        decoded again; what is decoded here is stored there), not kept in the memory LRU. The groups at
        both ends are decoded whole, at most two groups more than asked."""
        be, gsize = self.info.block_elements, self.group_blocks
        out = np.empty((b1 - b0) * be, self.dtype)
        for g in range(b0 // gsize, (b1 - 1) // gsize + 1):
            values = self._cache.get_or_load(self._key(g), functools.partial(self._decode_group, g, scope),
                                             memory=False)
            first = g * gsize
            lo, hi = max(b0, first), min(b1, first + gsize)
            out[(lo - b0) * be:(hi - b0) * be] = values[(lo - first) * be:(hi - first) * be]
        return out

    def _decode_blocks(self, b0: int, b1: int, out: np.ndarray | None = None, *, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        """Blocks [b0, b1) decoded into ``out`` (a new array when None). Where the codec's output already is
        the served dtype, the decoder writes into ``out`` itself (no intermediate array, no copy)."""
        return decode_blocks(self.codec, self.info, self._pread_blocks(b0, b1, scope), self.dtype, out)

    def _pread_blocks(self, b0: int, b1: int, scope: ReadScope = NOTHING_SAID) -> bytes:
        """The stored bytes of blocks [b0, b1); a source error (the file changed) says which tensor it hit."""
        bb = self.info.block_bytes
        try:
            return self.source.pread(self.info.offset + b0 * bb, (b1 - b0) * bb, scope=scope)
        except CheckpointError as exc:
            raise exc.about_tensor(self.info.name) from None

    def decode_group(self, g: int, scope: ReadScope = NOTHING_SAID) -> None:
        """Decode group ``g`` into the cache if it is not there (for background read-ahead). A group already
        cached is left alone without a lookup, so read-ahead does not count as cache hits."""
        if not self.direct and g * self.group_blocks < self.available_blocks() and self._key(g) not in self._cache:
            self._group(g, scope)

    def stored_range(self, e0: int, e1: int) -> tuple[int, int]:
        """(file offset, size) of the stored blocks behind elements [e0, e1), clipped to the tensor (for
        telling the kernel which source bytes are about to be read)."""
        be, bb = self.info.block_elements, self.info.block_bytes
        b0, b1 = max(0, e0) // be, min(-(-e1 // be), self.n_blocks)
        return self.info.offset + b0 * bb, max(0, b1 - b0) * bb

    def group_of_element(self, e: int) -> int:
        return (e // self.info.block_elements) // self.group_blocks
