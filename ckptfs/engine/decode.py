"""The one place stored blocks become served values, for every reader of tensor values.

The block engine's cached groups (``ckptfs.engine.blocks``), whole-tensor and row reads, and the batches of
``load``/``load_batch``/``to_torch`` (``ckptfs.engine.batch``) all decode through :func:`decode_blocks`:
big-endian blocks are swapped first, then the codec decodes straight into the caller's buffer where its
output already is the served dtype (``Codec.dequantize_into``: the C kernel writes there when one exists,
the backend chosen there once), else it decodes and the values are cast into place (float16 mode: values
beyond float16's range become inf, as numpy casts them, silently).
"""

from __future__ import annotations

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.quant import Codec


def decode_blocks(codec: Codec, info: TensorInfo, raw: bytes | memoryview, dtype: np.dtype, out: np.ndarray | None = None,
                  backend: str | None = None) -> np.ndarray:
    """Whole stored blocks ``raw`` (bytes-like, a multiple of ``info.block_bytes``) of tensor ``info``
    decoded with ``codec`` as flat ``dtype`` values, into ``out`` when given (a new array otherwise)."""
    n = len(raw) // info.block_bytes
    blocks = np.frombuffer(raw, np.uint8).reshape(n, info.block_bytes)
    if info.byte_order == ">":
        if codec.swap is None:  # decode_plan serves such a tensor raw only
            raise ValueError(f"{codec.name}: big-endian blocks cannot be decoded")
        blocks = codec.swap(blocks)
    dtype = np.dtype(dtype)
    if codec.dtype == dtype:
        if out is None:
            out = np.empty(n * info.block_elements, dtype)
        return codec.dequantize_into(blocks, out, backend)
    values = codec.dequantize(blocks, backend).reshape(-1)
    with np.errstate(over="ignore"):
        if out is None:
            return values.astype(dtype)
        out[...] = values
    return out
