"""compressed-tensors ``float-quantized``, ``int-quantized`` and ``naive-quantized`` layers (llm-compressor's
``*-FP8-dynamic``, ``*-FP8-block``, ``*-W8A8`` checkpoints): one stored code per weight.

Per layer: ``weight`` F8_E4M3 (``type: float``) or I8 (``type: int``) ``[out, in]``, ``weight_scale`` by the
config group's ``strategy``: ``tensor`` (one), ``channel`` (``[out, 1]``), ``group`` (``[out, in / g]``,
``in`` a multiple of ``g``), ``block`` (``block_structure [bh, bw]``: ``[ceil(out / bh), ceil(in / bw)]``,
partial at the edges); ``weight_zero_point`` of the scale's shape (asymmetric; applied wherever stored, as ``decompress`` does); ``weight_g_idx``
(activation order) the group of each input column.

``W = (q - zero_point) * scale``, as compressed-tensors' ``dequantize`` computes it in the scale's dtype:
the float32 formula is exact there (an 8-bit integer difference or an E4M3 value times a 16-bit scale), so
rounded to that dtype it is the reference's value. compressed-tensors' own ``decompress`` does not read
``weight_g_idx``; the view applies it (the scale of column ``j`` is that of group ``g_idx[j]``), which is what
the stored order means.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptfs.core.descriptors import TensorInfo
from ckptfs.packed.base import Absent, Context, Layout, int_setting
from ckptfs.packed.compressed import METHOD, scheme_for
from ckptfs.packed.detect import Method, Scheme
from ckptfs.packed.fp8 import block_setting
from ckptfs.packed.scaled import build_scaled

FORMATS = ("float-quantized", "int-quantized", "naive-quantized")
ROLES = ("weight", "weight_scale", "weight_zero_point", "weight_g_idx", "input_scale", "input_zero_point")
SCHEMES = [Scheme(f"{METHOD}/{fmt}", METHOD, fmt, "ct_float", "weight", ROLES, marker_types=("F8_E4M3", "I8"),
                  requires=("weight_scale",)) for fmt in FORMATS]
METHODS: list[Method] = []  # compressed-tensors' method is compressed.py's
STRATEGIES = ("tensor", "channel", "group", "block")


def build(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any],
          context: Context | None = None) -> Layout:
    weights = scheme_for(prefix, settings, FORMATS)
    kind = str(weights.get("type") or "int")
    code_types = {"float": ("F8_E4M3",), "int": ("I8",)}.get(kind)
    if code_types is None:
        raise Absent(f"compressed-tensors weight type {kind!r} is not supported (float or int)")
    bits = int_setting(weights, "num_bits", default=8)
    if bits != 8 and kind == "float":
        raise Absent(f"compressed-tensors float num_bits={bits} is not supported (8)")
    strategy = str(weights.get("strategy") or "tensor")
    weight = parts.get("weight")
    in_features = weight.shape[-1] if weight is not None and weight.shape else 0
    if strategy == "tensor":
        block = None
    elif strategy == "channel":
        block = (1, in_features)
    elif strategy == "group":
        group_size = int_setting(weights, "group_size")
        if group_size <= 0 or in_features % group_size:
            raise Absent(f"in_features {in_features} is not a multiple of group_size {group_size}")
        block = (1, group_size)
    elif strategy == "block":
        block = block_setting(weights, "block_structure")
        if block is None:
            raise Absent("compressed-tensors block strategy without block_structure")
    else:
        raise Absent(f"compressed-tensors strategy {strategy!r} is not supported ({', '.join(STRATEGIES)})")
    symmetric = bool(weights.get("symmetric", True))
    fmt = _format_of(prefix, settings)
    parameters = {"type": kind, "num_bits": bits, "strategy": strategy, "symmetric": symmetric,
                  "group_size": weights.get("group_size"), "actorder": weights.get("actorder"), "format": fmt}
    scheme = f"{METHOD}/{fmt}"
    return build_scaled(scheme, prefix, parts, weight_role="weight", scale_role="weight_scale",
                        code_types=code_types, block=block, parameters=parameters,
                        zero_role="weight_zero_point", g_idx_role="weight_g_idx",
                        why=f"the {strategy} strategy's", loose=strategy in ("channel",))


def _format_of(prefix: str, settings: Mapping[str, Any]) -> str:
    from ckptfs.packed.compressed import config_group, group_format

    return group_format(config_group(prefix, settings)[1], settings)
