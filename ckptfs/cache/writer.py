"""Writes to a lower tier off the read path: one background thread per tier, a bounded queue.

A read that had to decode should not also wait for a disk write (a few ms on a busy disk) or a Redis SET
(up to its timeout when Redis is slow): the decoded group is handed to this writer and the read returns.
When the queue holds ``max_bytes`` already (the tier is slower than the decoder), the reader waits up to
``max_wait`` for room (back-pressure: a tier that keeps up only slowly still gets every group, and another
process finds all of them), then drops the group: the tier is a cache, and the next reader decodes what
it lacks. The disk tier waits long (a local disk is slow, not stuck); the Redis tier waits at most its
command timeout, so a Redis that stalls costs a reader that much once, never a hang.

The thread starts with the first write, so opening a checkpoint starts none (the daemon forks after
opening); a process forked after it started gets a fresh writer of its own. ``flush`` waits for the queue
to drain (``ckptfs prefetch`` before it exits, tests), ``close`` drains with a bound and stops the thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (imported where values are decoded: a remote fetch into the store does not need numpy)
    import numpy as np

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 << 20


#: A writer with ``write_many`` hands it what is queued, up to this many bytes at a time.
BATCH_BYTES = 4 << 20


class BackgroundWriter:
    def __init__(self, write: Callable[[str, np.ndarray], None], name: str, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_wait: float = 0.0,
                 write_many: Callable[[list[tuple[str, np.ndarray]]], None] | None = None) -> None:
        """``write_many``: writes several queued values at once (a Redis pipeline: one round trip for what
        piled up while the last write was under way, instead of one each); without it, ``write`` each."""
        self._write = write
        self._write_many = write_many
        self._name = name
        self._max_bytes = max_bytes
        self._max_wait = max_wait
        self.dropped = 0
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._queue: deque[tuple[str, np.ndarray]] = deque()
        self._waiting: dict[str, np.ndarray] = {}  # queued or being written: lookups find them here
        self._queued_bytes = 0
        self._busy = 0  # values being written now
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, key: str, value: np.ndarray) -> bool:
        """Queue ``value`` for writing; False (dropped) when the queue is full or the writer closed."""
        if self._pid != os.getpid():
            self._reset()
        with self._cond:
            deadline = None
            while self._queued_bytes and self._queued_bytes + value.nbytes > self._max_bytes and not self._closed:
                if deadline is None:
                    deadline = time.monotonic() + self._max_wait
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._closed or (self._queued_bytes and self._queued_bytes + value.nbytes > self._max_bytes):
                self.dropped += 1
                return False
            self._queue.append((key, value))
            self._waiting[key] = value
            self._queued_bytes += value.nbytes
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"ckptfs-{self._name}-writer", daemon=True)
                self._thread.start()
            self._cond.notify()
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = [self._queue.popleft()]
                if self._write_many is not None:
                    size = batch[0][1].nbytes
                    while self._queue and size + self._queue[0][1].nbytes <= BATCH_BYTES:
                        batch.append(self._queue.popleft())
                        size += batch[-1][1].nbytes
                self._busy = len(batch)
            try:
                if len(batch) > 1 and self._write_many is not None:  # a batch is made only for write_many
                    self._write_many(batch)
                else:
                    self._write(*batch[0])
            except Exception as exc:  # noqa: BLE001 - the tier logs its own trouble; a bug must not stop us
                log.warning("cache tier %s: write failed: %s: %s", self._name, type(exc).__name__, exc)
            finally:
                with self._cond:
                    for key, value in batch:
                        self._queued_bytes -= value.nbytes
                        if self._waiting.get(key) is value:
                            del self._waiting[key]
                    self._busy = 0
                    self._cond.notify_all()

    def lookup(self, key: str) -> np.ndarray | None:
        """The value queued for ``key`` and not yet written, if any."""
        if self._pid != os.getpid():
            return None
        with self._cond:
            return self._waiting.get(key)

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + self._busy

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done; False if ``timeout`` passed first."""
        if self._pid != os.getpid():
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 5.0) -> None:
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
