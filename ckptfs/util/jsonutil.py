"""JSON as the mount serves it: UTF-8, indent=2, trailing newline, non-finite floats as strings.

Metadata holds numpy scalars and arrays, bytes-like values and NaN/inf (GGUF scores, for instance); strict
JSON has no NaN, so they become the strings "NaN", "Infinity", "-Infinity" (docs/interfaces.md, "Mount layout").

A tokenizer vocabulary is a list of hundreds of thousands of strings, and ``json.dumps(indent=2)`` runs in
pure Python (the C encoder only serves ``indent=None``). :func:`dumps_bytes` writes the same text as
``json.dumps(..., indent=2)`` but hands each flat list of scalars to the C encoder, with the indented item
separator, which makes the first read of a big ``metadata.json`` about twice as fast.

JSON a model folder brings (``config.json``, ``tokenizer.json``, ``modules.json``...) is read with
:func:`load_file` or, for bytes already fetched, :func:`loads`: the one reader of such files, which a hostile
folder cannot use to hang or crash a mount. Only a regular file is opened (the open never blocks: a FIFO in
its place is refused, not waited on), at most :data:`MAX_FILE_BYTES`, and nesting past the parser's
recursion bound (a ``config.json`` of 200,000 ``[``) is a one-line :class:`JsonRefused`, not a
``RecursionError``.
"""

from __future__ import annotations

import json
import math
import os
import stat
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


#: Past this a file is not a config or tokenizer file (the largest tokenizer.json known is tens of MB).
MAX_FILE_BYTES = 128 << 20


class JsonRefused(ValueError):
    """A model folder's JSON file that is not read: not a regular file, too large, nested too deep or not
    JSON. The message is one line naming the file."""


def loads(data: bytes | str, name: str) -> Any:
    """The value of the JSON text ``data`` (from the file ``name``, which messages name)."""
    try:
        return json.loads(data)
    except RecursionError:  # the C decoder's own bound on nesting (the interpreter's recursion limit)
        raise JsonRefused(f"{name} is nested too deeply to be read") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise JsonRefused(f"{name} is not valid JSON: {str(exc).splitlines()[0]}") from None


def read_regular(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``max_bytes`` (JsonRefused otherwise).
    Opened non-blocking, then checked on the open descriptor: a FIFO or a device planted under the name is
    refused before anything is read from it, and cannot be swapped in between a check and the open."""
    name = os.fspath(path)
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise JsonRefused(f"{name} is not a regular file")
        if st.st_size > max_bytes:
            raise JsonRefused(f"{name} is {st.st_size} bytes, more than the {max_bytes} read of such a file")
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:  # it grew while read
            raise JsonRefused(f"{name} is more than the {max_bytes} bytes read of such a file")
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_file(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The JSON value of the regular file ``path`` (see :func:`read_regular` and :func:`loads`)."""
    return loads(read_regular(path, max_bytes), os.fspath(path))
