"""NVIDIA ModelOpt exports (``quant_method: modelopt`` in ``config.json``, or the older
``hf_quant_config.json``): which layout each layer has, and the FP8 ones.

``quant_algo`` names the layout of every quantized layer: ``FP8`` (and ``FP8_PER_CHANNEL_PER_TOKEN``),
``NVFP4`` (decoded by the scheme module that registers ``modelopt`` / ``NVFP4``), or ``MIXED_PRECISION``,
where ``quantized_layers`` maps each quantized layer's name to its own ``quant_algo``; a layer that map does
not name is not quantized. ``exclude_modules`` lists modules left unquantized (``detect.not_quantized``).
The settings may also sit under a ``quantization`` key (the older file's layout).

FP8 layers: ``weight`` F8_E4M3 ``[out, in]``, ``weight_scale`` F32, one per tensor (``[]``) or per channel
(``[out]`` / ``[out, 1]``), and the activations' ``input_scale`` (a part of the layer, not of the weight):
``W = e4m3(w) * weight_scale`` in float32, as ModelOpt's and vLLM's dequantization multiply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptfs.core.descriptors import TensorInfo
from ckptfs.packed.base import Absent, Context, Layout
from ckptfs.packed.detect import Method, Scheme
from ckptfs.packed.scaled import build_scaled

METHOD = "modelopt"
MIXED = "MIXED_PRECISION"
FP8_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN")
ROLES = ("weight", "weight_scale", "input_scale", "k_scale", "v_scale")


def settings_of(settings: Mapping[str, Any]) -> Mapping[str, Any]:
    """The settings proper: a nested ``quantization`` object where the export keeps them there."""
    nested = settings.get("quantization")
    return nested if isinstance(nested, Mapping) and "quant_algo" not in settings else settings


def quantized_layers(settings: Mapping[str, Any]) -> Mapping[str, Any]:
    layers = settings_of(settings).get("quantized_layers")
    if not isinstance(layers, Mapping):
        raise Absent(f"modelopt quant_algo {MIXED} without a quantized_layers object")
    return layers


def formats(settings: Mapping[str, Any]) -> tuple[str, ...]:
    algo = settings_of(settings).get("quant_algo")
    if not isinstance(algo, str):
        raise Absent("modelopt config names no quant_algo")
    if algo.upper() != MIXED:
        return (algo.upper(),)
    found: list[str] = []
    for entry in quantized_layers(settings).values():
        layer_algo = entry.get("quant_algo") if isinstance(entry, Mapping) else None
        if isinstance(layer_algo, str) and layer_algo.upper() not in found:
            found.append(layer_algo.upper())
    return tuple(found)


def layer_entry(prefix: str, settings: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``quantized_layers``' entry of ``prefix`` (its name, or the name without a leading ``model.``-style
    part the export dropped), None when it names none."""
    layers = quantized_layers(settings)
    for name, entry in layers.items():
        if isinstance(entry, Mapping) and (name == prefix or prefix.endswith("." + name)):
            return entry
    return None


def route(prefix: str, settings: Mapping[str, Any]) -> str | None:
    if str(settings_of(settings).get("quant_algo", "")).upper() != MIXED:
        return None
    entry = layer_entry(prefix, settings)
    algo = entry.get("quant_algo") if entry is not None else None
    return algo.upper() if isinstance(algo, str) else None


SCHEMES = [Scheme(f"{METHOD}/FP8", METHOD, algo, "modelopt", "weight", ROLES, marker_types=("F8_E4M3",))
           for algo in FP8_ALGOS]
METHODS = [Method(METHOD, formats, route)]


def build(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any],
          context: Context | None = None) -> Layout:
    proper = settings_of(settings)
    algo = str(proper.get("quant_algo", "")).upper()
    if algo == MIXED:
        entry = layer_entry(prefix, settings)
        if entry is None:
            raise Absent(f"layer is not in the config's quantized_layers ({MIXED})")
        algo = str(entry.get("quant_algo", "")).upper()
    if algo not in FP8_ALGOS:
        raise Absent(f"modelopt quant_algo {algo!r} is not FP8 ({', '.join(FP8_ALGOS)})")
    return build_scaled(f"{METHOD}/FP8", prefix, parts, weight_role="weight", scale_role="weight_scale",
                        code_types=("F8_E4M3",), block=None, parameters={"quant_algo": algo},
                        scale_types=("F32", "BF16", "F16"), why="a per-tensor or per-channel")
