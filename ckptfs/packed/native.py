"""The optional C kernel (``_kernels``) for GPTQ, AWQ, scaled-codes (FP8, int8) and FP4 (E2M1) rows, and the
choice between it and numpy.

The numpy decoders (``gptq.py``, ``awq.py`` with ``bits.py``) are the reference: the kernel reads the same
per-layer arrays they cache (zero points unpacked, scales as float32, ``g_idx``) and computes the same float32
product and the same single rounding to the scale's type, in one pass, straight into the caller's float32 or
float16 buffer. It reads ``qweight`` as stored (a column per output row, with a stride), so it needs no
transposed copy of it; the tests compare both bit for bit. It is optional like
``ckptfs.quant``'s kernels: without a C compiler at install time, or with ``CKPTFS_NO_NATIVE=1`` in the
environment, every layer decodes through numpy. A call the kernel does not take (an output it cannot write
into) returns False and the caller decodes through numpy: never a wrong value.
"""

from __future__ import annotations

import numpy as np

from ckptfs.quant.native import DISABLED

try:
    from ckptfs.packed import _kernels
except ImportError:  # not built (no compiler at install time, or a source checkout): numpy only
    _kernels = None  # type: ignore[assignment]  # not built: the Python path serves

BACKENDS = (None, "auto", "numpy", "native")
DENSE, AWQ_GEMM = 0, 1
ROUNDING = {"F32": 0, "F16": 1, "BF16": 2}
_OUT_TYPES = (np.dtype(np.float32), np.dtype(np.float16))


def available() -> bool:
    """Whether the kernel is built and not disabled."""
    return _kernels is not None and not DISABLED


