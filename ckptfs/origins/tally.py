"""What each origin cost its readers in this process: its outages, and the full deadlines readers met.

An **outage** (``ckptfs.sources.remote.outage``) starts when a fetch used its whole ``--timeout`` without
getting its bytes; while it lasts, fetches end by its start + ``--timeout`` or fail at once. ``deadlines_met``
counts the times readers waited a whole ``--timeout`` for the origin: fetches that ran out side by side (the
kernel's parallel requests of one read, arrived before the first of them ran out) are one wait, as the
application sees it. With the rule holding, an origin that stays down costs one deadline per outage
(``deadlines_met`` == ``outages``); more means reads met a deadline each. ``ckptfs stats`` shows both under
``source.origins`` beside the in-flight limit (``limit.py``).
"""

from __future__ import annotations

import threading
from typing import Any

from ckptfs.util.forks import after_fork_in_child


class OriginTally:
    """One origin's counters (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outages = 0
        self.deadlines_met = 0
        self._counted_until = float("-inf")  # the end of the last wait counted (monotonic seconds)

    def outage(self) -> None:
        with self._lock:
            self.outages += 1

    def deadline_met(self, arrival: float, timeout: float) -> None:
        """A fetch that arrived at ``arrival`` ran out of its whole ``timeout``: one more wait unless it began
        inside the one counted last."""
        with self._lock:
            if arrival >= self._counted_until:
                self.deadlines_met += 1
                self._counted_until = arrival + timeout

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"outages": self.outages, "deadlines_met": self.deadlines_met}


_tallies: dict[str, OriginTally] = {}
_tallies_lock = threading.Lock()


def origin_tally(origin: str) -> OriginTally:
    """The process's counters of ``origin`` (a scheme and host: every open of it adds to the same)."""
    with _tallies_lock:
        found = _tallies.get(origin)
        if found is None:
            found = _tallies[origin] = OriginTally()
        return found


def tally_stats() -> dict[str, dict[str, Any]]:
    with _tallies_lock:
        return {origin: tally.stats() for origin, tally in _tallies.items()}


def _forget_in_child() -> None:
    """A forked child counts from the parent's numbers, with locks of its own."""
    global _tallies_lock
    _tallies_lock = threading.Lock()
    for tally in _tallies.values():
        tally._lock = threading.Lock()


after_fork_in_child(_forget_in_child)
