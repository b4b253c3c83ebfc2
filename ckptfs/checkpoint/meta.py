"""The schema of a tensor's ``NAME.meta.json`` (docs/reference/layout.md), in one place.

``Tensor.meta`` (the API) and the mount's ``.meta.json`` files both come from here; a virtual tensor (a
GPTQ/AWQ view) describes itself with its own ``meta``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckptfs.engine.views import npy_header
from ckptfs.util.redact import public_name

if TYPE_CHECKING:
    from ckptfs.engine.batch import Tensor  # what a tensor's meta is made of (api.py imports this module)


def tensor_meta(tensor: Tensor) -> dict[str, Any]:
    """The dict ``NAME.meta.json`` holds (docs/reference/layout.md)."""
    info = tensor.info
    meta: dict[str, Any] = {
        "name": info.name,
        "storage_type": info.storage_type,
        "shape": list(info.shape),
        "npy_dtype": tensor.dtype.str if tensor.dtype is not None else None,
        "npy_data_offset": len(npy_header(info.shape, tensor.dtype)) if tensor.dtype is not None else None,
        "npy_nbytes": tensor.nbytes,
        "source": public_name(info.source),  # readable by others under allow_other: no URL credentials
        "offset": info.offset,
        "stored_nbytes": info.stored_nbytes,
        "block_elements": info.block_elements,
        "block_bytes": info.block_bytes,
        "byte_order": "big" if info.byte_order == ">" else "little",
    }
    if info.gguf_dims is not None:
        meta["gguf_dims"] = list(info.gguf_dims)
    meta["damaged"] = info.damaged
    return meta
