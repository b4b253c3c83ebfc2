"""Shared by the codec tests: decoding one storage type through each of its paths (the registry, which
readers use; the pure-numpy decoder; the optional C kernel) and bit-exact, NaN-aware float comparison."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from ckptfs.quant import codec_for, native

PATHS = ("registry", "numpy", "native")
Decoder = Callable[[np.ndarray], np.ndarray]


def raw_blocks(name: str, n: int, seed: int) -> np.ndarray:
    """``u8[n, block_bytes]`` of uniformly random blocks of storage type ``name``: every bit pattern, NaN and inf
    scales included, which bit-for-bit comparisons must survive (tests/fixtures.random_blocks keeps scales
    finite, for checkpoints whose values are compared as numbers)."""
    return np.random.default_rng(seed).integers(0, 256, size=(n, codec_for(name).block_bytes), dtype=np.uint8)


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


def float_bits(values: np.ndarray) -> np.ndarray:
    """float32 bit patterns with every NaN made one canonical NaN: equality is then bit-exact elsewhere
    (signed zeros and infinities included) and NaN-aware."""
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    bits = flat.view(np.uint32).copy()
    bits[np.isnan(flat)] = 0x7FC00000
    return bits


def assert_same_floats(got: np.ndarray, want: np.ndarray) -> None:
    """``got`` (float32) equals ``want`` bit for bit, any NaN matching any NaN."""
    assert got.dtype == np.float32
    assert got.size == np.asarray(want).size
    np.testing.assert_array_equal(float_bits(got), float_bits(np.asarray(want, dtype=np.float32)))
