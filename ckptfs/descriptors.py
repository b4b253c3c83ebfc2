"""What a format reader produces: frozen tensor descriptors and the parsed checkpoint.

Readers (``ckptfs.formats``) turn headers into these plain values once, at open. Everything downstream — the
block engine, the views, the API, the mount — works only from descriptors, never from format-specific
structures, so a new format or a remote source plugs in by producing the same values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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
    tensors: list[TensorInfo]
    metadata: Mapping[str, Any]
    notes: list[str] = field(default_factory=list)
    passthrough: dict[str, str] = field(default_factory=dict)
