"""Single flight: concurrent callers asking for the same missing value wait for one computation of it.

FUSE runs many reader threads and the kernel's readahead sends neighbouring requests at once, so the same
missing group (or remote chunk) is often asked for several times before the first answer is in. The first
caller computes; the others wait and get its value, or its exception.

Two ways to use it: :meth:`SingleFlight.run` computes one key (the tiered cache's decoded groups);
:meth:`claim` / :meth:`finish` / :meth:`wait` let one caller own many keys at once and fill them as one
piece of work arrives (a remote source fetching a run of chunks in one request, readers of single chunks
waiting on it).

:class:`NamedFlights` (a runtime's part ``FLIGHTS``) gives every reader of one remote file's content the same
SingleFlight (``FLIGHTS.named``), so
two objects reading the same bytes (the header reader of an open and a warm-up of that file started before
it, two sources of one URL) wait for each other's fetches instead of fetching the bytes twice.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar, cast

from ckptfs.core.runtime import Part
from ckptfs.util.keyed import MadeOnce

T = TypeVar("T")


class Flight:
    """One computation in progress: ``done`` is set once ``value`` or ``error`` is there."""

    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class SingleFlight:
    """The computations in progress, by key (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._flights: dict[Hashable, Flight] = {}
        self._lock = threading.Lock()
        #: Flights ended so far: a caller that looked up values before claiming compares it, before and
        #: after, to know whether a computation may have ended (its value stored) in between.
        self.finished = 0

    def run(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``'s result, computed once for all concurrent callers of ``key``."""
        flight = self.join_or_claim(key)
        if flight is not None:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return cast(T, flight.value)  # every caller of one key computes the same kind of value
        try:
            value = compute()
        except BaseException as exc:
            self.finish(key, error=exc)
            raise
        self.finish(key, value)
        return value

    def join_or_claim(self, key: Hashable) -> Flight | None:
        """The flight of ``key`` under way (to wait on), or None when the caller now owns ``key`` and must
        :meth:`finish` it."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is None:
                self._flights[key] = Flight()
            return flight

    def claim(self, keys: Iterable[Hashable]) -> list[Hashable]:
        """Own every key of ``keys`` that nobody computes; the keys claimed (each must be finished)."""
        claimed = []
        with self._lock:
            for key in keys:
                if key not in self._flights:
                    self._flights[key] = Flight()
                    claimed.append(key)
        return claimed

    def finish(self, key: Hashable, value: Any = None, error: BaseException | None = None) -> None:
        """End ``key``'s flight with its value or error, waking its waiters (nothing if it has none)."""
        with self._lock:
            flight = self._flights.pop(key, None)
            self.finished += 1
        if flight is not None:
            flight.value, flight.error = value, error
            flight.done.set()

    def under_way(self, keys: Iterable[Hashable]) -> list[Flight]:
        """The flights of ``keys`` in progress now (to wait for their ends)."""
        with self._lock:
            return [flight for flight in map(self._flights.get, keys) if flight is not None]

    def pending(self, key: Hashable) -> bool:
        """Whether a computation of ``key`` is under way (read-ahead skips what is already coming)."""
        with self._lock:
            return key in self._flights

    def __len__(self) -> int:
        with self._lock:
            return len(self._flights)

    def fail_all(self, error: BaseException) -> None:
        """End every flight with ``error`` and take a fresh lock: in a forked child, whose parent's computing
        threads do not exist, their waiters must not wait (they compute for themselves instead)."""
        self._lock = threading.Lock()
        for key in list(self._flights):
            self.finish(key, error=error)


class NamedFlights:
    """A runtime's SingleFlight of each name (a remote file's content identity: the same name is the same
    bytes), held weakly by the readers of the name."""

    def __init__(self) -> None:
        self._named: MadeOnce[str, SingleFlight] = MadeOnce(weakref.WeakValueDictionary())

    def named(self, name: str) -> SingleFlight:
        """The SingleFlight of ``name``, shared by every caller that holds it; a fresh one once none does."""
        return self._named.get(name, SingleFlight)

    def in_child(self) -> NamedFlights:
        """In a forked child: a fresh lock (each holder's flights are failed by its read-ahead's reset)."""
        self._named.in_child()
        return self


#: A runtime's flights by content (``RemoteOptions.runtime``: every source of the same bytes shares them).
FLIGHTS = Part("flights by content", NamedFlights, NamedFlights.in_child)
