"""NVFP4 weights: E2M1 nibbles, an E4M3 scale per 16 values and one float32 scale per tensor.

Two producers store the same codes under different names and combine the two scales differently:

- compressed-tensors ``nvfp4-pack-quantized`` (llm-compressor, RedHatAI ``*-NVFP4``): ``weight_packed`` U8
  ``[out, in / 2]``, ``weight_scale`` F8_E4M3 ``[out, in / 16]``, ``weight_global_scale`` F32 ``[1]``.
  Its ``decompress`` divides first, ``s = float32(weight_scale) / weight_global_scale``, in float32 (a
  bfloat16 scale divided by a float32 ``[1]`` tensor promotes to float32), then ``W = e2m1 * s`` in
  float32, and rounds to bfloat16. A global scale stored as a 0-d tensor does not promote: the divided
  scale is rounded to bfloat16 before the product, and so it is here.
- NVIDIA ModelOpt ``NVFP4`` (``nvidia/*-FP4``; ``quant_algo: NVFP4``, or a ``MIXED_PRECISION`` layer whose
  ``quantized_layers`` entry says so, routed by ``modelopt``): ``weight`` U8 ``[out, in / 2]`` (the
  codes stand in the dense weight's name), ``weight_scale`` F8_E4M3 ``[out, in / 16]``, ``weight_scale_2``
  F32 (0-d or ``[1]``). ModelOpt's ``NVFP4QTensor.dequantize`` multiplies the scales first,
  ``s = float32(weight_scale) * weight_scale_2``, then ``W = e2m1 * s`` in float32. ``input_scale`` scales
  activations: a part of the layer, not of the weight.

Both pack element ``2i`` into the low nibble of byte ``i``. An E4M3 scale byte 0x7F or 0xFF is NaN (OCP
e4m3fn), so its 16 values are NaN, as in both references. Tiles are row ranges: a read takes only its rows'
codes and scales (``in / 2 + in / 16`` bytes a row) and the 4-byte global scale. The combined scale of a group
depends on its E4M3 byte alone (the global scale is one value), so each layer combines the 256 possible bytes
once (a cached table, the same float32 operations) and a tile looks its groups' bytes up. The C kernel
(``native.fp4_rows``) multiplies the same combined scales in one pass; numpy is the reference and fallback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.engine.values import PairedNibbles
from ckptfs.packed.base import Absent, Context, Layout, Parts, check_ndim, check_shape, check_type, int_setting, require
from ckptfs.packed.bits import round_to
from ckptfs.packed.compressed import METHOD, scheme_for
from ckptfs.packed.detect import Method, Scheme
from ckptfs.packed import native
from ckptfs.packed.minifloats import E2M1_PAIRS, E4M3, e2m1_rows
from ckptfs.packed.modelopt import MIXED, layer_entry, settings_of

GROUP = 16
CT_FORMAT = "nvfp4-pack-quantized"
CT_ROLES = ("weight_packed", "weight_scale", "weight_global_scale", "weight_zero_point", "input_global_scale")
MODELOPT_ROLES = ("weight", "weight_scale", "weight_scale_2", "input_scale")
SCHEMES = [Scheme(f"{METHOD}/{CT_FORMAT}", METHOD, CT_FORMAT, "nvfp4", "weight_packed", CT_ROLES,
                  marker_types=("U8",)),
           Scheme("modelopt/NVFP4", "modelopt", "NVFP4", "nvfp4", "weight", MODELOPT_ROLES, marker_types=("U8",),
                  requires=("weight_scale",))]
METHODS: list[Method] = []  # the methods are compressed.py's and modelopt.py's


def build(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any],
          context: Context | None = None) -> Layout:
    if "weight_packed" in parts:
        return _build_compressed(prefix, parts, settings)
    return _build_modelopt(prefix, parts, settings)


def _build_compressed(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any]) -> Layout:
    weights = scheme_for(prefix, settings, (CT_FORMAT,))
    check_weight_args(weights, "float", 4, GROUP)
    if "weight_zero_point" in parts:
        raise Absent("asymmetric NVFP4 (weight_zero_point) is not supported")
    return _layout(f"{METHOD}/{CT_FORMAT}", prefix, parts, "weight_packed", "weight_global_scale", divide=True,
                   parameters={"format": CT_FORMAT, "num_bits": 4, "group_size": GROUP,
                               "strategy": weights.get("strategy")})


def _build_modelopt(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any]) -> Layout:
    proper = settings_of(settings)
    entry: Mapping[str, Any] = proper
    if str(proper.get("quant_algo", "")).upper() == MIXED:
        found = layer_entry(prefix, settings)
        if found is None:
            raise Absent(f"layer is not in the config's quantized_layers ({MIXED})")
        entry = found
    algo = str(entry.get("quant_algo", "")).upper()
    if algo != "NVFP4":
        raise Absent(f"modelopt quant_algo {algo!r} is not NVFP4")
    group = int_setting(entry, "group_size", default=int_setting(proper, "group_size", default=GROUP))
    if group != GROUP:
        raise Absent(f"ModelOpt NVFP4 group_size={group} is not supported ({GROUP})")
    return _layout("modelopt/NVFP4", prefix, parts, "weight", "weight_scale_2", divide=False,
                   parameters={"quant_algo": "NVFP4", "group_size": GROUP})


def check_weight_args(weights: Mapping[str, Any], kind: str, bits: int, group: int) -> None:
    """A compressed-tensors config group's ``weights`` describe this scheme (type, num_bits, group_size)."""
    if str(weights.get("type", kind)) != kind or int_setting(weights, "num_bits", default=bits) != bits:
        raise Absent(f"weights of type {weights.get('type')!r} with num_bits={weights.get('num_bits')!r} "
                     f"are not {kind} {bits}-bit")
    size = int_setting(weights, "group_size", default=group)
    if size != group:
        raise Absent(f"group_size={size} is not supported ({group})")


