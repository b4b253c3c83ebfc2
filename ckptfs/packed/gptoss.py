"""gpt-oss ``mxfp4`` experts (``quant_method: mxfp4``): the MoE projections as the BF16 release stores them.

Stored per layer and projection (``...mlp.experts.gate_up_proj`` / ``down_proj``):

- ``PROJ_blocks`` U8 ``[E, out, in / 32, 16]``: per expert and output row, 32-value blocks of E2M1 nibbles,
  element ``2j`` of a block in the low nibble of byte ``j``;
- ``PROJ_scales`` U8 ``[E, out, in / 32]``: each block's E8M0 exponent ``e`` (scale ``2^(e - 127)``);
- ``PROJ_bias`` (served as stored, not a part of the view).

The view ``PROJ`` is what the BF16 release stores: ``[E, in, out]`` (gpt-oss-20b's ``gate_up_proj``:
``[32, 2880, 5760]``), gate and up columns interleaved as stored. transformers'
``convert_moe_packed_tensors`` looks the nibbles up in its dtype and ``ldexp``s them by ``e - 127``, the
exact ``code * 2^(e - 127)`` rounded once to the dtype. Here ``W[x, i, o] = (2 * e2m1) * 2^(e - 128)`` in
float32 is that exact value (``minifloats``): no E8M0 byte is NaN or infinite; with ``e = 255`` a code of
±0.5 is ±2^127, larger codes overflow to ±inf, zeros stay (signed) zeros.

The view's rows (``E * in`` of them, ``out`` values each) are the stored tensor's columns, so a tile of rows
``[x, i0..i1)`` needs the 16-byte blocks ``[x, :, i0 / 32 .. i1 / 32]`` of every output row, spread over the
whole expert. A tile therefore reads its expert's blocks and scales once, into the shared cache (the
expert's ``out * in / 2`` bytes, 1/E of the part), and the 32-row block columns of that expert decode from
there; tiles are multiples of 32 rows, so no block is split between two of them. The C kernel
(``native.fp4_rows``) writes a tile's block columns straight into the tile's rows (the transposition in the
same pass); numpy is the reference and fallback. The kernel starts and ends anywhere inside a block column
(any nibble), so a read that cuts a tile (a 1 MiB read cuts one or two of these 720 KiB tiles) decodes only
the rows it touches, not the whole 32-row block columns they lie in, and in one call
(``cut_in_one_call``): a call's cost is mostly the expert's stored rows it sweeps (a cache line of each for
a view row as for 32), so the rows a read's ends cut are not decoded by calls of their own. That call writes
the read's values straight into its buffer (``window``: the kernel leaves out the cut rows' values outside
the read), with no scratch rows to copy from.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.engine.blocks import DECODE_TASKS, split
from ckptfs.engine.parallel import spread
from ckptfs.packed.base import Absent, Context, Layout, Parts, check_ndim, check_shape, check_type, require
from ckptfs.packed.detect import Method, Scheme, one_format
from ckptfs.packed import native
from ckptfs.packed.minifloats import E2M1_DOUBLE_PAIRS, E8M0_HALF, e2m1_rows, e8m0_scales

BLOCK = 32
METHOD = "mxfp4"
#: ``PROJ_blocks`` marks a layer, ``PROJ_scales`` goes with it, and the view is ``PROJ`` itself
SCHEMES = [Scheme(METHOD, METHOD, "", "gptoss", "blocks", ("blocks", "scales"), marker_types=("U8",),
                  requires=("scales",), view="", joiner="_")]
METHODS = [Method(METHOD, one_format)]


def _columns(out: np.ndarray, *args: Any, **kwargs: Any) -> None:
    """One part of :func:`build`'s kernel call: its arguments are checked there, so a refusal is a bug."""
    if not native.fp4_rows(out, *args, **kwargs):
        raise RuntimeError("the FP4 kernel refused a part of a checked call")


