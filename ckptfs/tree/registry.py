"""The registry of file views: the folders and files a feature adds to a mount (``hf/``, ``gguf/model.gguf``,
the merged ``model.gguf`` of a split GGUF set), so the mount asks for them by name and imports none of them.

A feature registers itself in its own module with :func:`register_provider`: a name (the mount's flag that
asks for it, ``hf`` for ``--hf``), a factory ``factory(required=..., **settings) -> Provider`` (``required``: the
view belongs to the one checkpoint mounted, so a view that cannot be built fails the mount; ``tree.optional``),
whether every mount gets it, and optionally what ``ckptfs info`` says of it for a checkpoint. The built-in
views are listed here by the module that registers them, and a module is imported only when its view is
asked for: a plain local mount imports only the merged ``model.gguf``'s (which needs nothing optional), never
the ``hf/`` or ``gguf/`` features and the libraries they import on first use (transformers, torch). The
same seam as ``core.features`` for the checkpoint's features and ``quant.register_codec`` for codecs.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.tree.mount_tree import Provider

__all__ = ["FileViews", "register_provider", "providers_for", "describe"]


@dataclass(frozen=True)
class FileViews:
    """One registered kind of view: how to make its provider, and what ``ckptfs info`` says of it."""

    name: str
    factory: Callable[..., Provider]  # factory(required=..., **settings) -> Provider
    always: bool = False  # in every mount (model.gguf of a split set), not only when asked for
    #: what ``ckptfs info --NAME`` says for a checkpoint: available and how big, or none and why (None: says nothing)
    describe: Callable[[Checkpoint], str | None] | None = None


#: name -> (the module that registers it when imported, whether every mount has it): in the order the mount
#: composes them, so an earlier view keeps a name two of them give (``MountTree``)
_BUILTIN: dict[str, tuple[str, bool]] = {
    "model.gguf": ("ckptfs.ggufmerge.provider", True),
    "hf": ("ckptfs.hffolder.provider", False),
    "gguf": ("ckptfs.ggufview.provider", False),
}
_registered: dict[str, FileViews] = {}
_lock = threading.Lock()


def register_provider(name: str, factory: Callable[..., Provider], always: bool = False,
                      describe: Callable[[Checkpoint], str | None] | None = None) -> None:
    """Make the mount's view ``name`` the providers ``factory`` makes (replacing a registered one)."""
    with _lock:
        _registered[name] = FileViews(name, factory, always, describe)


def _views(name: str) -> FileViews:
    """The registration of ``name``, importing a built-in's module on first use (KeyError: no such view)."""
    views = _registered.get(name)
    if views is None:
        module, _ = _BUILTIN[name]
        importlib.import_module(module)
        views = _registered[name]  # the module registers it on import
    return views


def providers_for(wanted: Mapping[str, Mapping[str, Any]], required: bool = False) -> list[Provider]:
    """The providers of a mount: every view that is in every mount, and each view ``wanted`` names with its
    settings (``{"hf": {"dtype": "bfloat16"}}``), built-ins first in their order, then the others in the
    order registered. A name nobody registered is a KeyError (the mount asks only for its own flags)."""
    with _lock:
        others = [name for name in _registered if name not in _BUILTIN]
    names = [name for name, (_, always) in _BUILTIN.items() if always or name in wanted]
    names += [name for name in others if name in wanted or _registered[name].always]
    unknown = set(wanted) - set(names)
    if unknown:
        raise KeyError(f"no file view registered as {', '.join(sorted(unknown))}")
    return [_views(name).factory(required=required, **wanted.get(name, {})) for name in names]


def describe(name: str, ck: Checkpoint) -> str | None:
    """What ``ckptfs info --NAME`` says of view ``name`` for ``ck`` (None: nothing to say for this checkpoint)."""
    views = _views(name)
    return None if views.describe is None else views.describe(ck)
