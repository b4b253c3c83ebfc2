"""Several single-file reads seen as one checkpoint: tensors in shard order, notes that name their shard.

Each shard is read on its own by ``formats.read_file`` (which closes the file once its header is parsed), so
every descriptor already points at its own file with an absolute offset; combining them is concatenation.
What combining adds is the one check only the whole set can make: a tensor name stored in more than one
shard. Both copies stay listed (docs/interfaces.md: ``ck.tensors`` lists duplicates, the mount numbers the later
ones ``~2``), and a note says so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptfs.core.descriptors import ParsedCheckpoint, TensorInfo
from ckptfs.core.errors import CheckpointError
from ckptfs.formats.shards import name_list


@dataclass(frozen=True)
class ShardPart:
    """What is kept of one shard's read: its descriptors and notes (its header bytes are let go)."""

    path: str
    tensors: tuple[TensorInfo, ...]
    notes: tuple[str, ...]

    @classmethod
    def of(cls, path: str, parsed: ParsedCheckpoint) -> ShardPart:
        return cls(path, tuple(parsed.tensors), tuple(parsed.notes))

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def require_format(path: str, parsed: ParsedCheckpoint, expected: str, role: str) -> None:
    """Refuse a shard whose content is another format: one checkpoint has one format."""
    if parsed.format != expected:
        raise CheckpointError(path, 0, f"is a {parsed.format} file, but {role} is {expected}")


def combine(fmt: str, version: int | None, parts: Sequence[ShardPart], metadata: Mapping[str, Any],
            notes: list[str]) -> ParsedCheckpoint:
    """One ParsedCheckpoint over ``parts`` (in shard order); ``notes`` are the set-level notes so far."""
    tensors: list[TensorInfo] = []
    shard_notes: list[str] = []
    first_holder: dict[str, ShardPart] = {}
    duplicates: list[str] = []
    for part in parts:
        shard_notes.extend(f"{part.name}: {note}" for note in part.notes)
        names_here: set[str] = set()
        for info in part.tensors:
            tensors.append(info)
            if info.name in names_here:
                continue  # a duplicate inside one file is that file's reader's business
            names_here.add(info.name)
            holder = first_holder.setdefault(info.name, part)
            if holder is not part:
                duplicates.append(f"{info.name!r} ({holder.name} and {part.name})")
    if duplicates:
        notes.append(f"{len(duplicates)} tensor name(s) stored in more than one shard, all copies listed "
                     f"(the mount numbers later copies ~2, ~3; ck[name] is the first): {name_list(duplicates)}")
    return ParsedCheckpoint(format=fmt, version=version, files=tuple(p.path for p in parts), tensors=tensors,
                            metadata=metadata, notes=shard_notes + notes)
