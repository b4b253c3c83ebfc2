"""What a format reader produces: frozen tensor descriptors and the parsed checkpoint.

Readers (``ckptfs.formats``) turn headers into these plain values once, at open. Everything downstream — the
block engine, the views, the API, the mount — works only from descriptors, never from format-specific
structures, so a new format or a remote source plugs in by producing the same values.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as stored: where its bytes are and how to decode them.

    ``offset`` is absolute within ``source`` (the file path exactly as the user gave it or as found beside
    it — never a resolved realpath). ``block_elements``/``block_bytes`` are 0 when the storage type is
    unknown (the tensor is then served raw-only). ``damaged`` is None or a one-line reason (truncated data,
    unknown type, unsupported byte order).
    """

    name: str
    storage_type: str
    shape: tuple[int, ...]
    source: str
    offset: int
    stored_nbytes: int
    block_elements: int
    block_bytes: int
    byte_order: str = "<"
    gguf_dims: tuple[int, ...] | None = None
    damaged: str | None = None

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def n_blocks(self) -> int:
        return self.n_elements // self.block_elements if self.block_elements else 0


class TensorTable(Sequence[TensorInfo]):
    """The descriptors of one file's tensors as columns, a :class:`TensorInfo` built only when one is asked
    for: a 94,000-tensor header must not cost 94,000 objects of eleven fields before anything is read.

    Columns: ``names``, ``storage_types``, ``shapes``, ``offsets``, ``stored`` (one entry per tensor), the
    block geometry per storage type, and the reasons of the few damaged tensors by index. Everything that
    reads descriptors one by one works unchanged (it is a Sequence of TensorInfo); what needs only a column
    (the tensor names for an index or a listing) reads the column.
    """

    __slots__ = ("source", "names", "storage_types", "shapes", "offsets", "stored", "geometry", "damaged",
                 "byte_order")

    def __init__(self, source: str, names: list[str], storage_types: list[str], shapes: list[tuple[int, ...]],
                 offsets: list[int], stored: list[int], geometry: Mapping[str, tuple[int, int]],
                 damaged: Mapping[int, str] | None = None, byte_order: str = "<") -> None:
        self.source = source
        self.names = names
        self.storage_types = storage_types
        self.shapes = shapes
        self.offsets = offsets
        self.stored = stored
        self.geometry = geometry
        self.damaged = dict(damaged or {})
        self.byte_order = byte_order

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, index: int) -> TensorInfo: ...

    @overload
    def __getitem__(self, index: slice) -> list[TensorInfo]: ...

    def __getitem__(self, index: int | slice) -> TensorInfo | list[TensorInfo]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        storage_type = self.storage_types[index]
        block_elements, block_bytes = self.geometry.get(storage_type, (0, 0))
        return TensorInfo(self.names[index], storage_type, self.shapes[index], self.source, self.offsets[index],
                          self.stored[index], block_elements, block_bytes, self.byte_order,
                          None, self.damaged.get(index))

    def __iter__(self) -> Iterator[TensorInfo]:
        return (self[i] for i in range(len(self)))


def tensor_names(tensors: Sequence[TensorInfo]) -> list[str]:
    """The names of ``tensors`` in order, from the column when they are a TensorTable."""
    return tensors.names if isinstance(tensors, TensorTable) else [t.name for t in tensors]


@dataclass
class ParsedCheckpoint:
    """The result of reading one checkpoint (one file, or a set of shards seen as one).

    ``metadata`` is a Mapping whose values may be decoded only when first looked up (a GGUF tokenizer
    vocabulary is hundreds of thousands of strings). ``passthrough`` maps extra file names that a mount
    exposes unchanged (config.json of a model folder) to their paths.
    """

    format: str
    version: int | None
    files: tuple[str, ...]
    tensors: Sequence[TensorInfo]  # a list, or a TensorTable for a file read by the columnar fast path
    metadata: Mapping[str, Any]
    notes: list[str] = field(default_factory=list)
    passthrough: dict[str, str] = field(default_factory=dict)
