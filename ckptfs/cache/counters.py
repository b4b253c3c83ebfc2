"""Counters and log-once warnings of a lower cache tier (shared by the disk and Redis tiers).

A tier in trouble (full, down, corrupt) would otherwise log on every read; each kind of trouble is logged
once per process and counted always.
"""

from __future__ import annotations

import logging
import threading


class TierCounters:
    def __init__(self, log: logging.Logger, names: tuple[str, ...]) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(names, 0)
        self._warned: set[str] = set()

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    def warn_once(self, kind: str, message: str, *args: object) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        self._log.warning(message, *args)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
