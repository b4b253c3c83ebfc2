"""The mount-tree provider of ``hf/`` (opt-in, ``--hf``).

``hf_provider(dtype)`` builds the folder when the mount is set up, so a GGUF that transformers cannot map,
or a machine without transformers, gets no ``hf/``, with one line saying why: the mount's error when the GGUF
is the one checkpoint mounted (``required``), a log line for a member of a repository (``tree.optional``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.tree.mount_tree import Entry, Provider
from ckptfs.tree.optional import built_or_logged, refused
from ckptfs.hffolder import Unsupported, unavailable_reason

log = logging.getLogger("ckptfs.hffolder")

HF_DIR = "hf"


def hf_provider(dtype: str = "bfloat16", required: bool = False) -> Provider:
    """A provider of ``hf/`` (config, tokenizer, model.safetensors in ``dtype``); ``required``: a GGUF that
    cannot have it fails the tree (``tree.optional``)."""

    def provider(ck: Checkpoint) -> Iterable[Entry]:
        reason = unavailable_reason(ck)
        if reason is not None:
            refused(HF_DIR, reason, ck.src, required, log)
            return []
        from ckptfs.hffolder.folder import HfFolder

        folder = built_or_logged(HF_DIR, lambda: HfFolder(ck, dtype), Unsupported, log, ck.src, required)
        if folder is None:
            return []
        return [Entry(f"{HF_DIR}/{name}", "hf", functools.partial(folder.__getitem__, name)) for name in folder]

    return provider
