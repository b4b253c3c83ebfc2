"""The mount-tree provider of ``hf/`` (opt-in, ``--hf``).

``hf_provider(dtype)`` builds the folder when the mount is set up (a GGUF's, or a quantized folder's release),
so a GGUF that transformers cannot map, a machine without transformers, or a folder that is not quantized gets
no ``hf/``, with one line saying why: the mount's error when the GGUF
is the one checkpoint mounted (``required``), a log line for a member of a repository (``tree.optional``).
Registered as ``hf`` in ``tree.registry``, so this module is imported only by a mount with ``--hf``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.tree.mount_tree import Entry, Provider
from ckptfs.tree.optional import build_or_reason, built_or_logged, refused
from ckptfs.tree.registry import register_provider
from ckptfs.hffolder import Unsupported, build, unavailable_reason

log = logging.getLogger("ckptfs.hffolder")

HF_DIR = "hf"


def hf_provider(dtype: str = "bfloat16", required: bool = False) -> Provider:
    """A provider of ``hf/`` (config, tokenizer, safetensors in ``dtype``); ``required``: a checkpoint that
    cannot have it fails the tree (``tree.optional``). A file passed through unchanged is pinned to its source
    and has its mode; the others are made from the checkpoint's files and the folder's config."""

    def provider(ck: Checkpoint) -> Iterable[Entry]:
        reason = unavailable_reason(ck)
        if reason is not None:
            refused(HF_DIR, reason, ck.src, required, log)
            return []
        folder = built_or_logged(HF_DIR, lambda: build(ck, dtype), Unsupported, log, ck.src, required)
        if folder is None:
            return []
        return [Entry(f"{HF_DIR}/{name}", "hf", functools.partial(folder.__getitem__, name),
                      origin=folder.origins.get(name), made_from=folder.made_from) for name in folder]

    return provider


def availability(ck: Checkpoint) -> str | None:
    """For a GGUF or a safetensors folder: whether a mount with --hf gets an hf/ folder, and if not, why (None
    for other formats; ``ckptfs info --hf``). The folder is built as the mount builds it (a GGUF's config,
    tokenizer and tensor plan: seconds for a big vocabulary; a quantized folder's release), so "available" is
    what the mount then serves."""
    if ck.format not in ("gguf", "safetensors"):
        return None
    reason = unavailable_reason(ck)
    if reason is None:
        folder, reason, _ = build_or_reason(lambda: build(ck), Unsupported, log)
        if folder is not None:
            return f"available (mount with --hf): {len(folder)} files"
    return f"none: {reason}"


register_provider("hf", hf_provider, describe=availability)