def _parts(rows: int, n: int) -> list[tuple[int, int]]:
    """``[0, rows)`` in at most ``n`` consecutive parts whose bounds are multiples of 32 (the kernel's rows
    at a time)."""
    return [(BLOCK * part[0], min(rows, BLOCK * (part[-1] + 1))) for part in split(list(range(-(-rows // BLOCK))), n)]


def build(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any],
          context: Context | None = None) -> Layout:
    """``parts``: ``blocks`` and ``scales`` (``PREFIX_blocks``, ``PREFIX_scales``)."""
    blocks = require(parts, "blocks", prefix)
    scales = require(parts, "scales", prefix)
    check_type(blocks, ("U8",))
    check_type(scales, ("U8", "F8_E8M0"))
    check_ndim(blocks, 4)
    experts, out, columns, width = blocks.shape
    if width != BLOCK // 2:
        raise Absent(f"{blocks.name} has shape {list(blocks.shape)}: blocks of {width} bytes, "
                     f"expected {BLOCK // 2}")
    if experts == 0 or out == 0 or columns == 0:
        raise Absent(f"{blocks.name} has an empty shape {list(blocks.shape)}")
    check_shape(scales, (experts, out, columns), f"the blocks {list(blocks.shape)}")
    in_features = columns * BLOCK

    def expert(reader: Parts, x: int) -> tuple[np.ndarray, np.ndarray]:
        """Expert ``x``'s blocks ``[out, columns, 16]`` and scales ``[out, columns]`` (float32), cached."""
        codes = reader.derived(f"gpt-oss:blocks:{x}", ("blocks",), (out, columns, BLOCK // 2),
                               lambda: reader.rows("blocks", x, x + 1))
        s = reader.derived(f"gpt-oss:scales:{x}", ("scales",), (out, columns),
                           lambda: e8m0_scales(reader.rows("scales", x, x + 1), E8M0_HALF))
        return codes, s

    def decode(reader: Parts, o0: int, o1: int, dest: np.ndarray | None) -> np.ndarray:
        result = dest.reshape(o1 - o0, out) if dest is not None else np.empty((o1 - o0, out), np.float32)
        r = o0
        while r < o1:
            x, i0 = divmod(r, in_features)
            i1 = min(in_features, i0 + o1 - r)
            k0, k1 = i0 // BLOCK, -(-i1 // BLOCK)
            codes, s = expert(reader, x)
            values = e2m1_rows(codes[:, k0:k1].reshape(out, (k1 - k0) * BLOCK // 2), s[:, k0:k1], BLOCK,
                               pairs=E2M1_DOUBLE_PAIRS)
            result[r - o0:r - o0 + i1 - i0] = values[:, i0 - k0 * BLOCK:i1 - k0 * BLOCK].T
            r += i1 - i0
        return result

    per_core = _parts(out, DECODE_TASKS)  # the stored rows in one part per core, the same for every call

    def run(reader: Parts, o0: int, o1: int, skip: int, dest: np.ndarray, ranges: list[tuple[int, int]]) -> bool:
        """Values ``[skip, skip + dest.size)`` of rows ``[o0, o1)`` (flattened) into ``dest``, expert by
        expert: view rows [i0, i1) of expert x are values [i0 - 32 k0, i1 - 32 k0) of the expert's stored rows
        from block column k0 = i0 // 32, written transposed, one kernel call per range of stored rows of
        ``ranges`` (``spread`` over the cores: the kernel runs without the GIL), each writing its columns of
        the rows, the kernel leaving out what falls outside ``dest`` (the rows a read's ends cut)."""
        if not native.available() or dest.dtype not in (np.float32, np.float16) or not dest.flags.c_contiguous \
                or not dest.flags.writeable:
            return False
        flat = dest.reshape(-1)
        tasks = []
        r = o0
        while r < o1:
            x, i0 = divmod(r, in_features)
            i1 = min(in_features, i0 + o1 - r)
            k0 = i0 // BLOCK
            codes, s = expert(reader, x)
            flat_codes, flat_scales = codes.reshape(-1), s.reshape(-1)
            at = (r - o0) * out - skip  # where the expert's first view row starts in dest
            for a, b in ranges:
                tasks.append(functools.partial(
                    _columns, flat, flat_codes[a * columns * BLOCK // 2 + k0 * BLOCK // 2:],
                    columns * BLOCK // 2, E2M1_DOUBLE_PAIRS, flat_scales[a * columns + k0:], columns, i1 - i0, BLOCK,
                    b - a, transpose=True, first=i0 - k0 * BLOCK, out_step=out, offset=at + a))
            r += i1 - i0
        spread(tasks)
        return True

    def kernel(reader: Parts, o0: int, o1: int, dest: np.ndarray) -> bool:
        """Rows [o0, o1) whole (tiles, whole-tensor reads: one caller waits for them), the stored rows in one
        part per core."""
        return dest.size == (o1 - o0) * out and run(reader, o0, o1, 0, dest, per_core)

    def window(reader: Parts, o0: int, o1: int, skip: int, dest: np.ndarray) -> bool:
        """A mount's read cut anywhere, all the stored rows in one call on the reading thread: a stream's
        requests come several at once (the kernel's readahead), so the cores are already busy with different
        requests, and cutting each one in parts only added hand-offs between threads."""
        return run(reader, o0, o1, skip, dest, [(0, out)])

    parameters = {"quant_method": "mxfp4", "block_size": BLOCK, "experts": experts, "scale": "ldexp(code, e - 127)",
                  "stored_layout": "[E, out, in/32, 16]", "reference_dtype": "BF16"}
    return Layout(METHOD, parameters, experts * in_features, out, {"blocks": blocks, "scales": scales}, "F32",
                  decode, row_align=BLOCK, cut_in_one_call=True, kernel=kernel, window=window,
                  view_shape=(experts, in_features, out))
