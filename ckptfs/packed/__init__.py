"""Dequantized views of GPTQ, AWQ and compressed-tensors (pack-quantized) layers.

A checkpoint whose model folder holds quantization settings (``config.json`` ``quantization_config`` or
``quantize_config.json``) gets, per quantized linear layer, a virtual tensor ``PREFIX.weight``: the layer's
weight in transformers' ``[out_features, in_features]`` layout, decoded from its stored parts (``qweight``,
``qzeros``, ``scales``, ``g_idx``; or ``weight_packed``, ``weight_scale``, ...) only where read. The stored
parts stay listed as they are. ``Checkpoint`` calls :func:`attach` after building its tensors, and only for a
folder with such a config file, so a plain GGUF or safetensors file never imports this package.

A layer whose view cannot be offered (a part missing or damaged, shapes that do not match the settings, an
unknown or unsupported scheme, a stored tensor already named ``PREFIX.weight``) keeps its parts, raw as
always; the reason is in each part's ``meta.json`` (``packed_view``) and in ``ckptfs info``.
"""

from __future__ import annotations

import importlib
import numpy as np

from ckptfs.packed.detect import SCHEMES, QuantConfig, find_layers, read_config
from ckptfs.packed.base import INT_TYPES, Absent, Layout

MAX_CONFIG_BYTES = 16 << 20


def attach(checkpoint) -> None:
    """Add the views of ``checkpoint``'s packed layers to it and note the layers without one.

    Sets ``checkpoint.packed_views``: one row per layer, ``{"name", "scheme", "parts", "present"}`` plus
    ``"reason"`` for an absent view (what ``ckptfs info`` lists)."""
    from ckptfs.packed.views import PackedTensor

    checkpoint.packed_views = []
    config = read_config(checkpoint.passthrough, lambda path: _read_small(checkpoint, path))
    if config is None:
        return
    tensors = checkpoint.tensors
    names = tensors.names()  # no Tensor made
    for prefix, roles in find_layers(names, config).items():
        view_name = f"{prefix}.weight"
        parts = {role: checkpoint[name].info for role, name in roles.items()}
        scheme = config.method or "unknown"
        try:
            if config.problem is not None:
                raise Absent(config.problem)
            if view_name in checkpoint:
                raise Absent(f"a stored tensor is named {view_name!r}; it is served instead of the view")
            layout = _build(scheme, prefix, parts, config, checkpoint)
        except Exception as exc:  # noqa: BLE001 - a hostile config costs this layer its view, never the open
            reason = str(exc) if isinstance(exc, Absent) else f"the quantization settings cannot be used: {exc}"
            row = {"name": view_name, "scheme": scheme, "parts": sorted(roles.values()), "present": False,
                   "reason": reason}
            note = {"name": view_name, "scheme": scheme, "present": False, "reason": reason}
        else:
            tensor = PackedTensor(checkpoint, layout, view_name, len(checkpoint.tensors), config.origin)
            checkpoint.add_virtual(tensor)
            row = {"name": view_name, "scheme": scheme, "parts": sorted(roles.values()), "present": True}
            note = {"name": view_name, "scheme": scheme, "present": True}
        checkpoint.packed_views.append(row)
        for name in roles.values():
            checkpoint[name].annotations["packed_view"] = note


def _build(scheme: str, prefix: str, parts, config: QuantConfig, checkpoint) -> Layout:
    module = importlib.import_module(f"{__name__}.{SCHEMES[scheme][0]}")
    if scheme == "compressed-tensors":
        return module.build(prefix, parts, config.settings, lambda info: _small_ints(checkpoint, info))
    return module.build(prefix, parts, config.settings)


def _read_small(checkpoint, path: str) -> bytes:
    source = checkpoint.sources.get(path)
    if source.size > MAX_CONFIG_BYTES:
        raise ValueError(f"{source.size} bytes is too large for a config file")
    return source.pread(0, source.size)


def _small_ints(checkpoint, info) -> tuple[int, ...]:
    """The values of a tiny integer tensor (compressed-tensors' ``weight_shape``), read at open."""
    from ckptfs.packed.views import PART_DTYPES

    if info.storage_type not in INT_TYPES or info.stored_nbytes > 64:
        raise Absent(f"{info.name} is not a small integer tensor")
    try:
        raw = checkpoint.sources.get(info.source).pread(info.offset, info.stored_nbytes)
    except ValueError as exc:  # CheckpointError
        raise Absent(f"{info.name} cannot be read: {exc}") from None
    return tuple(int(v) for v in np.frombuffer(raw, PART_DTYPES[info.storage_type]))

