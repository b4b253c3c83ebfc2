"""Bounded waiting: every wait for a server, a mount or a log line polls a predicate until a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Whether ``predicate()`` became true within ``timeout`` seconds (polled every ``interval``)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
