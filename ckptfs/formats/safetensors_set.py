"""Sharded safetensors: the index file, and a set of shards read as one checkpoint.

An index (``model.safetensors.index.json``, huggingface_hub's convention) is ``{"metadata": {...},
"weight_map": {tensor name: shard file}}``. The index decides which files form the checkpoint; the shards'
own headers decide what is actually there. Where they disagree, ckptfs serves what the shards hold and says
what differs in notes (docs/interfaces.md: refuse what is impossible, serve around what is missing):

- a shard the index names but that is not there: the other shards are served; a note names the missing file
  and the tensors the index placed in it (they have no bytes, so no descriptor and no file in the mount).
  Refusing would make a partial download useless for looking at what did arrive.
- a tensor the index places in a shard that does not hold it: a note; served from wherever it is stored.
- a tensor stored in a shard but absent from the index: a note; served.

Metadata: the shards' ``__metadata__`` merged, an earlier shard winning over a later one, and the index's
``"metadata"`` object winning over both (it describes the whole set, as shard 0 does for a split GGUF);
every conflicting key is named in a note.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckptfs.core.descriptors import ParsedCheckpoint
from ckptfs.core.errors import CheckpointError
from ckptfs.sources import DEFAULT_OPENER, Opener
from ckptfs.formats import read_file
from ckptfs.formats.combine import ShardPart, combine, require_format
from ckptfs.formats.shards import name_list, natural_key
from ckptfs.util.jsonutil import JsonRefused, loads

#: An index lists names and file names only; even 100k tensors make a few MB. Anything far larger is not one.
MAX_INDEX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class ShardIndex:
    """A parsed index: which tensor the index places in which file (names relative to the index's folder)."""

    path: str
    metadata: dict[str, Any]
    weight_map: dict[str, str]
    notes: tuple[str, ...]

    @property
    def folder(self) -> str:
        return os.path.dirname(self.path)

    def shard_files(self) -> list[str]:
        """The files the index names, each once, in shard order (names sort by their numbers)."""
        return sorted(set(self.weight_map.values()), key=natural_key)

    def shard_path(self, file: str) -> str:
        """Where a shard file named by the index is: joined to the index's path as given, never resolved."""
        return os.path.join(self.folder, file)


def read_index(path: str, opener: Opener = DEFAULT_OPENER) -> ShardIndex:
    """Parse and validate an index file; CheckpointError if it cannot say which files form the checkpoint."""
    try:
        source = opener.source(path)
    except CheckpointError as exc:
        raise CheckpointError(path, None, f"cannot read the index: {exc.reason}") from None
    try:
        if source.size > MAX_INDEX_BYTES:
            raise CheckpointError(path, None, f"is {source.size} bytes, more than an index can be "
                                              f"({MAX_INDEX_BYTES}): not a shard index")
        data = source.pread(0, source.size)
    finally:
        source.close()
    try:
        doc = loads(data.decode("utf-8"), "index")
    except UnicodeDecodeError as exc:
        raise CheckpointError(path, exc.start, "index is not valid UTF-8") from None
    except JsonRefused as exc:  # not JSON, or nested past the parser's bound
        raise CheckpointError(path, None, str(exc)) from None
    if not isinstance(doc, dict):
        raise CheckpointError(path, None, "index is not a JSON object")
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(path, None, 'index has no "weight_map" object (tensor name -> shard file)')
    if not weight_map:
        raise CheckpointError(path, None, 'index "weight_map" is empty: it names no tensors')
    checked = {name: _shard_file(path, name, file) for name, file in weight_map.items()}
    notes: list[str] = []
    metadata = doc.get("metadata")
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict):
        notes.append(f'index "metadata" is a {type(metadata).__name__}, not an object: ignored')
        metadata = {}
    return ShardIndex(path, metadata, checked, tuple(notes))


