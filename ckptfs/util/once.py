"""Saying a thing once: :class:`OncePerCause` remembers the causes already said (an EIO's cause in the mount's
log, a manifest's warning), so each is said the first time only; the most recent ``limit`` are remembered,
so a stream of distinct causes cannot grow it without bound."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

CAUSES_REMEMBERED = 4096


class OncePerCause:
    """Remembers the causes seen recently: ``first(cause)`` is True only the first time."""

    def __init__(self, limit: int = CAUSES_REMEMBERED):
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def first(self, cause: Hashable) -> bool:
        with self._lock:
            if cause in self._seen:
                self._seen.move_to_end(cause)
                return False
            self._seen[cause] = None
            if len(self._seen) > self._limit:
                self._seen.popitem(last=False)
            return True

    def in_child(self) -> OncePerCause:
        """In a forked child: the causes the parent said (not said again), under a fresh lock."""
        self._lock = threading.Lock()
        return self
