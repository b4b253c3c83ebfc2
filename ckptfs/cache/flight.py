"""Single flight: concurrent callers asking for the same missing value wait for one computation of it.

FUSE runs many reader threads and the kernel's readahead sends neighbouring requests at once, so the same
missing group (or remote chunk) is often asked for several times before the first answer is in. The first
caller computes; the others wait and get its value, or its exception.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable


class _Flight:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value = None
        self.error: BaseException | None = None


class SingleFlight:
    """``run(key, compute)``: ``compute()``'s result, computed once for all concurrent callers of ``key``."""

    def __init__(self) -> None:
        self._flights: dict[Hashable, _Flight] = {}
        self._lock = threading.Lock()

    def run(self, key: Hashable, compute: Callable[[], object]):
        with self._lock:
            flight = self._flights.get(key)
            owner = flight is None
            if owner:
                flight = self._flights[key] = _Flight()
        if not owner:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.value
        try:
            flight.value = compute()
            return flight.value
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                self._flights.pop(key, None)
            flight.done.set()

    def pending(self, key: Hashable) -> bool:
        """Whether a computation of ``key`` is under way (read-ahead skips what is already coming)."""
        with self._lock:
            return key in self._flights

    def reset_lock(self) -> None:
        """A fresh lock and no flights (in a forked child, whose parent's computing threads do not exist)."""
        self._lock = threading.Lock()
        self._flights = {}
