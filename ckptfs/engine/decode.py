"""The one place stored bytes become served values, for every reader of tensor values.

The block engine's cached groups (``ckptfs.engine.blocks``), whole-tensor and row reads, and the batches of
``load``/``load_batch``/``to_torch`` (``ckptfs.engine.batch``) all decode through :func:`decode_blocks`:
big-endian blocks are swapped first, then the codec decodes straight into the caller's buffer where its
output already is the served dtype (``Codec.dequantize_into``: the C kernel writes there when one exists,
the backend chosen there once), else it decodes and the values are cast into place (float16 mode: values
beyond float16's range become inf, as numpy casts them, silently).

Decoders that do not fit a codec's blocks-in, values-out shape are backends registered here by name, by
the feature that brings them, when its module is imported (the engine imports no feature):

- a *device* backend decodes stored blocks where the values are going (``ckptfs.torchio.kernels``, "torch":
  torch operations on a GPU, bit-exact with the codecs). :func:`device_backend` says whether it takes a
  tensor's blocks (little-endian ones only: a device kernel does not swap) or they decode on the host here;
- a *parts* backend computes a virtual tensor's rows from several stored parts (``ckptfs.packed``,
  "packed": a GPTQ/AWQ/compressed-tensors layer's weight from its packed integers, zero points and scales,
  by the layer's C kernel or numpy). Its tiles decode through :func:`decode_parts`.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

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


# ------------------------------------------------------------------------------------ registered backends


class DeviceBackend(Protocol):
    """Stored blocks decoded on a device: ``dequantize`` takes the device's ``u8[n, block_bytes]`` (whole
    little-endian blocks) and returns ``[n, block_elements]`` values there."""

    def has_kernel(self, storage_type: str) -> bool: ...

    def dequantize(self, storage_type: str, blocks: Any) -> Any: ...


class PartsBackend(Protocol):
    """A virtual tensor's rows [o0, o1) from its stored parts: ``layout`` says how (the scheme's own
    description), ``parts`` reads them; written into ``out`` (and returned as a view of it) when given,
    ``backend`` the host kernel's choice (None/"auto", "numpy", "native")."""

    def decode_rows(self, layout: Any, parts: Any, o0: int, o1: int, out: np.ndarray | None,
                    backend: str | None) -> np.ndarray: ...


_lock = threading.Lock()
_device: dict[str, DeviceBackend] = {}
_parts: dict[str, PartsBackend] = {}


def register_device_backend(name: str, backend: DeviceBackend) -> None:
    """Register (or replace) the device backend ``name``: done by its module when imported."""
    with _lock:
        _device[name] = backend


def register_parts_backend(name: str, backend: PartsBackend) -> None:
    """Register (or replace) the parts backend ``name``: done by its module when imported."""
    with _lock:
        _parts[name] = backend


def device_backend(name: str, codec: Codec | None, info: TensorInfo) -> DeviceBackend | None:
    """The device backend ``name`` when it decodes ``info``'s blocks with ``codec`` (registered, a kernel for
    the type, little-endian blocks); None: they decode on the host (:func:`decode_blocks`)."""
    backend = _device.get(name)
    if backend is None or codec is None or info.byte_order != "<" or not backend.has_kernel(codec.name):
        return None
    return backend


def decode_parts(name: str, layout: Any, parts: Any, o0: int, o1: int, out: np.ndarray | None = None,
                 backend: str | None = None) -> np.ndarray:
    """Rows [o0, o1) of a virtual tensor computed by the parts backend ``name`` (see :class:`PartsBackend`);
    LookupError when no module registered it."""
    decoder = _parts.get(name)
    if decoder is None:
        raise LookupError(f"no decode backend {name!r} registered (its module was not imported)")
    return decoder.decode_rows(layout, parts, o0, o1, out, backend)
