"""Which files of a folder belong together, decided by their names alone.

Formats are detected by content (``formats.read_file``), but which files form one checkpoint can only come
from names: a safetensors shard carries nothing that names its siblings, and a split-GGUF shard knows its
number and the count but not the name of its set. Both ecosystems use one pattern, ``PREFIX-NNNNN-of-NNNNN.EXT``
(numbers 1-based, zero-padded to five digits), written by huggingface_hub and llama.cpp's gguf-split.

Everything here works on the names as listed in the folder the user named, joined with that folder's path as
given: Hugging Face cache snapshots are folders of symlinks into a ``blobs/`` folder of hash-named files, so
resolving a link first would lose every name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ckptfs.sources import Folder, LocalFolder

CHECKPOINT_EXTENSIONS = ("gguf", "safetensors")
INDEX_SUFFIX = ".safetensors.index.json"

_SHARD_RE = re.compile(r"^(?P<prefix>.+)-(?P<number>\d{5,})-of-(?P<count>\d{5,})\.(?P<ext>gguf|safetensors)$")
_DIGITS_RE = re.compile(r"(\d+)")


@dataclass(frozen=True)
class ShardName:
    """A file name of the form ``PREFIX-NNNNN-of-NNNNN.EXT``; ``number`` is 1-based."""

    prefix: str
    number: int
    count: int
    ext: str

    def sibling(self, number: int) -> str:
        """The file name of shard ``number`` (1-based) of the same set."""
        return f"{self.prefix}-{number:05d}-of-{self.count:05d}.{self.ext}"

    @property
    def set_label(self) -> str:
        """How messages name the whole set."""
        return f"{self.prefix}-NNNNN-of-{self.count:05d}.{self.ext}"


def parse_shard_name(name: str) -> ShardName | None:
    """The shard pattern of ``name``, or None when it is not a shard name (numbers outside 1..count too)."""
    match = _SHARD_RE.match(name)
    if match is None:
        return None
    number, count = int(match["number"]), int(match["count"])
    if not 1 <= number <= count:
        return None
    return ShardName(match["prefix"], number, count, match["ext"])


def is_index_name(name: str) -> bool:
    return name.endswith(INDEX_SUFFIX) and len(name) > len(INDEX_SUFFIX)


def is_checkpoint_name(name: str) -> bool:
    return name.rpartition(".")[2] in CHECKPOINT_EXTENSIONS


def natural_key(name: str) -> list[tuple[int, int, str]]:
    """Sort key that orders ``shard-2`` before ``shard-10`` (zero-padded names sort the same either way)."""
    return [(0, int(part), part) if part.isdigit() else (1, 0, part) for part in _DIGITS_RE.split(name)]


def name_list(items: Sequence[str], limit: int = 8) -> str:
    """Items for a one-line message: the first ``limit``, then how many more (notes must stay short)."""
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


@dataclass(frozen=True)
class Candidate:
    """One checkpoint a folder could mean: a single file, or the present members of one shard set."""

    paths: tuple[str, ...]
    shard: ShardName | None

    @property
    def label(self) -> str:
        if self.shard is None:
            return os.path.basename(self.paths[0])
        return f"{self.shard.set_label} ({len(self.paths)} of {self.shard.count} files)"


@dataclass(frozen=True)
class FolderScan:
    """A folder's visible entries, sorted by kind. Hidden entries and sub-folders are not looked at."""

    folder: str
    indexes: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    others: tuple[str, ...]
    broken: tuple[str, ...]
    #: every regular file listed, name -> size (-1 when the listing does not say), in natural order
    sizes: Mapping[str, int] = field(default_factory=dict)
    #: name -> the source string the folder joins it to, where that is not the folder's name and the file's
    #: (a Hub listing names a file as a mount does, escaped and capped: ``Folder.join`` knows its path)
    joined: Mapping[str, str] = field(default_factory=dict)

    def path(self, name: str) -> str:
        return self.joined.get(name) or os.path.join(self.folder, name)

    def name_of(self, path: str) -> str:
        """The listed name of the file a candidate's ``path`` is."""
        for name, joined in self.joined.items():
            if joined == path:
                return name
        return os.path.basename(path.rstrip("/"))


def scan_folder(folder: str | Folder) -> FolderScan:
    """List ``folder`` (never recursing) into index files, checkpoint candidates and other regular files.

    ``folder`` is a ``ckptfs.sources.Folder`` (a local directory, or a remote model folder) or a local path.
    A regular file is anything the folder lists as one, symlinks to files included (HF snapshots); an
    entry that is neither a file nor a folder (a dangling link, a socket) is reported as broken.
    """
    if isinstance(folder, str):
        folder = LocalFolder(folder)
    files = folder.list()
    names = sorted(files, key=natural_key)
    broken: list[str] = sorted(folder.broken(), key=natural_key)
    indexes: list[str] = []
    singles: list[str] = []
    sets: dict[tuple[str, int, str], list[str]] = {}
    others: list[str] = []
    join = folder.join
    for name in names:
        if is_index_name(name):
            indexes.append(name)
        elif is_checkpoint_name(name):
            shard = parse_shard_name(name)
            if shard is None:
                singles.append(name)
            else:
                sets.setdefault((shard.prefix, shard.count, shard.ext), []).append(name)
        else:
            others.append(name)
    candidates = [Candidate((join(n),), None) for n in singles]
    for members in sets.values():
        members.sort(key=_shard_number)
        candidates.append(Candidate(tuple(join(n) for n in members), parse_shard_name(members[0])))
    candidates.sort(key=lambda c: natural_key(os.path.basename(c.paths[0])))
    joined = {name: join(name) for name in names}
    return FolderScan(folder.name, tuple(indexes), tuple(candidates), tuple(others), tuple(broken),
                      {name: files[name] for name in names},
                      {name: path for name, path in joined.items() if path != os.path.join(folder.name, name)})


def _shard_number(name: str) -> int:
    """The shard number of ``name``, a member of a shard set (so a shard's name)."""
    shard = parse_shard_name(name)
    assert shard is not None
    return shard.number
