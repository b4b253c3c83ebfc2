"""Which quantization scheme a model folder uses, which layers it has, and which modules it left unquantized.

The settings come from ``config.json``'s ``quantization_config`` (what transformers reads), else from
``quantize_config.json`` (older AutoGPTQ checkpoints; a file without ``quant_method`` is GPTQ's), else from
``hf_quant_config.json`` (older NVIDIA ModelOpt exports: ``{"quantization": {"quant_algo": ...}}``, read as
``quant_method: modelopt``).

**The registry.** Each scheme module (``SCHEME_MODULES``) declares what it serves as module-level lists:

- ``SCHEMES``: :class:`Scheme` rows, one per stored layout: the id ``meta.json`` and ``ckptfs info`` name,
  the ``quant_method`` and format it serves, the stored part that marks a layer (its name suffix and
  storage types), the other parts' suffixes and the view's name;
- ``METHODS``: :class:`Method` rows, one per ``quant_method``: which formats a config uses (its
  ``format``, each ``config_groups.*.format`` of a ``mixed-precision`` config, ModelOpt's ``quant_algo``,
  bitsandbytes' ``bnb_4bit_quant_type``...) and, when a stored name could mark a layer of several of them,
  which one a layer is (``route``).

A new scheme is a module with those two lists (:class:`SchemeModule`; either may be empty) and its name
added to ``SCHEME_MODULES``.

The scheme is chosen by ``quant_method``, then by the format the method's ``schemes`` reads, then by the
tensor names: a layer is found by its marker part (``PREFIX.weight`` stored as F8_E4M3, ``PREFIX.qweight``,
``PREFIX.weight_packed``, gpt-oss' ``..._blocks``), so a layer whose scheme cannot be used is still named,
with the reason its view is absent.

**Modules left unquantized** (:func:`not_quantized`), each list with its producer's matching rule:
``ignore`` (compressed-tensors: the module's name, a trailing part of it after a ``.``, or ``re:`` a regular
expression matched from the start), ``modules_to_not_convert`` and ``llm_int8_skip_modules`` (transformers:
the key as a regular expression from the start up to a module boundary, or a suffix of the name),
``exclude_modules`` (ModelOpt: shell wildcards over the whole name, or a substring without them).
"""

from __future__ import annotations

import fnmatch
import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from ckptfs.util.jsonutil import loads

CONFIG_FILES = ("config.json", "quantize_config.json", "hf_quant_config.json")
#: the modules under ckptfs.packed that declare SCHEMES and METHODS (imported when a folder has a config)
SCHEME_MODULES = ("gptq", "awq", "compressed", "fp8", "fbgemm", "ct_float", "modelopt", "bnb", "nvfp4", "mxfp",
                  "gptoss")
MAX_CONFIG_BYTES = 16 << 20


class Absent(Exception):
    """The view of a layer cannot be offered; ``str(exc)`` says why in one line."""


@dataclass(frozen=True)
class Scheme:
    """One stored layout of quantized layers (a scheme may have several: fbgemm's linear layers and its
    experts share the id ``fbgemm_fp8``).

    A layer is ``PREFIX + joiner + marker`` stored with one of ``marker_types`` (any type when empty) while
    every part of ``requires`` is stored too; its parts are ``PREFIX + joiner + role`` for each of ``roles``
    that is stored; its view is named ``PREFIX + view``. ``module`` builds the layer's layout:
    ``build(prefix, parts, settings, context) -> Layout`` (``ckptfs.packed.base``)."""

    id: str
    method: str
    format: str
    module: str
    marker: str
    roles: tuple[str, ...]
    marker_types: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    view: str = ".weight"
    joiner: str = "."


@dataclass(frozen=True)
class Method:
    """One ``quant_method``: ``formats(settings)`` the formats a config uses (:class:`Absent` when it
    cannot say); ``route(prefix, settings)`` the format of one layer where several could claim its marker
    (None: the first that matches, in ``formats`` order)."""

    name: str
    formats: Callable[[Mapping[str, Any]], tuple[str, ...]]
    route: Callable[[str, Mapping[str, Any]], str | None] | None = None


def one_format(settings: Mapping[str, Any]) -> tuple[str, ...]:
    """The formats of a method with one stored layout."""
    return ("",)


class SchemeModule(Protocol):
    """What a module of ``SCHEME_MODULES`` declares (either list may be empty)."""

    SCHEMES: Sequence[Scheme]
    METHODS: Sequence[Method]


@dataclass
class Registry:
    schemes: list[Scheme] = field(default_factory=list)
    methods: dict[str, Method] = field(default_factory=dict)
    by_format: dict[tuple[str, str], list[Scheme]] = field(default_factory=dict)


_registry: Registry | None = None


def registry() -> Registry:
    """Every scheme module's SCHEMES and METHODS (imported once, on the first folder with a config)."""
    global _registry
    if _registry is None:
        found = Registry()
        for name in SCHEME_MODULES:
            module = cast(SchemeModule, importlib.import_module(f"ckptfs.packed.{name}"))
            for scheme in module.SCHEMES:
                found.schemes.append(scheme)
                found.by_format.setdefault((scheme.method, scheme.format), []).append(scheme)
            for method in module.METHODS:
                found.methods[method.name] = method
        _registry = found
    return _registry


