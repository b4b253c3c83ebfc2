"""The mount-tree provider of ``gguf/model.gguf`` (opt-in, ``--gguf``).

The header is built when the mount is set up, so a folder it cannot serve (an architecture not in the
table, a tokenizer not handled, a hostile file, a machine without ``ckptfs[gguf]``) gets no ``gguf/``, with
one line saying why: the mount's error when the folder is the one checkpoint mounted (``required``), a log
line for a member of a repository (``tree.optional``). Registered as ``gguf`` in ``tree.registry``, so this
module is imported only by a mount with ``--gguf``.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Iterable

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.ggufview import GGUF_DIR, GGUF_FILE, Unsupported
from ckptfs.tree.mount_tree import Entry, Provider
from ckptfs.tree.optional import build_or_reason, built_or_logged
from ckptfs.tree.registry import register_provider

log = logging.getLogger("ckptfs.ggufview")


def unavailable_reason() -> str | None:
    """Why no folder can get ``gguf/`` on this machine (None when the optional libraries are installed).
    transformers is looked up, not imported: importing it (torch with it) costs a mount seconds, and a
    folder whose ``tokenizer.json`` is read directly never needs it."""
    try:
        import gguf  # noqa: F401 - installed? (imported for its answer, not its names)
    except ImportError as exc:
        return f"{exc.name} is not installed: pip install 'ckptfs[gguf]'"
    if not _installed("transformers"):
        return "transformers is not installed: pip install 'ckptfs[gguf]'"
    return None


def _installed(name: str) -> bool:
    """``name`` can be imported (a ``None`` in ``sys.modules`` blocks an import, as a missing module)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def build_view(ck: Checkpoint, output_type: str, fp8_as_q8: bool = False):
    """The view, or Unsupported with the reason."""
    reason = unavailable_reason()
    if reason is not None:
        raise Unsupported(reason)
    from ckptfs.ggufview.view import VirtualGgufView

    return VirtualGgufView(ck, output_type, fp8_as_q8)


def gguf_provider(output_type: str = "auto", required: bool = False, fp8_as_q8: bool = False) -> Provider:
    """A provider of ``gguf/model.gguf`` in ``output_type`` (auto, f32, f16, bf16, q8_0); ``required``: a
    folder that cannot have it fails the tree (``tree.optional``); ``fp8_as_q8``: a quantized folder's FP8
    layers in Q8_0 (the converter's ``--fp8-as-q8``)."""

    def provider(ck: Checkpoint) -> Iterable[Entry]:
        view = built_or_logged(GGUF_DIR, lambda: build_view(ck, output_type, fp8_as_q8), Unsupported, log, ck.src, required)
        if view is None:
            return []
        return [Entry(f"{GGUF_DIR}/{GGUF_FILE}", "file", lambda: view, made_from=view.made_from)]

    return provider


def availability(ck: Checkpoint) -> str:
    """Whether a mount with --gguf gets gguf/model.gguf (its header built as the mount builds it), or why not
    (``ckptfs info --gguf``)."""
    view, reason, _ = build_or_reason(lambda: build_view(ck, "auto"), Unsupported, log)
    if view is None:
        return f"none: {reason}"
    return f"available (mount with --gguf): {len(view.plans)} tensors, {view.size} bytes in the auto type"


register_provider("gguf", gguf_provider, describe=availability)
