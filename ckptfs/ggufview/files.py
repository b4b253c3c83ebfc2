"""The folder's JSON files as the header's builders read them: each parsed once per build.

A large ``tokenizer.json`` (9 MB for a 262,144-token vocabulary) is read by several rules (the pre-tokenizer's
shape, the post-processor's flags, the rows an embedding keeps); parsing it once saves a second of mount
time. The parses are kept only while a header is built (``one_build``), not for the mount's life.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_parsed: dict[tuple[str, int, int], Any] = {}
_builds = 0


def read_json(path: Path) -> Any:
    """A JSON file's value (None when there is no such file); the value is shared: never change it."""
    if not path.is_file():
        return None
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    with _lock:
        if key in _parsed:
            return _parsed[key]
    with open(path, encoding="utf-8") as f:
        value = json.load(f)
    with _lock:
        if _builds:
            _parsed[key] = value
    return value


@contextmanager
def one_build() -> Iterator[None]:
    """Parses are kept while at least one build runs, dropped when the last one ends."""
    global _builds
    with _lock:
        _builds += 1
    try:
        yield
    finally:
        with _lock:
            _builds -= 1
            if not _builds:
                _parsed.clear()
