"""A checkpoint as a Hugging Face model folder (``hf/`` in a mount with ``--hf``; ``ckptfs.hf_folder(src)``):
a GGUF as the folder transformers would build from it, a quantized safetensors folder as its unquantized
release.

A GGUF's folder needs the optional extra ``ckptfs[hf]`` (transformers, torch, gguf-py's tables); the release of
a quantized folder needs nothing more than ckptfs. ``import ckptfs`` never imports these dependencies, and
neither does a mount without ``--hf``.
"""

from __future__ import annotations

import importlib.util
import sys

from ckptfs.hffolder.config import Unsupported

INSTALL_HINT = "pip install 'ckptfs[hf]' (transformers, torch and gguf)"
__all__ = ["HfFolder", "Unsupported", "build", "hf_folder", "missing_packages", "unavailable_reason", "INSTALL_HINT"]


def missing_packages() -> list[str]:
    """The packages hf/ needs that are not installed."""
    return [name for name in ("transformers", "torch", "gguf") if not _importable(name)]


def _importable(name: str) -> bool:
    if name in sys.modules:  # None there means the import is blocked
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def unavailable_reason(checkpoint) -> str | None:
    """Why this checkpoint gets no hf/ folder (one line), or None when it gets one. Cheap: builds nothing.
    A GGUF's folder needs transformers; a quantized safetensors folder's release (``dense``) needs none."""
    if checkpoint.format == "safetensors":
        from ckptfs.hffolder.dense import release_problem

        return release_problem(checkpoint)
    if checkpoint.format != "gguf":
        return f"hf/ is made from a GGUF or a quantized safetensors folder; this is {checkpoint.format}"
    missing = missing_packages()
    if missing:
        return f"{', '.join(missing)} not installed: {INSTALL_HINT}"
    from ckptfs.hffolder.config import check_supported

    try:
        check_supported(checkpoint.metadata)
    except Unsupported as exc:
        return str(exc)
    return None


def build(checkpoint, dtype: str = "bfloat16"):
    """The hf/ folder of ``checkpoint``: a GGUF's (``folder.HfFolder``) or a quantized safetensors folder's
    unquantized release (``dense.DenseFolder``); Unsupported (one line) when it has none."""
    if checkpoint.format == "safetensors":
        from ckptfs.hffolder.dense import DenseFolder

        return DenseFolder(checkpoint, dtype)
    from ckptfs.hffolder.folder import HfFolder

    return HfFolder(checkpoint, dtype)


def hf_folder(src, dtype: str = "bfloat16", **open_kwargs):
    """``src`` as an hf/ folder: file name -> View, ``.read(name)``, ``.write_to(directory)``. ``src``: a GGUF
    file or any shard of a split set (a folder transformers can load, needs ckptfs[hf]), or a quantized
    safetensors folder (its unquantized release; needs nothing more). Raises Unsupported (one line) when it
    has none (an architecture transformers cannot map, a folder that is not quantized...)."""
    from ckptfs.checkpoint.api import Checkpoint, open as open_checkpoint

    checkpoint = src if isinstance(src, Checkpoint) else open_checkpoint(src, **open_kwargs)
    try:
        reason = unavailable_reason(checkpoint)
        if reason is not None:
            raise Unsupported(reason)
        folder = build(checkpoint, dtype)
        folder.owns_checkpoint = checkpoint is not src
        return folder
    except BaseException:
        if checkpoint is not src:
            checkpoint.close()
        raise


def __getattr__(name: str):
    if name == "HfFolder":
        from ckptfs.hffolder.folder import HfFolder

        return HfFolder
    raise AttributeError(name)
