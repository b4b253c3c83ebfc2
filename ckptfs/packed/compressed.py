"""compressed-tensors ``pack-quantized`` (llm-compressor checkpoints): integer weights of 1..8 bits.

Per layer: ``weight_packed`` int32 ``[out, ceil(in * bits / 32)]`` (each row's values packed densely,
value ``i`` at bit ``bits * i``, stored as ``q + 2^(bits-1)``), ``weight_shape`` (``[out, in]``),
``weight_scale`` (``[out, in / group_size]`` for the group strategy, ``[out, 1]`` for channel, ``[1]`` for
tensor) and, when asymmetric, ``weight_zero_point``: packed the same way along the output dimension (int32
``[ceil(out * bits / 32), groups]``), or as plain integers ``[out, groups]`` in older checkpoints.

``W = (q - zero_point) * scale`` in the scale's dtype, as compressed-tensors' ``dequantize`` computes it.
Older compressed-tensors releases packed 3, 5, 6 and 7 bits ``32 // bits`` to a word instead of densely;
such a ``weight_packed`` has another width, and its view is absent with a reason.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.packed.bits import packed_words, round_to, scale_to_f32, unpack_fields
from ckptfs.packed.detect import Method, Scheme
from ckptfs.packed.base import (INT32_TYPES, INT_TYPES, SCALE_TYPES, Absent, Context, Layout, Parts, check_ndim,
                                check_shape, check_type, f16_fast, group_index_fast, int_setting, require)

ROLES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")
FORMAT = "pack-quantized"
STRATEGIES = ("group", "channel", "tensor")
METHOD = "compressed-tensors"


def config_group(prefix: str, settings: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """The config group that covers layer ``prefix``: ``(name, group)`` (Absent if none does).

    Targets are module names, ``re:`` regular expressions over them, or class names (``Linear``): a layer
    found here by its stored parts is a quantized linear layer, so a class-name target matches every layer;
    a target naming the layer itself wins over it. (``ignore`` is honoured with the other modules-not-
    quantized lists, ``detect.not_quantized``.)"""
    groups = settings.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise Absent("compressed-tensors config has no config_groups")
    by_name, by_class = [], []
    for name, group in groups.items():
        if not isinstance(group, Mapping):
            continue
        targets = group.get("targets") or ()
        for target in [targets] if isinstance(targets, str) else targets:
            target = str(target)
            if _matches(target, prefix):
                by_name.append((name, group))
            elif not target.startswith("re:") and "." not in target and target[:1].isupper():
                by_class.append((name, group))
    found = by_name or by_class
    if not found:
        raise Absent("no config group of the compressed-tensors config targets this layer")
    return found[0]


def group_format(group: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    """A config group's format: its own, else the config's (``mixed-precision`` names none of its own)."""
    fmt = group.get("format") or settings.get("format")
    return str(fmt) if fmt is not None else ""


def formats(settings: Mapping[str, Any]) -> tuple[str, ...]:
    """The formats a compressed-tensors config uses: its ``format``, or each config group's where it is
    ``mixed-precision`` (or names none)."""
    fmt = settings.get("format")
    groups = settings.get("config_groups")
    if fmt not in (None, "mixed-precision"):
        return (str(fmt),)
    if not isinstance(groups, Mapping) or not groups:
        raise Absent("compressed-tensors config has no config_groups")
    found: list[str] = []
    for group in groups.values():
        if isinstance(group, Mapping) and group.get("format") and str(group["format"]) not in found:
            found.append(str(group["format"]))
    if not found:
        raise Absent(f"compressed-tensors format {fmt!r} names no format per config group")
    return tuple(found)


def route(prefix: str, settings: Mapping[str, Any]) -> str | None:
    """The format of the config group covering ``prefix`` (None when none does: the build says why)."""
    try:
        return group_format(config_group(prefix, settings)[1], settings)
    except Absent:
        return None


def scheme_for(prefix: str, settings: Mapping[str, Any], served: tuple[str, ...] = (FORMAT,)) -> Mapping[str, Any]:
    """The ``weights`` arguments of the config group that covers layer ``prefix``, whose format must be one
    of ``served`` (Absent otherwise)."""
    name, group = config_group(prefix, settings)
    weights = group.get("weights")
    if not isinstance(weights, Mapping):
        raise Absent(f"config group {name} quantizes no weights")
    fmt = group_format(group, settings)
    if fmt not in served:
        raise Absent(f"config group {name} has format {fmt!r}, not {' or '.join(served)}")
    return weights


def _matches(target: str, prefix: str) -> bool:
    if target.startswith("re:"):
        try:
            return re.match(target[3:], prefix) is not None
        except re.error as exc:
            raise Absent(f"target {target!r} is not a valid regular expression: {exc}") from None
    return prefix == target or prefix.endswith("." + target)


SCHEMES = [Scheme("compressed-tensors", METHOD, FORMAT, "compressed", "weight_packed", ROLES)]
METHODS = [Method(METHOD, formats, route)]


def build(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any], context: Context) -> Layout:
    """``context.small_ints`` reads the small stored shape tensor (the caller does the I/O)."""
    weights = scheme_for(prefix, settings)
    if weights.get("type", "int") != "int":
        raise Absent(f"compressed-tensors weight type {weights.get('type')!r} is not supported (int)")
    bits = int_setting(weights, "num_bits")
    if not 1 <= bits <= 8:
        raise Absent(f"compressed-tensors num_bits={bits} is not supported (1..8)")
    strategy = str(weights.get("strategy") or "tensor")
    if strategy not in STRATEGIES:
        raise Absent(f"compressed-tensors strategy {strategy!r} is not supported ({', '.join(STRATEGIES)})")
    symmetric = bool(weights.get("symmetric", True))
    if "weight_g_idx" in parts:
        raise Absent("activation-ordered groups (weight_g_idx) are not supported")

    packed = require(parts, "weight_packed", prefix)
    scale = require(parts, "weight_scale", prefix)
    shape_part = require(parts, "weight_shape", prefix)
    check_type(packed, INT32_TYPES)
    check_type(scale, SCALE_TYPES)
    check_type(shape_part, INT_TYPES)
    check_ndim(packed, 2)
    check_shape(shape_part, (2,), "a 2-D weight")
    out, in_features = context.small_ints(shape_part)
    if out <= 0 or in_features <= 0:
        raise Absent(f"{shape_part.name} holds [{out}, {in_features}], not a weight shape")
    check_shape(packed, (out, packed_words(in_features, bits)), f"{bits}-bit dense packing of [{out}, {in_features}]")
    if strategy == "group":
        group_size = int_setting(weights, "group_size")
        if group_size <= 0 or in_features % group_size:
            raise Absent(f"in_features {in_features} is not a multiple of group_size {group_size}")
        groups = in_features // group_size
        check_shape(scale, (out, groups), f"group_size={group_size}")
    elif strategy == "channel":
        group_size, groups = in_features, 1
        check_shape(scale, (out, 1), "the channel strategy")
    else:
        group_size, groups = in_features, 1
        if math.prod(scale.shape) != 1:
            raise Absent(f"{scale.name} has shape {list(scale.shape)}, the tensor strategy expects one scale")

    zero = parts.get("weight_zero_point")
    zero_packed = False
    if symmetric:
        if zero is not None:
            raise Absent(f"{zero.name} is stored but the scheme is symmetric")
    else:
        zero = require(parts, "weight_zero_point", prefix)
        check_type(zero, INT_TYPES)
        rows = out if strategy != "tensor" else 1
        if zero.storage_type in INT32_TYPES and tuple(zero.shape) == (packed_words(rows, bits), groups) \
                and strategy != "tensor":
            zero_packed = True
        elif math.prod(zero.shape) == rows * groups and (len(zero.shape) == 2 or strategy == "tensor"):
            pass
        else:
            raise Absent(f"{zero.name} has shape {list(zero.shape)}, expected [{packed_words(rows, bits)}, "
                         f"{groups}] (packed) or [{rows}, {groups}]")

    st = scale.storage_type
    offset = 1 << (bits - 1)
    used = {"weight_packed": packed, "weight_scale": scale, "weight_shape": shape_part}
    if zero is not None:
        used["weight_zero_point"] = zero
    parameters = {"num_bits": bits, "strategy": strategy, "symmetric": symmetric, "group_size":
                  group_size if strategy == "group" else None, "groups": groups, "format": FORMAT}
    rows_of_params = out if strategy != "tensor" else 1

    def decode(reader: Parts, o0: int, o1: int, dest: np.ndarray | None) -> np.ndarray:
        def scales_t() -> np.ndarray:
            return scale_to_f32(reader.whole("weight_scale"), st).reshape(rows_of_params, groups)

        def zeros_t() -> np.ndarray:
            stored = reader.whole("weight_zero_point")
            if zero_packed:
                fields = unpack_fields(stored.T, bits, rows_of_params).astype(np.int16) - offset
                return np.ascontiguousarray(fields.T)
            return stored.astype(np.int16).reshape(rows_of_params, groups)

        q = unpack_fields(reader.rows("weight_packed", o0, o1), bits, in_features).astype(np.int16) - offset
        s = reader.derived("ct:scales", ("weight_scale",), (rows_of_params, groups), scales_t)
        if zero is not None:
            z = reader.derived(f"ct:b{bits}:zeros", ("weight_zero_point",), (rows_of_params, groups),
                               zeros_t).astype(np.float32)
        else:
            z = np.zeros((rows_of_params, groups), np.float32)
        if strategy != "tensor":
            s, z = s[o0:o1], z[o0:o1]
        else:
            s, z = np.broadcast_to(s, (o1 - o0, 1)), np.broadcast_to(z, (o1 - o0, 1))
        fast = f16_fast(reader, "weight_scale", st, 1 << bits)
        return round_to(group_index_fast(q, z, s, group_size, dest), st, fast)

    return Layout("compressed-tensors", parameters, out, in_features, used, st, decode)

