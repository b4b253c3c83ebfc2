"""What a tensor's values are read through: the :class:`TensorValues` protocol, by element range.

Its own module, below ``blocks`` (stored tensors: ``TensorData``) and ``batch`` (many tensors at once), which
both speak it; a packed layer's view (``ckptfs.packed.views.PackedData``) implements it too.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.core.reads import NOTHING_SAID, ReadScope

#: A piece of a file's bytes as the views hand them out (a FUSE read joins them once).
BytePart = bytes | bytearray | memoryview


@dataclass(frozen=True)
class ScaledCodes:
    """Values that are a closed form of stored codes, row by row: one code byte per value times a scale per
    block (a scaled-codes layer: ``ckptfs.packed.scaled``). Row ``r``'s codes are the ``width`` bytes at
    ``offset + r * width`` of ``source``; its scale row is ``(r // matrix_rows) * grid_rows + (r % matrix_rows)
    // block_height`` of ``scales`` (float32, ``groups`` wide, one per ``block_width`` values), likewise of
    ``zeros`` when given; ``table`` holds each code byte's float32 value. A mount computes such values per
    read in C (``ckptfs.fuse.direct``, ``quant/scaled_rows.h``: the same arithmetic as the layer's kernel),
    which needs neither the decode engine's cache nor Python per request."""

    source: object           # the byte source holding the codes (a pool's source)
    offset: int              # where row 0's codes start in it
    rows: int
    width: int
    table: np.ndarray        # float32 [256]
    scales: np.ndarray       # float32 [scale rows, groups]
    zeros: np.ndarray | None  # float32 like scales, or None
    block_width: int
    matrix_rows: int
    grid_rows: int
    block_height: int


@dataclass(frozen=True)
class PairedNibbles:
    """Values that are 4-bit codes, two a byte, times a scale per block of elements, the weight's elements in
    order whatever its rows (NVFP4, MXFP4, bitsandbytes NF4/FP4: ``ckptfs.packed``). Element ``e``'s byte is
    ``offset + e // 2`` of ``source``; ``pairs`` holds each byte's two values in element order (512 float32).
    Block ``k``'s scale is stored in the same file at ``scale_offset``, ``blocks`` of them, and read with the
    codes that need it (so nothing proportional to the layer is held): ``"f32"`` a float32 each; ``"table"`` a
    byte each, worth ``table[byte]``; ``"nested"`` a byte each, worth ``table[byte] * nested[k //
    nested_block] + nested_offset`` in float32 (bitsandbytes' double quantization). A mount computes them per
    read in C (``quant/nibble_pairs.h``)."""

    source: object
    offset: int
    rows: int
    width: int
    pairs: np.ndarray               # float32 [512]
    block: int
    blocks: int
    scale_offset: int
    scale_kind: str                 # "f32", "table" or "nested"
    table: np.ndarray | None = None   # float32 [256] ("table", "nested")
    nested: np.ndarray | None = None  # float32 second-level scales ("nested")
    nested_block: int = 1
    nested_offset: float = 0.0


#: What a mount can compute in C from stored codes, per read.
CodeValues = ScaledCodes | PairedNibbles


@dataclass(frozen=True)
class ComputedSegment:
    """A file segment whose bytes are :data:`CodeValues`' values written as ``dtype`` ("float32", "float16"
    or "bfloat16"), row-major: what ``View.plain_segments`` gives for them."""

    codes: CodeValues
    dtype: str


class TensorValues(Protocol):
    """What the views, the API, read-ahead, ``ckptfs prefetch`` (``ckptfs.ahead.warm``) and ``Tensor.shared()``
    (``checkpoint.shared``) read a tensor's values through: :class:`TensorData` for stored tensors,
    ``ckptfs.packed.views.PackedData`` for the views of packed layers (whose "blocks" and "groups" are tiles
    of rows). A method that reads stored bytes takes the caller's ``scope`` (``ckptfs.core.reads``) and hands
    it to the byte sources. Every method is abstract, so an implementation that lacks one cannot be made at all (rather
    than failing with an AttributeError in whichever caller reaches it first)."""

    info: TensorInfo       # block_elements: elements per block (a packed view's: per tile)
    dtype: np.dtype
    n_elements: int
    n_blocks: int
    direct: bool           # the served values are the stored bytes (no decode, no cache)
    group_blocks: int      # blocks per cached group (read-ahead's unit)
    #: ``bytes_into`` decodes what it misses straight into its target, on every core: a mount's read-ahead
    #: then only advises (decoding ahead into the cache would be a second decode and a copy)
    decodes_into_reply: bool

    @abstractmethod
    def read(self, e0: int, e1: int, use_cache: bool = True, *, scope: ReadScope = NOTHING_SAID) -> np.ndarray:
        """Elements [e0, e1) of the flattened values; ``use_cache=False`` for whole-tensor reads."""

    @abstractmethod
    def bytes_into(self, d0: int, target: np.ndarray, keep: bool = True, *, scope: ReadScope = NOTHING_SAID) -> None:
        """Bytes [d0, d0 + len(target)) of the values written into ``target`` (a writable uint8 array: a
        mount's reply buffer), each byte once: the one way to fill a range of the served bytes (a view's
        reads, whatever their caller, come here); the groups the range covers whole decoded straight there
        (``TieredCache.fill_into``; with ``keep`` a copy of each is cached), the parts of the groups its ends
        cut sliced from the cache or decoded there without it."""

    @abstractmethod
    def group_of_element(self, e: int) -> int: ...

    @abstractmethod
    def decode_group(self, g: int, scope: ReadScope = NOTHING_SAID) -> None:
        """Decode group ``g`` into the cache unless it is there (decode-ahead's jobs, a warm-up's walk)."""

    @abstractmethod
    def stored_range(self, e0: int, e1: int) -> tuple[int, int]:
        """(file offset, size) of the stored bytes behind elements [e0, e1) (a hint for the kernel)."""

    @abstractmethod
    def available_blocks(self) -> int:
        """How many leading blocks can be decoded (all their stored bytes are there)."""

    @abstractmethod
    def present_blocks(self, e0: int, e1: int) -> tuple[int, int]:
        """The blocks [b0, b1) covering elements [e0, e1), or CheckpointError if any of them is missing."""

    @abstractmethod
    def content_id(self) -> str:
        """The content identity of every stored byte the values are computed from: what a key of the whole
        decoded tensor in a shared tier starts with (``Tensor.shared()``)."""

    @abstractmethod
    def computed_codes(self) -> CodeValues | None:
        """The values as :data:`CodeValues` when they are such a closed form of stored codes and may be
        computed outside the decode engine (no shared tier to fill or read), else None."""

    @abstractmethod
    def prime(self) -> None:
        """Run the read path once before the first reader, keeping nothing (a mount primes each storage type:
        ``fuse.operations``); an implementation with nothing to prime does nothing."""
