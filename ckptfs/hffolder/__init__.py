"""A GGUF as a Hugging Face model folder (``hf/`` in a mount with ``--hf``; ``ckptfs.hf_folder(src)``).

Needs the optional extra ``ckptfs[hf]`` (transformers, torch, gguf-py's tables); ``import ckptfs`` never
imports this package's dependencies, and neither does a mount without ``--hf``.
"""

from __future__ import annotations

import importlib.util
import sys

from ckptfs.hffolder.config import Unsupported

INSTALL_HINT = "pip install 'ckptfs[hf]' (transformers, torch and gguf)"
__all__ = ["HfFolder", "Unsupported", "hf_folder", "missing_packages", "unavailable_reason", "INSTALL_HINT"]


def missing_packages() -> list[str]:
    """The packages hf/ needs that are not installed."""
    return [name for name in ("transformers", "torch", "gguf") if not _importable(name)]


def _importable(name: str) -> bool:
    if name in sys.modules:  # None there means the import is blocked
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def unavailable_reason(checkpoint) -> str | None:
    """Why this checkpoint gets no hf/ folder (one line), or None when it gets one. Cheap: builds nothing."""
    if checkpoint.format != "gguf":
        return f"hf/ is made from GGUF checkpoints; this one is {checkpoint.format}"
    missing = missing_packages()
    if missing:
        return f"{', '.join(missing)} not installed: {INSTALL_HINT}"
    from ckptfs.hffolder.config import check_supported

    try:
        check_supported(checkpoint.metadata)
    except Unsupported as exc:
        return str(exc)
    return None


def hf_folder(src, dtype: str = "bfloat16", **open_kwargs):
    """``src`` (a GGUF file or any shard of a split set) as an HfFolder: file name -> View, ``.read(name)``,
    ``.write_to(directory)``. Raises Unsupported (one line) when transformers cannot map the architecture."""
    from ckptfs.checkpoint.api import Checkpoint, open as open_checkpoint
    from ckptfs.hffolder.folder import HfFolder

    missing = missing_packages()
    if missing:
        raise Unsupported(f"{', '.join(missing)} not installed: {INSTALL_HINT}")
    checkpoint = src if isinstance(src, Checkpoint) else open_checkpoint(src, **open_kwargs)
    try:
        folder = HfFolder(checkpoint, dtype)
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
