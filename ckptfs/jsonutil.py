"""JSON as the mount serves it: UTF-8, indent=2, trailing newline, non-finite floats as strings.

Metadata holds numpy scalars and arrays, bytes-like values and NaN/inf (GGUF scores, for instance); strict
JSON has no NaN, so they become the strings "NaN", "Infinity", "-Infinity" (CONTRACT.md).
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
        return [to_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return value


def dumps_bytes(value: Any) -> bytes:
    """The bytes of a served JSON file. Lone surrogates (invalid UTF-8 names) stay escaped as \\udcXX."""
    return (json.dumps(to_jsonable(value), indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode(
        "utf-8", "backslashreplace")
