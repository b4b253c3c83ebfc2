"""Which packed scheme a model folder uses, from its pass-through config files, and which layers it has.

The settings come from ``config.json``'s ``quantization_config`` (what transformers reads), else from
``quantize_config.json`` (where older AutoGPTQ checkpoints keep them; a file without ``quant_method`` is
GPTQ's). Layers are found by their stored part names: ``PREFIX.qweight`` (GPTQ, AWQ) or
``PREFIX.weight_packed`` (compressed-tensors), whatever the settings say, so a layer whose scheme is unknown
is still named, with the reason its view is absent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

CONFIG_FILES = ("config.json", "quantize_config.json")
#: quant_method -> (module, the suffix that marks a layer, the suffixes of its parts)
SCHEMES = {
    "gptq": ("gptq", "qweight", ("qweight", "qzeros", "scales", "g_idx")),
    "awq": ("awq", "qweight", ("qweight", "qzeros", "scales")),
    "compressed-tensors": ("compressed", "weight_packed",
                           ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")),
}
MARKERS = {"qweight": ("qweight", "qzeros", "scales", "g_idx"),
           "weight_packed": SCHEMES["compressed-tensors"][2]}
MAX_CONFIG_BYTES = 16 << 20


@dataclass
class QuantConfig:
    """The quantization settings of a checkpoint, or why they could not be read."""

    method: str | None                  # "gptq" | "awq" | "compressed-tensors" | other | None (unreadable)
    settings: Mapping[str, Any] = field(default_factory=dict)
    origin: str = ""                    # "config.json quantization_config" | "quantize_config.json"
    problem: str | None = None          # why there is no usable method

    @property
    def known(self) -> bool:
        return self.method in SCHEMES and self.problem is None


def read_config(passthrough: Mapping[str, str], read: Callable[[str], bytes]) -> QuantConfig | None:
    """The quantization settings named by the pass-through files (``name -> path``), read with
    ``read(path)``; None when the folder has no quantization settings at all."""
    problems = []
    for name in CONFIG_FILES:
        path = passthrough.get(name)
        if path is None:
            continue
        try:
            doc = json.loads(read(path))
        except (OSError, ValueError) as exc:  # CheckpointError is a ValueError
            problems.append(f"{name} cannot be read: {exc}")
            continue
        if not isinstance(doc, Mapping):
            problems.append(f"{name} is not a JSON object")
            continue
        if name == "config.json":
            settings = doc.get("quantization_config")
            if settings is None:
                continue
            origin = "config.json quantization_config"
        else:
            settings, origin = doc, name
        if not isinstance(settings, Mapping):
            return QuantConfig(None, {}, origin, f"{origin} is not a JSON object")
        method = settings.get("quant_method", "gptq" if name == "quantize_config.json" else None)
        if not isinstance(method, str):
            return QuantConfig(None, settings, origin, f"{origin} names no quant_method")
        method = method.lower()
        problem = None if method in SCHEMES else f"unknown quantization scheme {method!r} in {origin}"
        return QuantConfig(method, settings, origin, problem)
    if problems:
        return QuantConfig(None, {}, "", "; ".join(problems))
    return None


def find_layers(names: list[str], config: QuantConfig) -> dict[str, dict[str, str]]:
    """``PREFIX -> {role: stored tensor name}`` for every layer whose marker part is stored.

    For a known scheme the parts are that scheme's; otherwise any ``qweight`` or ``weight_packed`` marks a
    layer (its view will be absent, with the config's problem as the reason)."""
    present = set(names)
    method = config.method if config.known else None
    markers = {SCHEMES[method][1]: SCHEMES[method][2]} if method is not None else MARKERS
    layers: dict[str, dict[str, str]] = {}
    for name in names:
        prefix, dot, suffix = name.rpartition(".")
        if not dot or suffix not in markers or prefix in layers:
            continue
        layers[prefix] = {role: f"{prefix}.{role}" for role in markers[suffix] if f"{prefix}.{role}" in present}
    return layers
