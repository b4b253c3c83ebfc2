"""Codec registry: one codec per storage type, found only by name.

A codec turns whole stored blocks into values: ``dequantize(u8[n, block_bytes]) -> dtype[n, block_elements]``.
That block-level contract is exactly the unit the block cache works in, so readers, the API and the mount
never know how a type is laid out. Types are keyed by the name the formats use ("Q4_K", "BF16",
"F8_E4M3"); names shared by GGUF and safetensors mean the same thing in both.

Third-party packages add types with :func:`register_codec` or through the entry-point group
``ckptfs.codecs`` (each entry point is a callable that registers its codecs when called, or a Codec).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ckptfs.core.options import DTYPE_MODES
from ckptfs.quant.geometry import GEOMETRY as GEOMETRY, geometry as geometry  # re-exported
from ckptfs.quant.native import NativeDecoder

Decoder = Callable[[np.ndarray], np.ndarray]
_U8 = np.dtype(np.uint8)


@dataclass(frozen=True)
class Codec:
    """How one storage type is laid out and decoded.

    ``exact`` marks types whose stored bytes already are numpy values of ``dtype`` (F32, I8, C64...): their
    ``.npy`` data can be the stored bytes themselves. ``swap`` turns big-endian block bytes into the
    little-endian layout ``decode`` expects; None means big-endian files of this type cannot be decoded.
    """

    name: str
    block_elements: int
    block_bytes: int
    dtype: np.dtype
    decode: Decoder
    exact: bool = False
    swap: Decoder | None = None
    #: the C kernel ``decode`` is, resolved once (it writes into a destination, and knows its reference)
    _native: NativeDecoder | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if isinstance(self.decode, NativeDecoder):
            object.__setattr__(self, "_native", self.decode)

    def decoder(self, backend: str | None = None) -> Decoder:
        """The decode function of ``backend``: None or "auto" (the C kernel where built, else numpy),
        "numpy" (the reference), "native" (the C kernel; ValueError where there is none)."""
        if backend in (None, "auto"):
            return self.decode
        reference = self._native.reference if self._native is not None else None
        if backend == "numpy":
            return reference or self.decode
        if backend == "native":
            if reference is None:
                raise ValueError(f"{self.name}: no native kernel (not built, disabled, or none for this type)")
            return self.decode
        raise ValueError(f"unknown decode backend {backend!r} (auto, numpy, native)")

    def dequantize_into(self, blocks: np.ndarray, out: np.ndarray, backend: str | None = None) -> np.ndarray:
        """Decode whole blocks into ``out`` (``dtype``, C-contiguous, ``n * block_elements`` values) and return
        it: the C kernels write there directly, so a decoded group lands in its destination without a copy;
        the numpy decoders' result is copied in once."""
        decode = self.decoder(backend)
        if (self._native is not None and decode is self._native and out.dtype == self.dtype and out.flags.c_contiguous
                and type(blocks) is np.ndarray and blocks.dtype is _U8 and blocks.ndim == 2
                and blocks.shape[1] == self.block_bytes and out.size == blocks.shape[0] * self.block_elements):
            decode(blocks, out.reshape(blocks.shape[0], self.block_elements))
            return out
        out.reshape(-1)[...] = self.dequantize(blocks, backend).reshape(-1)
        return out

    def dequantize(self, blocks: np.ndarray, backend: str | None = None) -> np.ndarray:
        """Decode ``u8[n, block_bytes]`` (or a flat buffer of whole blocks) into ``dtype[n, block_elements]``.
        ``backend``: see :meth:`decoder`.

        Exact types decode to a zero-copy view in a fraction of a microsecond, so the argument checks must
        cost less than that: the usual input (a uint8 ndarray of the right shape) is recognised from its
        shape and dtype alone, and anything else goes through the converting, validating ``_as_blocks``.
        Non-exact decodes run with floating-point warnings off: NaN/inf scales in random or hostile blocks
        produce the same NaN/inf values ggml does, which are data, not errors (exact types do no arithmetic).
        """
        shape = blocks.shape if type(blocks) is np.ndarray and blocks.dtype is _U8 else ()
        if len(shape) != 2 or shape[1] != self.block_bytes:
            blocks = self._as_blocks(blocks)
            shape = blocks.shape
        decode = self.decode if backend is None else self.decoder(backend)
        if self.exact:
            out = decode(blocks)
        else:
            with np.errstate(all="ignore"):
                out = decode(blocks)
        if out.shape != (shape[0], self.block_elements):   # decode may return the values flat
            out = out.reshape(shape[0], self.block_elements)
        return out

    def _as_blocks(self, blocks: object) -> np.ndarray:
        """Any array or bytes-like input as ``u8[n, block_bytes]``, or ValueError."""
        if isinstance(blocks, (bytes, bytearray, memoryview)):
            blocks = np.frombuffer(blocks, dtype=np.uint8)
        blocks = np.asarray(blocks, dtype=np.uint8)
        if blocks.ndim == 1:
            if blocks.size % self.block_bytes:
                raise ValueError(f"{self.name}: {blocks.size} bytes is not a whole number of "
                                 f"{self.block_bytes}-byte blocks")
            blocks = blocks.reshape(-1, self.block_bytes)
        if blocks.ndim != 2 or blocks.shape[1] != self.block_bytes:
            raise self._shape_error(blocks.shape)
        return blocks

    def _shape_error(self, shape: tuple[int, ...]) -> ValueError:
        return ValueError(f"{self.name}: expected blocks of shape (n, {self.block_bytes}), got {shape}")


