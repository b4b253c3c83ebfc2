"""A circuit breaker for one network endpoint of a cache tier: a Redis server, or one node of a cluster.

The first failed command marks the endpoint down: while it is down the tier does not ask it (a lookup is a
miss at once, without a socket), and one background thread pings it after 1 s, then 2, 4 ... up to 30 s,
and marks it up again once it answers. So an outage costs each reader at most one timeout, not one per read.
The endpoint's connections are dropped on failure (``drop``): a late reply on a timed-out connection is
never taken for the next command's. The outage is logged when it starts and when it ends.

The thread starts at the first failure, never before (a daemon forks after opening); a process forked
during an outage, which has no reconnect thread, starts its own at its next failure.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Breaker:
    """Up/down state of the endpoint ``where`` (a name for log lines: HOST:PORT, never a password)."""

    def __init__(self, where: str, ping: Callable[[], object], drop: Callable[[], None] = lambda: None,
                 backoff: tuple[float, float] = (1.0, 30.0)) -> None:
        self.where = where
        self._ping, self._drop = ping, drop
        self._backoff_min, self._backoff_max = backoff
        self._backoff = self._backoff_min
        self._lock = threading.Lock()
        self._down_until = 0.0      # monotonic: while now < this, the endpoint is not asked
        self.down = False
        self._reconnecting = False
        self._reconnector_pid = os.getpid()
        self._closed = False

    def available(self) -> bool:
        return not self._closed and time.monotonic() >= self._down_until

    def failed(self, exc: BaseException) -> None:
        """Mark the endpoint down after ``exc`` (a connection-level failure), start the reconnect thread."""
        with self._lock:
            self._down_until = time.monotonic() + self._backoff
            first = not self.down
            self.down = True
            if self._reconnecting and self._reconnector_pid != os.getpid():
                self._reconnecting = False
            start = not self._reconnecting and not self._closed
            self._reconnecting = self._reconnecting or start
            self._reconnector_pid = os.getpid() if start else self._reconnector_pid
        try:
            self._drop()
        except Exception:  # noqa: BLE001 - dropping dead sockets must not fail
            pass
        if first:
            log.warning("redis %s unreachable (%s: %s): decoding instead, reconnecting in the background",
                        self.where, type(exc).__name__, exc)
        if start:
            threading.Thread(target=self._reconnect, name="ckptfs-redis-reconnect", daemon=True).start()

    def succeeded(self) -> None:
        if self.down:
            with self._lock:
                was_down, self.down = self.down, False
                self._down_until = 0.0
                self._backoff = self._backoff_min
            if was_down:
                log.warning("redis %s is back", self.where)

    def _reconnect(self) -> None:
        """Ping after each backoff interval until the endpoint answers or the breaker closes."""
        try:
            while not self._closed:
                with self._lock:
                    wait = self._down_until - time.monotonic()
                if wait > 0:
                    time.sleep(min(wait, 0.25))
                    continue
                try:
                    self._ping()
                except Exception:  # noqa: BLE001 - any failure of the probe is "still down": back off
                    with self._lock:
                        self._backoff = min(self._backoff * 2, self._backoff_max)
                        self._down_until = time.monotonic() + self._backoff
                    continue
                self.succeeded()
                return
        finally:
            with self._lock:
                self._reconnecting = False

    def close(self) -> None:
        self._closed = True