def use_kernel(backend: str | None, has_kernel: bool) -> bool:
    """Whether a decode with ``backend`` goes through the kernel: None or "auto" (where built and the layout
    has one), "numpy" (never), "native" (always; ValueError where there is none)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown decode backend {backend!r} (auto, numpy, native)")
    if backend == "numpy":
        return False
    if has_kernel and available():
        return True
    if backend == "native":
        raise ValueError("no native kernel for this layer (not built, disabled, or none for its scheme)")
    return False


def dequantize_rows(out: np.ndarray, words: np.ndarray, bits: int, in_features: int, zeros: np.ndarray,
                    scales: np.ndarray, group_size: int, storage_type: str, g_idx: np.ndarray | None = None,
                    awq_phase: int | None = None, row_step: int | None = None, word_step: int = 1) -> bool:
    """Decode ``len(zeros)`` rows into ``out`` (float32 or float16, ``rows * in_features`` values, contiguous).

    ``words`` (int32/uint32, read as flat): word ``k`` of row ``r`` is ``words[r * row_step + k * word_step]``
    (default: rows of ``words.shape[-1]`` contiguous words). Dense packing: field ``i`` at bit ``bits * i``
    of a row's words; with ``awq_phase`` (the first row's index mod 8), AWQ GEMM: ``r`` counts 8-row blocks
    and a word holds one input's 8 nibbles. ``zeros`` int16 and ``scales`` float32 ``[rows, groups]``;
    ``g_idx`` int64 ``[in]`` or None for ``i // group_size``. Returns False (nothing written) when the kernel
    cannot take the call; a buffer too small for the steps is a ValueError."""
    if not available() or storage_type not in ROUNDING or out.dtype not in _OUT_TYPES \
            or not out.flags.c_contiguous or not out.flags.writeable:
        return False
    rows, groups = zeros.shape
    if out.size != rows * in_features or scales.shape != (rows, groups):
        return False
    if row_step is None:
        if words.ndim != 2:
            raise ValueError("words without row_step must be [rows, words per row]")
        row_step = words.shape[1]
    words = np.ascontiguousarray(words).reshape(-1).view(np.uint32)
    if g_idx is not None:
        g_idx = np.ascontiguousarray(g_idx, dtype=np.int64)
    mode, phase = (DENSE, 0) if awq_phase is None else (AWQ_GEMM, awq_phase)
    _kernels.dequantize_rows(mode, words, row_step, word_step, bits, in_features, phase,
                             np.ascontiguousarray(zeros, dtype=np.int16),
                             np.ascontiguousarray(scales, dtype=np.float32), groups, g_idx, group_size,
                             ROUNDING[storage_type], out.reshape(-1), int(out.dtype == np.float16), rows)
    return True


def scaled_rows(out: np.ndarray, codes: np.ndarray, table: np.ndarray, scales: np.ndarray, scale_rows: np.ndarray,
                block_width: int, zeros: np.ndarray | None = None) -> bool:
    """Rows of a scaled-codes layer (``scaled.py``) into ``out`` (float32 or float16, ``codes.size`` values,
    contiguous): ``(table[code] - zeros[row]) * scales[row]`` per block of ``block_width`` columns, the rows of
    the flat ``scales [rows, groups]`` (float32; ``zeros`` alike or None) given by ``scale_rows`` (int64).
    Returns False (nothing written) when the kernel cannot take the call."""
    if not available() or out.dtype not in _OUT_TYPES or not out.flags.c_contiguous or not out.flags.writeable \
            or out.size != codes.size or codes.ndim != 2:
        return False
    n, width = codes.shape
    groups = scales.shape[1]
    _kernels.scaled_rows(np.ascontiguousarray(codes).view(np.uint8).reshape(-1),
                         np.ascontiguousarray(table, dtype=np.float32), width,
                         np.ascontiguousarray(scales, dtype=np.float32), np.ascontiguousarray(scale_rows, dtype=np.int64),
                         groups, block_width, None if zeros is None else np.ascontiguousarray(zeros, dtype=np.float32),
                         out.reshape(-1), int(out.dtype == np.float16), n)
    return True


def fp4_rows(out: np.ndarray, codes: np.ndarray, code_step: int, pairs: np.ndarray, scales: np.ndarray,
             scale_step: int, width: int, group: int, rows: int, transpose: bool = False, first: int = 0,
             out_step: int | None = None, offset: int | None = None) -> bool:
    """Values ``[first, first + width)`` of ``rows`` rows of E2M1 nibbles (``minifloats``) into ``out``
    (float32 or float16, ``rows * width`` values, contiguous): value ``j`` of row ``r`` is
    ``pairs[byte][j % 2] * scales[r * scale_step + j // group]`` with ``byte = codes[r * code_step + j // 2]``
    (``codes`` u8 and ``scales`` float32, flat and contiguous); with ``transpose`` the rows are written as the
    output's columns, ``out_step`` values apart (default ``rows``: a range of stored rows decoded on its own
    writes its columns of a wider output; ``out`` then starts at the range's first column and holds at least
    ``(width - 1) * out_step + rows`` values). ``first`` may be odd (a span starting at a high nibble).
    Transposed with ``offset``, ``out`` is a window of such an output cut anywhere: value ``j`` of row ``r``
    goes to ``out[(j - first) * out_step + r + offset]`` where that index lies inside ``out``, and nothing
    outside it is written (a read's values in place, whatever rows its ends cut).
    Returns False (nothing written) when the kernel cannot take the call."""
    step = rows if out_step is None else out_step
    size = (width - 1) * step + rows if transpose else rows * width
    window = transpose and offset is not None
    if not transpose and (first or width % 2 or code_step * 2 != width or scale_step * group != width):
        return False  # row by row, the kernel takes contiguous rows of whole groups (a flat run of nibbles)
    if not available() or out.dtype not in _OUT_TYPES or not out.flags.c_contiguous or not out.flags.writeable \
            or (not window and (out.size != size if out_step is None else out.size < size)) \
            or not codes.flags.c_contiguous or not scales.flags.c_contiguous or codes.dtype != np.uint8 \
            or scales.dtype != np.float32:
        return False
    _kernels.fp4_rows(codes.reshape(-1), code_step, np.ascontiguousarray(pairs, dtype=np.float32).reshape(-1),
                      scales.reshape(-1), scale_step, first, width, group, out.reshape(-1),
                      int(out.dtype == np.float16), rows, transpose, step, 0 if offset is None else offset)
    return True
