"""``model.gguf`` in the mount of a complete split GGUF set: the shards merged into one GGUF file (it needs
nothing optional). Every mount has it (registered as ``model.gguf`` in ``tree.registry``)."""

from __future__ import annotations

import functools
from collections.abc import Iterable

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.ggufmerge.view import MERGED_FILE, MergedGgufView, why_not_merged
from ckptfs.tree.mount_tree import Entry, Provider
from ckptfs.tree.registry import register_provider


def merged_gguf(ck: Checkpoint) -> Iterable[Entry]:
    """``model.gguf`` for a complete split GGUF set; nothing for anything else."""
    if why_not_merged(ck) is not None:
        return []
    return [Entry(MERGED_FILE, "file", functools.partial(MergedGgufView, ck))]


def _merged_provider(required: bool = False) -> Provider:
    """The provider, whatever the mount: a checkpoint that is not a split set simply has no ``model.gguf``."""
    return merged_gguf


register_provider("model.gguf", _merged_provider, always=True)