@dataclass
class QuantConfig:
    """The quantization settings of a checkpoint, or why they could not be read."""

    method: str | None                  # quant_method, lower case; None when unreadable
    settings: Mapping[str, Any] = field(default_factory=dict)
    origin: str = ""                    # "config.json quantization_config" | "quantize_config.json" | ...
    problem: str | None = None          # why no view can be made (unknown method or format, unreadable file)
    schemes: tuple[Scheme, ...] = ()    # the layouts the settings use
    torch_dtype: str | None = None      # the release's dtype (config.json torch_dtype / dtype), if named
    #: format -> why it cannot be used, for a config of several formats (``mixed-precision``) of which only
    #: some are unknown: only the layers routed to these lose their views
    unsupported: Mapping[str, str] = field(default_factory=dict)


def read_config(passthrough: Mapping[str, str], read: Callable[[str], bytes]) -> QuantConfig | None:
    """The quantization settings named by the pass-through files (``name -> path``), read with
    ``read(path)``; None when the folder has no quantization settings at all."""
    problems = []
    torch_dtype = None
    for name in CONFIG_FILES:
        path = passthrough.get(name)
        if path is None:
            continue
        try:
            doc = loads(read(path), name)
        except (OSError, ValueError) as exc:  # CheckpointError is a ValueError
            problems.append(f"{name} cannot be read: {exc}")
            continue
        if not isinstance(doc, Mapping):
            problems.append(f"{name} is not a JSON object")
            continue
        if name == "config.json":
            dtype = doc.get("torch_dtype", doc.get("dtype"))
            torch_dtype = dtype if isinstance(dtype, str) else None
            settings = doc.get("quantization_config")
            if settings is None:
                continue
            origin = "config.json quantization_config"
        elif name == "hf_quant_config.json":
            settings, origin = doc.get("quantization"), "hf_quant_config.json quantization"
            if isinstance(settings, Mapping):
                settings = {"quant_method": "modelopt", **settings}
        else:
            settings, origin = doc, name
        if not isinstance(settings, Mapping):
            return QuantConfig(None, {}, origin, f"{origin} is not a JSON object", torch_dtype=torch_dtype)
        return _config(name, settings, origin, torch_dtype)
    if problems:
        return QuantConfig(None, {}, "", "; ".join(problems), torch_dtype=torch_dtype)
    return None


def _config(name: str, settings: Mapping[str, Any], origin: str, torch_dtype: str | None) -> QuantConfig:
    method = settings.get("quant_method", "gptq" if name == "quantize_config.json" else None)
    if not isinstance(method, str):
        return QuantConfig(None, settings, origin, f"{origin} names no quant_method", torch_dtype=torch_dtype)
    method = method.lower()
    reg = registry()
    found = reg.methods.get(method)
    if found is None:
        return QuantConfig(method, settings, origin, f"unknown quantization scheme {method!r} in {origin}",
                           torch_dtype=torch_dtype)
    try:
        formats = found.formats(settings)
    except Absent as exc:
        return QuantConfig(method, settings, origin, f"{exc} in {origin}", torch_dtype=torch_dtype)
    except (TypeError, ValueError, AttributeError) as exc:
        return QuantConfig(method, settings, origin, f"{origin} cannot be used: {exc}", torch_dtype=torch_dtype)
    unknown = {f: f"{method} format {f!r} is not supported (in {origin})"
               for f in formats if (method, f) not in reg.by_format}
    if len(unknown) == len(formats) or (unknown and found.route is None):
        # every format unknown, or no way to tell which layers are the unknown one's: no layer is decoded
        return QuantConfig(method, settings, origin, next(iter(unknown.values())), torch_dtype=torch_dtype)
    known = tuple(s for f in formats if f not in unknown for s in reg.by_format[method, f])
    return QuantConfig(method, settings, origin, None, known, torch_dtype, unknown)


@dataclass
class Layer:
    """A layer found by its marker part: the scheme it belongs to (None when the config names none that
    fits) and ``role -> stored tensor name`` of its parts."""

    prefix: str
    scheme: Scheme | None
    parts: dict[str, str]
    view_name: str
    reason: str | None = None  # why a layer without a scheme has none, when the config says (an unknown format)


