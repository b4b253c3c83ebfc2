"""The version pin: bytes fetched from a file whose validator cannot tell its versions apart are served only
once a later request found the file's last bytes unchanged.

nginx's ETag is the modification time in seconds and the size, ``Last-Modified`` a date to the second: a
file replaced by another of the same size within that second answers with the same validator. For such a
file the open keeps a digest of its last ``SAMPLE_BYTES`` (it joins the content identity), and
:class:`VersionPin` re-asks for them after each fetch. A replaced file answers every request after the
replacement with the new version, so a check sent after a fetch that still finds the old last bytes proves
the fetch old too. Concurrent fetches share one check; a fetch ahead of readers (read-ahead, a warm-up)
waits for one sent at least ``CHECK_SPACING_S`` after the one before it while other fetches are under way
to share it. Alone (the last piece of a stream or of a warm-up), it is checked at once: nothing would land
meanwhile to share the wait.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from ckptfs.core.errors import CheckpointError
from ckptfs.sources.netstats import COUNTERS
from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.origin import Asked, OriginClient

#: How many last bytes of a file stand for its version where the validator cannot (see the module docstring).
SAMPLE_BYTES = 4096
#: A fetch ahead of readers (read-ahead, a warm-up) is confirmed by a version check sent at least this long
#: after the one before: the pieces that land meanwhile share it. Sent at once instead, as a reader's own fetch
#: is, checks follow each other back to back and a fast origin gets one per piece (measured on loopback
#: nginx: 1,017 checks for 1,120 pieces of a 4.4 GiB warm-up, whose throughput they cut by up to a fifth).
CHECK_SPACING_S = 0.05


class VersionPin:
    """One file's pinned last bytes (``(start, end, digest)``), re-checked after each fetch (see the module
    docstring)."""

    def __init__(self, source: Asked, client: OriginClient, sample: tuple[int, int, str]):
        self.source = source
        self.client = client
        self.sample = sample
        self._lock = threading.Lock()
        self._checked_at = float("-inf")  # when the last check that passed was sent
        self._check_sent = float("-inf")  # when the last check was sent
        self._under_way = 0  # fetches between their request and their confirm
        self._count = threading.Lock()

    @contextlib.contextmanager
    def fetching(self) -> Iterator[None]:
        """The scope of one fetch whose bytes this pin confirms: from its request to its ``confirm``."""
        with self._count:
            self._under_way += 1
        try:
            yield
        finally:
            with self._count:
                self._under_way -= 1

    def confirm(self, fetched_at: float, read: ReadContext, offset: int) -> None:
        """Bytes fetched by ``fetched_at`` may be served: a check sent after that found the file's last bytes
        unchanged (this one, or one another fetch sent). ``fetched_at`` is when the answer began where the
        scheme says (``ReadContext.answered``: its version was fixed then), else when its body was in.
        CheckpointError when the last bytes differ."""
        start, end, digest = self.sample
        if read.ahead and self._under_way > 1:  # others under way may share the check: wait for them
            now = time.monotonic()  # (never more than half the time left: the check itself needs the rest)
            pause = min(self._check_sent + CHECK_SPACING_S - now, (read.deadline - now) / 2)
            if pause > 0 and self._checked_at <= fetched_at:
                time.sleep(pause)  # (without the lock: a reader's own fetch is checked meanwhile, at once)
        if not self._lock.acquire(timeout=max(0.0, read.deadline - time.monotonic())):
            raise self.client.timeout_error(offset)
        try:
            if self._checked_at > fetched_at:
                return  # a check sent after these bytes arrived passed
            from ckptfs.sources.identity import sample_digest

            sent = self._check_sent = time.monotonic()
            data = self.client.retrying(lambda one: self.source._attempt(start, end, one), read, offset,
                                        "re-checking the file's last bytes: ")
            COUNTERS.request(self.source.scheme, "ok", len(data))
            if sample_digest(data) != digest:
                COUNTERS.request(self.source.scheme, "error")
                raise CheckpointError(self.source.name, offset,
                                      f"changed since it was opened: its last {end - start} bytes differ "
                                      f"(replaced by a file of the same size within the validator's one-second "
                                      f"resolution)")
            self._checked_at = sent
        finally:
            self._lock.release()
