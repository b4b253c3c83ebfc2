"""Counters of remote-source traffic: what ``user.ckptfs.stats`` shows under ``source``.

One set of counters per runtime (``SOURCE_COUNTERS``, a part of ``ckptfs.core.runtime``: a mount daemon serves
one checkpoint; a library user wants the process's total), kept
per scheme and per request outcome as well so the Prometheus names ``ckptfs_source_requests_total{scheme,
outcome}`` and ``ckptfs_source_bytes_total{scheme}`` can be served from the same numbers. Outcomes are
``ok`` (an answer used), ``retry`` (a failed attempt that was tried again), ``error`` (a failed attempt that
ended the read) and ``timeout`` (an attempt abandoned for stalling or for the read's deadline).
"""

from __future__ import annotations

from typing import Any
import threading
from collections import Counter

from ckptfs.core.runtime import Part

OUTCOMES = ("ok", "retry", "error", "timeout")


class SourceCounters:
    """Thread-safe counters: requests sent, payload bytes received, retries, mirror failovers, chunk bytes
    the shared tier served."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[tuple[str, str]] = Counter()  # (scheme, outcome) -> n
        self._bytes: Counter[str] = Counter()  # scheme -> n
        self.retries = 0
        self.failovers = 0
        self.shared_bytes = 0  # chunk bytes taken from the fleet's shared tier instead of the origin

    def request(self, scheme: str, outcome: str, nbytes: int = 0, retried: bool = False) -> None:
        """One request ended with ``outcome``; ``retried``: it is tried again (a stalled attempt is a
        ``timeout`` and a retry)."""
        with self._lock:
            self._requests[(scheme, outcome)] += 1
            self._bytes[scheme] += nbytes
            if retried or outcome == "retry":
                self.retries += 1

    def shared(self, nbytes: int) -> None:
        """A chunk of ``nbytes`` came from the shared tier (``--redis``), not from its origin."""
        with self._lock:
            self.shared_bytes += nbytes

    def failover(self) -> None:
        with self._lock:
            self.failovers += 1

    def snapshot(self) -> dict[str, Any]:
        """``{"requests", "bytes", "retries", "failovers", "shared_bytes", "by_scheme": {scheme: {"requests":
        {outcome: n}, "bytes": n}}}`` (``bytes``: received from the origins; ``shared_bytes``: chunks the
        shared tier served instead)."""
        with self._lock:
            by_scheme: dict[str, dict[str, Any]] = {}
            for (scheme, outcome), n in self._requests.items():
                entry = by_scheme.setdefault(scheme, {"requests": {}, "bytes": 0})
                entry["requests"][outcome] = n
            for scheme, n in self._bytes.items():
                by_scheme.setdefault(scheme, {"requests": {}, "bytes": 0})["bytes"] = n
            return {"requests": sum(self._requests.values()), "bytes": sum(self._bytes.values()),
                    "retries": self.retries, "failovers": self.failovers, "shared_bytes": self.shared_bytes,
                    "by_scheme": by_scheme}


    def in_child(self) -> SourceCounters:
        """In a forked child: the same counts (a mount's daemon counts its open's requests too), a fresh lock
        (a parent's thread may have held it at fork)."""
        self._lock = threading.Lock()
        return self


#: A runtime's counters (``RemoteOptions.counters`` for a source's own).
SOURCE_COUNTERS = Part("source counters", SourceCounters, SourceCounters.in_child)
