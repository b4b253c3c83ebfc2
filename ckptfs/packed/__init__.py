"""Dequantized views of quantized layers: GPTQ, AWQ, compressed-tensors, FP8 and the other schemes of
``detect.SCHEME_MODULES``.

A checkpoint whose model folder holds quantization settings (``config.json`` ``quantization_config``,
``quantize_config.json`` or ModelOpt's ``hf_quant_config.json``) gets, per quantized layer, a virtual
tensor: the weight as the unquantized release stores it (``PREFIX.weight``, ``[out_features,
in_features]``; gpt-oss experts ``[E, in, out]``), decoded from its stored parts only where read.
``Checkpoint`` calls :func:`attach` after building its tensors, and only for a folder with such a config
file, so a plain GGUF or safetensors file never imports this package.

A view may have the name of a stored part (FP8's ``PREFIX.weight`` stored as F8_E4M3): it then stands in
that name's place (``ck[name]``, ``NAME.npy``, ``NAME.meta.json``, whose ``stored`` keeps the part's type and
shape), while the part keeps its ``NAME.raw`` and is reached as ``ck.stored(name)``.

A layer whose view cannot be offered (a part missing or damaged, shapes that do not match the settings, an
unknown or unsupported scheme or format, a stored tensor of the view's name that is not one of its parts)
keeps its parts, served as they are; the reason is in each part's ``meta.json`` (``packed_view``), in
``ckptfs info``, and in one log line (once per folder for a reason every layer shares: a config setting).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import numpy as np

from ckptfs.packed.detect import (Absent, Layer, QuantConfig, activation_scales, find_layers, not_quantized,
                                  read_config)
from ckptfs.packed.base import INT_TYPES, Context, Layout

log = logging.getLogger(__name__)

MAX_CONFIG_BYTES = 16 << 20
MAX_SMALL_BYTES = 1 << 20


def attach(checkpoint) -> None:
    """Add the views of ``checkpoint``'s quantized layers to it and note the layers without one.

    Sets ``checkpoint.packed_views``: one row per layer, ``{"name", "scheme", "parts", "present"}`` plus
    ``"reason"`` for an absent view (what ``ckptfs info`` lists); and, for usable settings,
    ``checkpoint.activation_scales``: the stored activation and KV-cache scales no layer claims
    (``detect.ACTIVATION_SCALES``), which the release leaves out."""
    from ckptfs.packed.views import PackedTensor

    checkpoint.packed_views = []
    config = read_config(checkpoint.passthrough, lambda path: _read_small(checkpoint, path))
    if config is None:
        return
    tensors = checkpoint.tensors
    names = tensors.names()  # no Tensor made
    context = Context(lambda info: _small_ints(checkpoint, info), lambda info, limit: _small_bytes(checkpoint, info, limit),
                      config.torch_dtype)
    logged: set[str] = set()  # a reason shared by every layer (a config setting) is logged once
    layers = find_layers(names, lambda i: tensors.layout(i)[0], config)
    if config.problem is None:
        checkpoint.activation_scales = activation_scales(names, layers)
    for layer in layers:
        view_name = layer.view_name
        scheme = layer.scheme.id if layer.scheme is not None else (config.method or "unknown")
        replaces = view_name in layer.parts.values()
        try:
            if config.problem is not None or layer.scheme is None:
                raise Absent(config.problem or layer.reason or "no scheme of the config fits this layer")
            skipped = not_quantized(layer.prefix, config.settings)
            if skipped is not None:
                raise Absent(skipped)
            if view_name in checkpoint and not replaces:
                raise Absent(f"a stored tensor is named {view_name!r}; it is served instead of the view")
            parts = {role: checkpoint.stored(name).info for role, name in layer.parts.items()}
            layout = _build(layer, parts, config, context)
        except Exception as exc:  # noqa: BLE001 - a hostile config costs this layer its view, never the open
            reason = str(exc) if isinstance(exc, Absent) else f"the quantization settings cannot be used: {exc}"
            row = {"name": view_name, "scheme": scheme, "parts": sorted(layer.parts.values()), "present": False,
                   "reason": reason}
            note = {"name": view_name, "scheme": scheme, "present": False, "reason": reason}
            if reason not in logged:
                logged.add(reason)
                log.warning("%s: no view %s: %s", checkpoint.src, view_name, reason)
        else:
            stored = checkpoint[view_name] if replaces else None
            tensor = PackedTensor(checkpoint, layout, view_name, len(checkpoint.tensors), config.origin,
                                  stored=stored.info if stored is not None else None)
            checkpoint.add_virtual(tensor, replaces=replaces)
            row = {"name": view_name, "scheme": scheme, "parts": sorted(layer.parts.values()), "present": True}
            note = {"name": view_name, "scheme": scheme, "present": True}
        checkpoint.packed_views.append(row)
        for name in layer.parts.values():
            checkpoint.stored(name).annotations["packed_view"] = note


def _build(layer: Layer, parts, config: QuantConfig, context: Context) -> Layout:
    assert layer.scheme is not None
    module: Any = importlib.import_module(f"{__name__}.{layer.scheme.module}")
    layout: Layout = module.build(layer.prefix, parts, config.settings, context)
    return layout


def _read_small(checkpoint, path: str) -> bytes:
    source = checkpoint.sources.get(path)
    if source.size > MAX_CONFIG_BYTES:
        raise ValueError(f"{source.size} bytes is too large for a config file")
    return source.pread(0, source.size)


def _small_bytes(checkpoint, info, limit: int = MAX_SMALL_BYTES) -> bytes:
    """The stored bytes of a small part, read at open (a JSON quant state, a shape)."""
    if info.stored_nbytes > limit:
        raise Absent(f"{info.name} holds {info.stored_nbytes} bytes, more than the {limit} expected")
    try:
        return bytes(checkpoint.sources.get(info.source).pread(info.offset, info.stored_nbytes))
    except ValueError as exc:  # CheckpointError
        raise Absent(f"{info.name} cannot be read: {exc}") from None


def _small_ints(checkpoint, info) -> tuple[int, ...]:
    """The values of a tiny integer tensor (compressed-tensors' ``weight_shape``), read at open."""
    from ckptfs.packed.views import PART_DTYPES

    if info.storage_type not in INT_TYPES or info.stored_nbytes > 64:
        raise Absent(f"{info.name} is not a small integer tensor")
    raw = _small_bytes(checkpoint, info, 64)
    return tuple(int(v) for v in np.frombuffer(raw, PART_DTYPES[info.storage_type]))
