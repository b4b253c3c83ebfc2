"""Decoding one storage type through each of its paths, for the codec tests: the registry (what readers
use), the pure-numpy decoder, and the optional C kernel."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from ckptfs.quant import codec_for, native

PATHS = ("registry", "numpy", "native")
Decoder = Callable[[np.ndarray], np.ndarray]


def decode_via(name: str, raw: np.ndarray, path: str, numpy_decoders: dict[str, Decoder]) -> np.ndarray:
    """``raw`` blocks of ``name`` decoded through ``path`` as float[n, block_elements]."""
    codec = codec_for(name)
    if path == "registry":
        fn: Decoder = codec.dequantize
    elif path == "numpy":
        fn = numpy_decoders[name]
    else:
        fn = native.kernel(name, codec.block_elements)
        if fn is None:
            pytest.skip("native kernels not built (python setup.py build_ext --inplace) or CKPTFS_NO_NATIVE set")
    with np.errstate(all="ignore"):
        return fn(raw).reshape(raw.shape[0], codec.block_elements)


def with_paths(names: list[str], numpy_decoders: dict[str, Decoder]) -> list[tuple[str, str]]:
    """(type, path) pairs: every path for types with their own numpy decoder, else the registry only."""
    return [(name, path) for name in names for path in (PATHS if name in numpy_decoders else ("registry",))]
