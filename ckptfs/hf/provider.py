"""Mount-tree providers for the virtual files of issue 17: ``hf/`` (opt-in, ``--hf``) and ``model.gguf``.

``hf_provider(dtype)`` builds the folder when the mount is set up, so a GGUF that transformers cannot map,
or a machine without transformers, gets no ``hf/`` and one log line saying why; it never stops the mount.
``merged_gguf`` adds ``model.gguf`` to the mount of a complete split GGUF set (it needs nothing optional).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable

from ckptfs.checkpoint import Checkpoint
from ckptfs.tree import Entry, Provider
from ckptfs.hf import Unsupported, unavailable_reason
from ckptfs.hf.gguf_merge import MERGED_FILE, MergedGgufView, why_not_merged

log = logging.getLogger("ckptfs.hf")

HF_DIR = "hf"


def hf_provider(dtype: str = "bfloat16") -> Provider:
    """A provider of ``hf/`` (config, tokenizer, model.safetensors in ``dtype``)."""

    def provider(ck: Checkpoint) -> Iterable[Entry]:
        reason = unavailable_reason(ck)
        if reason is not None:
            log.warning("no %s/ folder: %s", HF_DIR, reason)
            return []
        from ckptfs.hf.folder import HfFolder

        try:
            folder = HfFolder(ck, dtype)
        except Unsupported as exc:
            log.warning("no %s/ folder: %s", HF_DIR, exc)
            return []
        except Exception as exc:  # noqa: BLE001 - a bug in the optional folder must not stop the mount
            log.debug("building %s/ failed", HF_DIR, exc_info=True)
            log.error("no %s/ folder: unexpected %s: %s", HF_DIR, type(exc).__name__, exc)
            return []
        return [Entry(f"{HF_DIR}/{name}", "hf", functools.partial(folder.__getitem__, name)) for name in folder]

    return provider


def merged_gguf(ck: Checkpoint) -> Iterable[Entry]:
    """``model.gguf`` for a complete split GGUF set; nothing for anything else."""
    if why_not_merged(ck) is not None:
        return []
    return [Entry(MERGED_FILE, "file", functools.partial(MergedGgufView, ck))]