def find_layers(names: list[str], types: Callable[[int], str], config: QuantConfig) -> list[Layer]:
    """Every layer whose marker part is stored (``types(i)``: the storage type of tensor ``i``).

    With a usable config, the markers are those of the schemes it uses (a layer several could claim is
    routed by the method); otherwise every registered marker names a layer, whose view will be absent with
    the config's problem as the reason. Where only some of a config's formats are unknown
    (``config.unsupported``), a layer the method routes to one of them is named too, without a scheme and
    with that format's reason, whichever registered marker found it."""
    reg = registry()
    usable = config.problem is None
    candidates = list(config.schemes) if usable else reg.schemes
    if usable and config.unsupported:  # the unknown formats' layers: found by any marker, routed below
        candidates += [s for s in reg.schemes if s not in candidates]
    method = reg.methods.get(config.method or "") if usable else None
    present = set(names)
    layers: dict[str, Layer] = {}
    for i, name in enumerate(names):
        claims = []
        for scheme in candidates:
            tail = scheme.joiner + scheme.marker
            if not name.endswith(tail) or len(name) == len(tail):
                continue
            prefix = name[:-len(tail)]
            if prefix + scheme.view in layers:
                continue
            if scheme.marker_types and types(i) not in scheme.marker_types:
                continue
            if any(prefix + scheme.joiner + role not in present for role in scheme.requires):
                continue
            claims.append((prefix, scheme))
        if not claims:
            continue
        prefix, scheme = claims[0]
        chosen = None
        if (len(claims) > 1 or config.unsupported) and method is not None and method.route is not None:
            try:
                chosen = method.route(prefix, config.settings)
            except Absent:  # the build of the first claim says why
                chosen = None
            prefix, scheme = next(((p, s) for p, s in claims if s.format == chosen), claims[0])
        reason = config.unsupported.get(chosen or "") if usable else None
        if usable and reason is None and scheme not in config.schemes:
            continue  # a marker of a scheme the config does not use, on a layer of a format it does
        parts = {role: f"{prefix}{scheme.joiner}{role}" for role in scheme.roles
                 if f"{prefix}{scheme.joiner}{role}" in present}
        layers[prefix + scheme.view] = Layer(prefix, scheme if usable and reason is None else None, parts,
                                             prefix + scheme.view, reason)
    return list(layers.values())


# ------------------------------------------------------------------------------ activation and KV-cache scales

#: The last name part of the scales (and zero points) a quantizing runtime applies to activations and to the
#: KV cache, never to a weight. The unquantized model has no parameter of these names (transformers' loader
#: reports them as unexpected keys), so the release holds none of them wherever they are stored:
#: compressed-tensors' activation qparams (``input_``/``output_`` + ``scale``, ``zero_point``,
#: ``global_scale``) and its ``kv_cache_scheme``'s ``k_scale``/``v_scale`` (``q_scale`` with attention
#: quantization; zero points when asymmetric) on the attention module, or ``k_proj.output_scale`` in older
#: exports; ModelOpt's ``input_scale``/``output_scale`` and, under ``kv_cache_quant_algo``, ``k_proj.k_scale``
#: and ``v_proj.v_scale``; transformers' FP8 ``activation_scale``; fbgemm's ``input_scale_ub``; AutoFP8's
#: ``kv_scale``. Names a layer's scheme claims as parts (ModelOpt FP8's ``k_scale``) are that layer's.
ACTIVATION_SCALES = frozenset({
    "input_scale", "input_zero_point", "input_global_scale", "output_scale", "output_zero_point",
    "output_global_scale", "k_scale", "v_scale", "q_scale", "k_zero_point", "v_zero_point", "q_zero_point",
    "kv_scale", "activation_scale", "input_scale_ub"})


def activation_scales(names: Sequence[str], layers: Sequence[Layer]) -> list[str]:
    """The stored tensors of ``names`` that scale activations or the KV cache (:data:`ACTIVATION_SCALES`) and
    are no part of a layer in ``layers`` (a layer's parts go with its view: dropped from the release when
    the view is present, kept when it is absent)."""
    parts = {name for layer in layers for name in layer.parts.values()}
    return [name for name in names if name.rpartition(".")[2] in ACTIVATION_SCALES and name not in parts]


# ------------------------------------------------------------------------------ modules left unquantized

#: setting -> the matching rule of the producer that writes it
SKIP_LISTS = {"ignore": "compressed-tensors", "modules_to_not_convert": "transformers",
              "llm_int8_skip_modules": "transformers", "exclude_modules": "modelopt"}


def not_quantized(prefix: str, settings: Mapping[str, Any]) -> str | None:
    """Why layer ``prefix`` is one the config leaves unquantized (``"in the config's ignore list (lm_head)"``),
    or None. A pattern that is not a valid regular expression is an :class:`Absent`."""
    for key, rule in SKIP_LISTS.items():
        patterns = settings.get(key)
        if not patterns:
            continue
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            if isinstance(pattern, str) and _matches(rule, pattern, prefix):
                return f"layer is in the config's {key} list ({pattern})"
    return None


def _matches(rule: str, pattern: str, name: str) -> bool:
    try:
        if rule == "compressed-tensors":
            if pattern.startswith("re:"):
                return re.match(pattern[3:], name) is not None
            return name == pattern or name.endswith("." + pattern)
        if rule == "transformers":
            boundary = r"(?:(?<=\.)|(?=\.|$))"
            return re.match(rf"(?:{pattern}){boundary}", name) is not None or name.endswith(pattern)
    except re.error as exc:
        raise Absent(f"pattern {pattern!r} is not a valid regular expression: {exc}") from None
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name