def _shard_file(index_path: str, tensor: str, file: object) -> str:
    """A weight_map value as a path relative to the index's folder; refuse one that leaves that folder."""
    if not isinstance(file, str) or not file:
        raise CheckpointError(index_path, None, f"weight_map entry {tensor!r} is not a file name: {file!r}")
    normal = posixpath.normpath(file)
    if posixpath.isabs(normal) or normal == ".." or normal.startswith("../") or "\x00" in normal:
        raise CheckpointError(index_path, None,
                              f"weight_map entry {tensor!r} names {file!r}, outside the index's folder")
    return normal


def read_safetensors_set(present: Sequence[str], missing: Sequence[str],
                         index: ShardIndex | None = None, *, opener: Opener = DEFAULT_OPENER) -> ParsedCheckpoint:
    """Read the shards at ``present`` (shard order) as one checkpoint.

    ``missing`` names the shard files that should exist but do not (from the index, or gaps in the numbers of
    a ``-NNNNN-of-NNNNN`` set); they are only reported.
    """
    if not present:
        where = index.path if index is not None else (missing[0] if missing else None)
        raise CheckpointError(where, None, f"none of the {len(missing)} shard files exist: {name_list(missing)}")
    parts: list[ShardPart] = []
    shard_metadata: list[tuple[str, Any]] = []
    version = None
    for path in present:
        parsed = read_file(path, opener)
        require_format(path, parsed, "safetensors", "the sharded checkpoint")
        if not parts:
            version = parsed.version
        parts.append(ShardPart.of(path, parsed))
        shard_metadata.append((os.path.basename(path), parsed.metadata))
    notes: list[str] = list(index.notes) if index is not None else []
    metadata = _merge_metadata(shard_metadata, index, notes)
    if index is not None:
        notes.extend(_index_disagreements(index, parts, missing))
    else:
        notes.extend(f"shard {os.path.basename(m)} is missing: its tensors are not served" for m in missing)
    return combine("safetensors", version, parts, metadata, notes)


def _merge_metadata(shards: list[tuple[str, Any]], index: ShardIndex | None, notes: list[str]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    conflicts: list[str] = []
    layers = list(shards)
    if index is not None:
        layers.insert(0, (os.path.basename(index.path), index.metadata))
    for where, metadata in layers:
        for key in metadata:
            value = metadata[key]
            if key not in merged:
                merged[key] = value
                origin[key] = where
            elif merged[key] != value:
                conflicts.append(f"{key!r} (kept {origin[key]}'s, not {where}'s)")
    if conflicts:
        notes.append(f"metadata keys with different values across files: {name_list(conflicts)}")
    return merged


def _index_disagreements(index: ShardIndex, parts: list[ShardPart], missing: Sequence[str]) -> list[str]:
    """Notes for every way the shards' headers differ from what the index says."""
    notes: list[str] = []
    rel = {index.shard_path(file): file for file in index.shard_files()}
    held: dict[str, list[str]] = {}
    for part in parts:
        for info in part.tensors:
            where = held.setdefault(info.name, [])
            if rel[part.path] not in where:
                where.append(rel[part.path])
    missing_rel = {rel[m] for m in missing}
    lost: dict[str, list[str]] = {}
    absent: list[str] = []
    misplaced: list[str] = []
    for name, file in index.weight_map.items():
        if file in missing_rel:
            lost.setdefault(file, []).append(repr(name))
        elif name not in held:
            absent.append(f"{name!r} ({file})")
        elif file not in held[name]:
            misplaced.append(f"{name!r} (index: {file}; stored in {', '.join(held[name])})")
    for file in sorted(lost, key=natural_key):
        names = lost[file]
        notes.append(f"shard {file} named by the index is missing: its {len(names)} tensor(s) are not served: "
                     f"{name_list(names)}")
    if absent:
        notes.append(f"{len(absent)} tensor(s) named by the index are not in their shard and not served: "
                     f"{name_list(absent)}")
    if misplaced:
        notes.append(f"{len(misplaced)} tensor(s) are stored in another shard than the index says (served from "
                     f"where they are): {name_list(misplaced)}")
    unnamed = [f"{name!r} ({', '.join(files)})" for name, files in held.items() if name not in index.weight_map]
    if unnamed:
        notes.append(f"{len(unnamed)} tensor(s) stored in the shards are not named by the index (served): "
                     f"{name_list(unnamed)}")
    return notes
