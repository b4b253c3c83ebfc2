"""Optional C kernels (``_native``) for the legacy, K-quant and ternary block types and BF16, numpy as fallback.

The numpy decoders are the reference: the C loops compute the same float32 operations in the same order
(built with -ffp-contract=off), and the tests compare both paths bit for bit. The extension is optional:
without a C compiler at install time, or with ``CKPTFS_NO_NATIVE=1`` in the environment (read at import),
every type decodes through numpy. Measured gains are in docs/performance.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

try:
    from ckptfs.quant import _native
except ImportError:  # not built (no compiler at install time, or a source checkout): numpy only
    _native = None  # type: ignore[assignment]  # not built: the Python path serves

Decoder = Callable[[np.ndarray], np.ndarray]

DISABLED = os.environ.get("CKPTFS_NO_NATIVE", "") not in ("", "0")


def native_types() -> frozenset[str]:
    """Types the built extension can decode (empty when it is not built or disabled)."""
    if _native is None or DISABLED:
        return frozenset()
    return frozenset(_native.types())


class NativeDecoder:
    """A C kernel as a codec's ``decode``: it writes into ``out`` when given one (a codec decodes a group
    straight into its destination), and carries the numpy ``reference`` it computes bit for bit the same
    as (a caller can choose the backend per call)."""

    writes_into = True

    def __init__(self, name: str, block_elements: int, reference: Decoder | None = None) -> None:
        self.name = name
        self.block_elements = block_elements
        self.reference = reference
        self.__name__ = f"native_{name.lower()}"

    def __call__(self, blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        blocks = np.ascontiguousarray(blocks)          # the C side needs one flat buffer
        if out is None:
            out = np.empty((blocks.shape[0], self.block_elements), dtype=np.float32)
        _native.dequantize(self.name, blocks, out, blocks.shape[0])
        return out


def kernel(name: str, block_elements: int) -> NativeDecoder | None:
    """The native decoder for ``name`` (same contract as a codec's ``decode``), or None."""
    if name not in native_types():
        return None
    return NativeDecoder(name, block_elements)


def accelerated(name: str, block_elements: int, fallback: Decoder) -> Decoder:
    """The native decoder when available (carrying ``fallback`` as its ``reference``), else ``fallback``
    (the numpy reference)."""
    native = kernel(name, block_elements)
    if native is None:
        return fallback
    native.reference = fallback
    return native


def encode_bf16(values: np.ndarray, out: np.ndarray) -> bool:
    """float32 ``values`` (C-contiguous) as bfloat16 bit patterns into ``out`` (uint16, as many), rounded to
    nearest even, NaN as 0xFFFF, by the C loop; False (``out`` untouched) when the extension is not there."""
    if _native is None or DISABLED or not hasattr(_native, "encode_bf16"):  # probe: platform (an older build)
        return False
    _native.encode_bf16(values, out, values.size)
    return True