_registry: dict[str, Codec] = {}
_lock = threading.Lock()
_builtins_loaded = False
_plugins_loaded = False


def register_codec(codec: Codec, *, replace: bool = False) -> Codec:
    """Make ``codec`` the decoder of ``codec.name``. Refuses to silently replace an existing one, and a codec
    whose block geometry contradicts the table (``geometry.GEOMETRY``) of a type ckptfs knows."""
    known = geometry(codec.name)
    if known is not None and known != (codec.block_elements, codec.block_bytes):
        raise ValueError(f"a {codec.name} block is {known[0]} elements in {known[1]} bytes, not "
                         f"{codec.block_elements} in {codec.block_bytes}")
    with _lock:
        if codec.name in _registry and not replace:
            raise ValueError(f"a codec for {codec.name!r} is already registered (pass replace=True)")
        _registry[codec.name] = codec
    return codec


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    from ckptfs.quant import floats, legacy, kquants, iquants, ternary, fp4, lowbit  # noqa: F401 - self-registering


def _load_plugins() -> None:
    """Import codecs other packages declare under the ``ckptfs.codecs`` entry-point group (once)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="ckptfs.codecs"):
        obj = ep.load()
        if isinstance(obj, Codec):
            register_codec(obj, replace=True)
        elif callable(obj):
            obj()


def codec_for(name: str) -> Codec | None:
    """The codec registered for a storage-type name, or None if no codec knows it."""
    _load_builtins()
    codec = _registry.get(name)
    if codec is None:
        _load_plugins()
        codec = _registry.get(name)
    return codec


def known_types() -> list[str]:
    """Every storage-type name with a codec, built-ins and plugins."""
    _load_builtins()
    _load_plugins()
    return sorted(_registry)


def output_dtype(codec: Codec, mode: str = "auto") -> np.dtype:
    """The numpy dtype a tensor of this codec is served as, under the API/mount ``dtype`` setting.

    auto: exact storage types keep their dtype, everything else is float32. float32: every floating tensor
    is float32 (integers, bools and complex keep theirs). float16: decoded (non-exact) tensors are float16.
    """
    if mode not in DTYPE_MODES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_MODES)}, not {mode!r}")
    if codec.exact:
        if mode == "float32" and codec.dtype.kind == "f":
            return np.dtype("<f4")
        return codec.dtype.newbyteorder("<") if codec.dtype.byteorder == ">" else codec.dtype
    return np.dtype("<f2") if mode == "float16" else np.dtype("<f4")
