"""Values made once per key, on first use, under a lock: :class:`MadeOnce`.

What a runtime keeps per key (a client per environment, an origin's limit, the fetches of a file's content)
is looked up often and made rarely; two threads asking for a new key at once must get the same value, and a
forked child needs a fresh lock (a parent's thread may have held it at the fork).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, MutableMapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class MadeOnce(Generic[K, V]):
    """``get(key, make)``: the value kept for ``key``, made by ``make()`` on first use. ``store`` is where the
    values are kept (a ``WeakValueDictionary`` forgets those nobody holds); a dict when not given."""

    def __init__(self, store: MutableMapping[K, V] | None = None) -> None:
        self._store: MutableMapping[K, V] = store if store is not None else {}
        self._lock = threading.Lock()

    def get(self, key: K, make: Callable[[], V]) -> V:
        with self._lock:
            found = self._store.get(key)
            if found is None:
                found = self._store[key] = make()
            return found

    def items(self) -> list[tuple[K, V]]:
        """The keys and values kept now."""
        with self._lock:
            return list(self._store.items())

    def in_child(self) -> MadeOnce[K, V]:
        """In a forked child: the same values under a fresh lock (itself, so that a runtime part kept whole in
        the child can name this as its ``in_child``)."""
        self._lock = threading.Lock()
        return self