def _layout(scheme: str, prefix: str, parts: Mapping[str, TensorInfo], codes_role: str, global_role: str,
            divide: bool, parameters: dict[str, Any]) -> Layout:
    codes = require(parts, codes_role, prefix)
    scale = require(parts, "weight_scale", prefix)
    global_scale = require(parts, global_role, prefix)
    check_type(codes, ("U8",))
    check_type(scale, ("F8_E4M3",))
    check_type(global_scale, ("F32",))
    check_ndim(codes, 2)
    out, in_features = codes.shape[0], 2 * codes.shape[1]
    if out == 0 or in_features == 0:
        raise Absent(f"{codes.name} has an empty shape {list(codes.shape)}")
    if in_features % GROUP:
        raise Absent(f"in_features {in_features} is not a multiple of the NVFP4 group of {GROUP}")
    check_shape(scale, (out, in_features // GROUP), f"NVFP4 of [{out}, {in_features}]")
    if global_scale.shape not in ((), (1,)):
        raise Absent(f"{global_scale.name} has shape {list(global_scale.shape)}, expected one value")
    scalar_bf16 = divide and global_scale.shape == ()  # a 0-d divisor keeps the bfloat16 scale's dtype

    def combined(reader: Parts) -> np.ndarray:
        """The combined float32 scale of each of the 256 E4M3 scale bytes, in the reference's order: the
        global scale is one value, so a group's combined scale is a function of its byte alone, and looking
        it up gives the bits the per-group division (or product, and rounding) gives."""
        g = reader.whole(global_role).reshape(1).astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            s = E4M3 / g if divide else E4M3 * g
        return round_to(s, "BF16") if scalar_bf16 else s

    def scales(reader: Parts, o0: int, o1: int) -> np.ndarray:
        """Rows [o0, o1)'s combined float32 scales: their bytes looked up in the layer's table (cached)."""
        table = reader.derived("nvfp4:combined", (global_role,), (256,), lambda: combined(reader))
        return np.take(table, reader.rows("weight_scale", o0, o1))

    def decode(reader: Parts, o0: int, o1: int, dest: np.ndarray | None) -> np.ndarray:
        return e2m1_rows(reader.rows(codes_role, o0, o1), scales(reader, o0, o1), GROUP, dest)

    def kernel(reader: Parts, o0: int, o1: int, dest: np.ndarray) -> bool:
        return native.fp4_rows(dest, reader.rows(codes_role, o0, o1), in_features // 2, E2M1_PAIRS,
                               scales(reader, o0, o1), in_features // GROUP, in_features, GROUP, o1 - o0)

    def computed(reader: Parts) -> PairedNibbles | None:
        """The layer as a flat run of nibbles (every row is whole groups) for a mount's reads in C: a scale
        byte per group of 16 (read with the codes; in their file) valued by the layer's combined table."""
        if scale.source != codes.source:
            return None
        table = reader.derived("nvfp4:combined", (global_role,), (256,), lambda: combined(reader))
        return PairedNibbles(reader.source_of(codes_role), codes.offset, out, in_features, E2M1_PAIRS, GROUP,
                             out * in_features // GROUP, scale.offset, "table", table)

    used = {codes_role: codes, "weight_scale": scale, global_role: global_scale}
    order = "e2m1 * (weight_scale / weight_global_scale)" if divide else "e2m1 * (weight_scale * weight_scale_2)"
    return Layout(scheme, dict(parameters, formula=order, reference_dtype="BF16" if divide else None), out,
                  in_features, used, "F32", decode, kernel=kernel, computed_codes=computed)
