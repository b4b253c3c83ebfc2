"""Field access shared by the codec modules: typed views into ``u8[n, block_bytes]`` and byte-swappers.

Every block type is a packed little-endian struct, so a field is a column range of the block matrix. Viewing
that column range as the field's dtype (numpy allows it when the last axis is contiguous, aligned or not)
reads all ``n`` blocks' fields at once without a per-block loop and without copying the block bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

F32 = np.float32
# Values decoded per chunk by chunked(): a chunk's temporaries (a few bytes of int/float scratch per value)
# then fit in a 1-2 MiB L2 cache instead of streaming through memory once per numpy step.
CHUNK_ELEMENTS = 1 << 17


def field(blocks: np.ndarray, offset: int, count: int, dtype: str | np.dtype) -> np.ndarray:
    """``count`` little-endian values of ``dtype`` starting at byte ``offset`` of every block: shape (n, count).

    A view, never a copy: callers must not write through it (codecs never modify their input).
    """
    dt = np.dtype(dtype)
    return blocks[:, offset:offset + count * dt.itemsize].view(dt)


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 scale at ``offset`` of every block, widened to float32 (exact), shape (n, 1).

    Shape (n, 1) broadcasts against ``(n, block_elements)`` values, which is how every scale is applied.
    """
    return field(blocks, offset, 1, "<f2").astype(F32)


def f32_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float32 field at ``offset`` of every block, shape (n, 1) (a contiguous copy, native order)."""
    return field(blocks, offset, 1, "<f4").astype(F32)


def swap_u16_fields(*offsets: int) -> Callable[[np.ndarray], np.ndarray]:
    """A ``swap`` that byte-reverses the 2-byte fields at ``offsets`` of each block and copies the rest.

    This is what gguf-py's endian converter does for the quant blocks it supports: only the fp16 scales
    change order; byte arrays of quants and packed scales are endian-neutral.
    """
    def swap(blocks: np.ndarray) -> np.ndarray:
        out = np.array(blocks, dtype=np.uint8, copy=True, order="C")
        for off in offsets:
            out[:, off] = blocks[:, off + 1]
            out[:, off + 1] = blocks[:, off]
        return out

    return swap


def swap_elements(itemsize: int) -> Callable[[np.ndarray], np.ndarray]:
    """A ``swap`` that byte-reverses every ``itemsize``-byte value of each block (plain numeric types)."""
    def swap(blocks: np.ndarray) -> np.ndarray:
        n, width = blocks.shape
        grouped = blocks.reshape(n, width // itemsize, itemsize)
        return np.ascontiguousarray(grouped[:, :, ::-1]).reshape(n, width)

    return swap


def chunked(kernel: Callable[[np.ndarray, np.ndarray], None],
            block_elements: int) -> Callable[[np.ndarray], np.ndarray]:
    """A ``decode(blocks)`` that runs ``kernel(blocks, out)`` over cache-sized runs of blocks into one output.

    Multi-step numpy decoders make several passes over their temporaries; on a whole tensor every pass goes
    to main memory, on a ``CHUNK_ELEMENTS`` chunk it stays in cache. ``kernel`` writes the float32 values of
    its blocks into ``out`` (shape (blocks, block_elements)); a zero-block input gives an empty output.
    """
    step = max(1, CHUNK_ELEMENTS // block_elements)

    def decode(blocks: np.ndarray) -> np.ndarray:
        out = np.empty((blocks.shape[0], block_elements), dtype=F32)
        for start in range(0, blocks.shape[0], step):
            kernel(blocks[start:start + step], out[start:start + step])
        return out

    return decode


def nibbles(packed: np.ndarray) -> np.ndarray:
    """Split ``u8[n, k]`` into ``u8[n, 2k]``: the k low nibbles, then the k high nibbles.

    That is GGML's order for 4-bit blocks (element j = low nibble of byte j, element j+k = its high nibble).
    """
    n, k = packed.shape
    out = np.empty((n, 2, k), dtype=np.uint8)
    np.bitwise_and(packed, 0x0F, out=out[:, 0])
    np.right_shift(packed, 4, out=out[:, 1])
    return out.reshape(n, 2 * k)


def bits_le(packed: np.ndarray) -> np.ndarray:
    """Bit ``i`` of a little-endian bit string, for every block: ``u8[n, k] -> u8[n, 8k]`` of 0/1."""
    return np.unpackbits(packed, axis=1, bitorder="little")


def offset_codes(codes: np.ndarray, offset: int) -> np.ndarray:
    """``codes - offset`` as int8, computed in place on a fresh u8 code array.

    uint8 subtraction wraps modulo 256, which is exactly the int8 bit pattern of the signed result, so the
    signed codes cost one cheap byte pass instead of a float pass (their float32 conversion is then exact).
    """
    np.subtract(codes, np.uint8(offset), out=codes)
    return codes.view(np.int8)
