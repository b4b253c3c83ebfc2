"""A folder that holds several checkpoints: a *repository* (several GGUF quantizations side by side, a GGUF
beside a safetensors model, an mmproj file, several index files), as model hubs hold them.

``ckptfs.open`` returns one Checkpoint, so it refuses such a folder: guessing would serve another model than
the one meant. The refusal, :class:`SeveralCheckpoints`, is a ``CheckpointError`` that carries the
:class:`Repository` the folder scan found, so ``ckptfs mount`` (every file, plus each checkpoint's views in a
folder of its own) and ``ckptfs info`` (the list) use the folder without listing it a second time.

A repository is its files — every regular file the folder lists, under its own name — and its members, one
per checkpoint, each with what ``ckptfs.open`` is given to open it alone and the name of its folder in a
mount (docs/multifile.md, "Repositories"):

- a single file: its name without ``.gguf`` / ``.safetensors`` (``gemma-Q4_K_M.gguf`` -> ``gemma-Q4_K_M``);
- a split GGUF set: the shards' prefix (``gemma-Q8_0-00001-of-00002.gguf`` -> ``gemma-Q8_0``);
- an index file's set: the index's name without ``.safetensors.index.json`` (``model``).

A name taken by a file of the folder or by an earlier member (``model.gguf`` beside ``model.safetensors``)
gets ``~2``, ``~3``... Members come in the folder scan's order: index files first, then the other candidates.
A safetensors shard set without an index is not a member (naming a shard serves that shard alone): its files
are in the repository, and a note says so. Candidates whose files an index names belong to that index's set.
"""

from __future__ import annotations

from typing import Any
from dataclasses import dataclass

from ckptfs.core.errors import CheckpointError
from ckptfs.formats.safetensors_set import read_index
from ckptfs.formats.shards import INDEX_SUFFIX, FolderScan

_CHECKPOINT_SUFFIXES = (".gguf", ".safetensors")


@dataclass(frozen=True)
class Member:
    """One checkpoint of a repository."""

    name: str                 # its folder in a mount
    src: str                  # what ckptfs.open is given to open it alone (a file, a shard, an index file)
    files: tuple[str, ...]    # the repository's files that are this checkpoint's (names in the folder)
    label: str                # how messages name it

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "src": self.src, "files": list(self.files), "label": self.label}


@dataclass(frozen=True)
class Repository:
    """A folder's files (name -> (path or URL, size; -1 when the listing does not say)) and checkpoints."""

    folder: str
    files: dict[str, tuple[str, int]]
    members: tuple[Member, ...]
    notes: tuple[str, ...] = ()

    def owner(self) -> dict[str, int]:
        """File name -> the index of the member it belongs to (files of no checkpoint are absent)."""
        return {name: i for i, member in enumerate(self.members) for name in member.files}


class SeveralCheckpoints(CheckpointError):
    """The folder holds several checkpoints: name one (``ckptfs.open``), or mount the folder whole."""

    def __init__(self, repository: Repository, reason: str) -> None:
        super().__init__(repository.folder, None, reason)
        self.repository = repository

    def __reduce__(self) -> tuple[Any, ...]:
        return (CheckpointError, (self.file, self.offset, self.reason))


def _stem(name: str) -> str:
    if name.endswith(INDEX_SUFFIX):
        return name[:-len(INDEX_SUFFIX)]
    for suffix in _CHECKPOINT_SUFFIXES:
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def repository_of(scan: FolderScan) -> Repository:
    """The repository a folder scan describes (see the module docstring)."""
    files = {name: (scan.path(name), size) for name, size in scan.sizes.items()}
    taken = set(files)
    members: list[Member] = []
    notes: list[str] = []

    def add(base: str, src: str, names: list[str], label: str) -> None:
        name, n = base or "checkpoint", 1
        while name in taken:
            n += 1
            name = f"{base}~{n}"
        taken.add(name)
        members.append(Member(name, src, tuple(names), label))

    indexed: set[str] = set()
    for index_name in scan.indexes:
        index = read_index(scan.path(index_name))
        shards = [f for f in index.shard_files() if f in files]
        indexed.update(shards)
        add(_stem(index_name), scan.path(index_name), [index_name, *shards], index_name)
    for candidate in scan.candidates:
        names = [scan.name_of(p) for p in candidate.paths]
        if any(n in indexed for n in names):
            continue
        if candidate.shard is not None and candidate.shard.ext == "safetensors":
            notes.append(f"{candidate.label} has no index file: its files are served, its tensors only "
                         f"shard by shard (name one shard to mount it alone)")
            continue
        base = candidate.shard.prefix if candidate.shard is not None else _stem(names[0])
        add(base, candidate.paths[0], names, candidate.label)
    return Repository(scan.folder, files, tuple(members), tuple(notes))


def several_checkpoints(scan: FolderScan) -> SeveralCheckpoints:
    """The refusal of a folder holding several checkpoints, listing them, with the repository it is."""
    repository = repository_of(scan)
    if len(scan.indexes) > 1:
        what = f"{len(scan.indexes)} index files ({', '.join(scan.indexes)}): name the one to open"
    else:
        labels = "; ".join(c.label for c in scan.candidates)
        what = (f"{len(scan.candidates)} checkpoints ({labels}): name one file (a shard of a split GGUF stands "
                f"for its set) or an index file")
    return SeveralCheckpoints(repository, f"holds {what}; `ckptfs mount` mounts the folder whole, each "
                                          f"checkpoint in a folder of its own")
