"""A read-only Mapping whose values are decoded on first lookup and then kept.

A GGUF tokenizer holds hundreds of thousands of strings; building Python objects for them at open would
cost more than everything else together, and most users never look at them. The reader therefore records
only where each value lives, and this mapping decodes a value the first time it is asked for. Membership,
iteration and ``len`` never decode anything.

Values handed out are safe to keep and modify: numpy arrays are read-only (so the cached copy cannot be
changed behind our back) and lists are fresh copies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import numpy as np

E = TypeVar("E")


class LazyMetadata(Mapping[str, Any], Generic[E]):
    """Keys in file order -> values produced by ``decode(entry)`` on first access."""

    def __init__(self, entries: dict[str, E], decode: Callable[[E], Any], describe: Callable[[E], str]) -> None:
        self._entries = entries
        self._decode = decode
        self._describe = describe
        self._cache: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        try:
            value = self._cache[key]
        except KeyError:
            value = _freeze(self._decode(self._entries[key]))
            self._cache[key] = value
        return _fresh(value)

    def peek(self, key: str) -> Any:
        """The value of ``key`` without keeping it: for one-off consumers such as a mount's metadata.json,
        which holds its own JSON copy, so keeping a 262,144-string vocabulary decoded too would only double
        the daemon's memory."""
        if key in self._cache:
            return _fresh(self._cache[key])
        return self._decode(self._entries[key])

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def value_type(self, key: str) -> str:
        """The stored type of a value as the format names it, e.g. ``UINT32`` or ``ARRAY[STRING]``."""
        return self._describe(self._entries[key])

    def is_decoded(self, key: str) -> bool:
        """Whether the value of ``key`` has been decoded already (lets tests and tools check laziness)."""
        return key in self._cache

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {len(self)} keys, {len(self._cache)} decoded>"


def _freeze(value: Any) -> Any:
    """Make cached numpy arrays read-only, so that handing them out cannot change the cache."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, list):
        for item in value:
            if not isinstance(item, (np.ndarray, list)):
                break
            _freeze(item)
    return value


def _fresh(value: Any) -> Any:
    """A copy of a cached list (arrays are read-only and shared; scalars and str are immutable)."""
    if not isinstance(value, list):
        return value
    if value and isinstance(value[0], (np.ndarray, list)):
        return [_fresh(item) for item in value]
    return list(value)
