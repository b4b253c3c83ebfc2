"""The schema of a tensor's ``NAME.meta.json`` (docs/reference/layout.md), in one place.

``Tensor.meta`` (the API) and the mount's ``.meta.json`` files both come from here; a virtual tensor (a
GPTQ/AWQ view) describes itself with its own ``meta``.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Any

from ckptfs.engine.views import npy_header
from ckptfs.util.redact import public_name

if TYPE_CHECKING:
    from ckptfs.engine.batch import Tensor  # what a tensor's meta is made of (api.py imports this module)


#: tensors llama.cpp loads beside a GGUF weight ``X.weight`` as ``X.SUFFIX``, and the meta.json key naming each
GGUF_COMPANIONS = {"scale": "companion_scale", "input_scale": "input_scale"}


def tensor_meta(tensor: Tensor, names: Container[str] = ()) -> dict[str, Any]:
    """The dict ``NAME.meta.json`` holds (docs/reference/layout.md); ``names``: the checkpoint's tensor names
    (where a GGUF weight's companions are looked up)."""
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
        meta.update(gguf_companions(info.name, names))
    meta["damaged"] = info.damaged
    return meta


def gguf_companions(name: str, names: Container[str]) -> dict[str, str]:
    """The companion tensors of GGUF weight ``name`` that the checkpoint stores, by meta.json key.

    A GGUF converted from ModelOpt NVFP4 may carry ``X.scale`` (F32, one value, or one per expert for
    ``*_exps``: the second-level scale, which llama.cpp multiplies into the layer's output; the converter
    leaves it out when it is all 1.0) and ``X.input_scale`` (the activations' scale, never applied to the
    weight). ``X.weight.npy`` holds the stored weight's values without either; its meta.json names them."""
    if not name.endswith(".weight"):
        return {}
    base = name[:-len(".weight")]
    return {key: f"{base}.{suffix}" for suffix, key in GGUF_COMPANIONS.items() if f"{base}.{suffix}" in names}
