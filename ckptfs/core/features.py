"""Features that attach to checkpoints and tensors without the checkpoint layer importing them.

The checkpoint is the core object; GPTQ/AWQ views, manifest-checked reads and torch conversion are features
built on top of it. The checkpoint names what it needs by a feature name, and the feature's module is
imported only when that feature is first used, so a plain local open imports none of them (and importing
ckptfs never imports torch). A package can replace or add a feature with :func:`register_feature`.

Built in:

- ``checked_reads(manifest, parsed) -> wrapper``: a source wrapper checking reads against a manifest
- ``packed_views(checkpoint)``: adds the GPTQ/AWQ/compressed-tensors views of a quantized model folder
- ``to_torch(tensor, device, dtype, rows=None)``: a tensor as a torch.Tensor
"""

from __future__ import annotations

from typing import Any
import importlib
import threading
from collections.abc import Callable

_BUILTIN = {
    "checked_reads": "ckptfs.integrity.checked:checked_wrapper",
    "packed_views": "ckptfs.packed:attach",
    "to_torch": "ckptfs.torchio.api:to_torch",
}
_registered: dict[str, Callable[..., Any]] = {}
_lock = threading.Lock()


def register_feature(name: str, implementation: Callable[..., Any]) -> None:
    """Make ``feature(name)`` return ``implementation``."""
    with _lock:
        _registered[name] = implementation


def feature(name: str) -> Callable[..., Any]:
    """The implementation of feature ``name``, importing its module on first use (ImportError as raised)."""
    implementation = _registered.get(name)
    if implementation is None:
        module, _, attribute = _BUILTIN[name].partition(":")
        implementation = getattr(importlib.import_module(module), attribute)
        register_feature(name, implementation)
    return implementation
