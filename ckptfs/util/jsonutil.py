"""JSON as the mount serves it: UTF-8, indent=2, trailing newline, non-finite floats as strings.

Metadata holds numpy scalars and arrays, bytes-like values and NaN/inf (GGUF scores, for instance); strict
JSON has no NaN, so they become the strings "NaN", "Infinity", "-Infinity" (docs/interfaces.md, "Mount layout").

A tokenizer vocabulary is a list of hundreds of thousands of strings, and ``json.dumps(indent=2)`` runs in
pure Python (the C encoder only serves ``indent=None``). :func:`dumps_bytes` writes the same text as
``json.dumps(..., indent=2)`` but hands each flat list of scalars to the C encoder, with the indented item
separator, which makes the first read of a big ``metadata.json`` about twice as fast.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


def _float(x: float) -> Any:
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def to_jsonable(value: Any) -> Any:
    """Plain Python values (lists, dicts, str, int, float, bool, None) with non-finite floats as strings."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            return [to_jsonable(v) for v in value.tolist()] if not np.isfinite(value).all() else value.tolist()
        if value.dtype.kind == "c":
            return [[_float(v.real), _float(v.imag)] for v in value.tolist()]
        return value.tolist()
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, complex):
        return [_float(value.real), _float(value.imag)]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if all(type(v) is str for v in value):  # a vocabulary: nothing to convert
            return list(value)
        return [to_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return value


_FLAT = (str, int, bool, float, type(None))


def _indented(value: Any, level: int) -> str:
    """``json.dumps(value, indent=2)`` at nesting ``level``, with flat lists encoded in C."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(value, dict) and value:
        items = (f"{inner}{_compact(key)}: {_indented(item, level + 1)}" for key, item in value.items())
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and value:
        if all(type(v) in _FLAT for v in value):
            body = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",\n" + inner, ": "))
            return "[\n" + inner + body[1:-1] + "\n" + pad + "]"
        return "[\n" + ",\n".join(inner + _indented(v, level + 1) for v in value) + "\n" + pad + "]"
    return _compact(value)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def dumps_bytes(value: Any) -> bytes:
    """The bytes of a served JSON file. Lone surrogates (invalid UTF-8 names) stay escaped as \\udcXX."""
    return (_indented(to_jsonable(value), 0) + "\n").encode("utf-8", "backslashreplace")
