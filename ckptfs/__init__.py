"""ckptfs: LLM checkpoints (GGUF, safetensors) as lazy tensors and as a read-only FUSE filesystem.

``ckptfs.open(path)[name]`` is a lazy tensor; ``ckptfs mount`` serves the same data as NAME.npy /
NAME.raw / NAME.meta.json files. Importing ckptfs never needs libfuse: only a mount does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckptfs.core.errors import CheckpointError
from ckptfs.core.options import OpenOptions

if TYPE_CHECKING:
    from ckptfs.checkpoint.api import Checkpoint, Tensor, open
    from ckptfs.quant import Codec, register_codec

#: Names imported at their first use, not with the package: they bring numpy and the codecs, which a command
#: that starts by talking to a server (``ckptfs prefetch URL``) imports while its first requests are out.
_LAZY = {"open": "ckptfs.checkpoint.api", "Checkpoint": "ckptfs.checkpoint.api", "Tensor": "ckptfs.checkpoint.api",
         "Codec": "ckptfs.quant", "register_codec": "ckptfs.quant"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ckptfs' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = ["open", "load", "load_batch", "hf_folder", "Checkpoint", "Tensor", "OpenOptions", "CheckpointError", "Codec",
           "register_codec", "__version__"]


def load(src, names=None, *, device="cpu", dtype=None):
    """``{name: torch.Tensor}`` of a checkpoint (path or open Checkpoint); needs torch, imported only now.
    See ckptfs.torchio.api.load."""
    from ckptfs.torchio.api import load as load_torch
    return load_torch(src, names, device=device, dtype=dtype)


def load_batch(src, names, *, stack=False):
    """Tensors decoded into one contiguous numpy buffer (numpy only). See ckptfs.engine.batch.load_batch."""
    from ckptfs.checkpoint.api import opened
    from ckptfs.engine.batch import load_batch as load_into_one
    with opened(src) as ck:
        return load_into_one(ck, names, stack=stack)


def hf_folder(src, dtype="bfloat16", **open_kwargs):
    """A GGUF (file, split-set shard or open Checkpoint) as a Hugging Face model folder, or a quantized
    safetensors folder as its unquantized release: file name -> View, ``.read(name)``, ``.write_to(dir)``. A
    GGUF's needs ckptfs[hf], imported only now. See ckptfs.hffolder.hf_folder."""
    from ckptfs.hffolder import hf_folder as make_folder
    return make_folder(src, dtype=dtype, **open_kwargs)
