"""The mount-tree provider of ``hf/`` (opt-in, ``--hf``).

``hf_provider(dtype)`` builds the folder when the mount is set up, so a GGUF that transformers cannot map,
or a machine without transformers, gets no ``hf/`` and one log line saying why; it never stops the mount.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.tree.mount_tree import Entry, Provider
from ckptfs.tree.optional import built_or_logged
from ckptfs.hffolder import Unsupported, unavailable_reason

log = logging.getLogger("ckptfs.hffolder")

HF_DIR = "hf"


def hf_provider(dtype: str = "bfloat16") -> Provider:
    """A provider of ``hf/`` (config, tokenizer, model.safetensors in ``dtype``)."""

    def provider(ck: Checkpoint) -> Iterable[Entry]:
        reason = unavailable_reason(ck)
        if reason is not None:
            log.warning("no %s/ folder: %s", HF_DIR, reason)
            return []
        from ckptfs.hffolder.folder import HfFolder

        folder = built_or_logged(HF_DIR, lambda: HfFolder(ck, dtype), Unsupported, log)
        if folder is None:
            return []
        return [Entry(f"{HF_DIR}/{name}", "hf", functools.partial(folder.__getitem__, name)) for name in folder]

    return provider
