"""The version pin: bytes fetched from a file whose validator cannot tell its versions apart are served only
once a later request found the file's last bytes unchanged.

nginx's ETag is the modification time in seconds and the size, ``Last-Modified`` a date to the second: a
file replaced by another of the same size within that second answers with the same validator. For such a
file the open keeps a digest of its last ``SAMPLE_BYTES`` (it joins the content identity), and
:class:`VersionPin` re-asks for them after each fetch. A replaced file answers every request after the
replacement with the new version, so a check sent after a fetch that still finds the old last bytes proves
the fetch old too. Concurrent fetches share one check; a fetch ahead of readers (read-ahead, a warm-up)
waits for one sent at least ``CHECK_SPACING_S`` after the one before it while other fetches are under way
to share it, unless a reader waits for bytes under way (a stream's reader waiting for its next piece: the
pause would be its wait too). Alone (the last piece of a stream or of a warm-up), it is checked at once:
nothing would land meanwhile to share the wait.

A check covers an answer from the moment its headers are in (the server opened the file then), so it need
not wait for the body: once every fetch under way has its answer (the last pieces of a warm-up or of a
stream, a reader's lone fetch), a check goes out at once, beside the bodies still arriving, and their
``confirm`` finds it done instead of sending one a round trip after the last body. That early check is best
effort: a confirm waits for it about as long as a check takes, then sends its own as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Iterator

from ckptfs.core.errors import CheckpointError
from ckptfs.core.runtime import LIVE
from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.origin import OriginClient, Retryable
from ckptfs.sources.remote.ranges import RangeClient

log = logging.getLogger(__name__)

#: How many last bytes of a file stand for its version where the validator cannot (see the module docstring).
SAMPLE_BYTES = 4096
#: A fetch ahead of readers (read-ahead, a warm-up) is confirmed by a version check sent at least this long
#: after the one before: the pieces that land meanwhile share it. Sent at once instead, as a reader's own fetch
#: is, checks follow each other back to back and a fast origin gets one per piece (measured on loopback
#: nginx: 1,017 checks for 1,120 pieces of a 4.4 GiB warm-up, whose throughput they cut by up to a fifth).
CHECK_SPACING_S = 0.05




class _EarlyCheck:
    """A check sent once every fetch under way had its answer (``VersionPin._check_early``): when it went
    out, and set once it has ended (passed or not)."""

    def __init__(self) -> None:
        self.sent = time.monotonic()
        self.ended = threading.Event()


class Unpinned:
    """A file whose validator tells its versions apart: its fetches are served as they land (the chunk
    fetcher asks this or a :class:`VersionPin` alike)."""

    def fetching(self, read: ReadContext) -> contextlib.AbstractContextManager[ReadContext]:
        return contextlib.nullcontext(read)

    def landed(self, read: ReadContext, offset: int) -> None:
        return None

    def awaited(self) -> None:
        return None


class VersionPin:
    """One file's pinned last bytes (``(start, end, digest)``), re-checked after each fetch (see the module
    docstring). It asks through the file's range client (``source``: one attempt, for the early check) and
    its origin client (``client``: retried), both below it in the chain (``ranges``)."""

    def __init__(self, source: RangeClient, client: OriginClient, sample: tuple[int, int, str]):
        self.source = source
        self.client = client
        self.sample = sample
        self._lock = threading.Lock()  # held by a confirm's check being sent (one at a time)
        self._checked_at = float("-inf")  # when the last check that passed was sent
        self._check_sent = float("-inf")  # when the last check was sent
        self._check_took = CHECK_SPACING_S  # how long the last check that passed took, answer and all
        self._count = threading.Lock()  # the state below, and ``_checked_at``'s updates
        self._under_way = 0  # fetches between their request and their confirm
        self._unanswered = 0  # of those, the ones whose answer has not begun
        self._last_answer = float("-inf")  # when the latest answer began
        self._early: _EarlyCheck | None = None  # the early check on its way, if any
        self._awaited = threading.Event()  # a reader waits for bytes a fetch ahead brings: checks share no more
        source.options.runtime.get(LIVE).add(self)  # reset in a forked child (``in_child``)

    def in_child(self) -> None:
        """In a forked child: the parent's fetches and checks are gone (threads do not survive ``fork``): a
        lock one of them held is free, and none is under way."""
        self._lock, self._count = threading.Lock(), threading.Lock()
        self._under_way = self._unanswered = 0
        self._early = None
        self._awaited = threading.Event()

    @contextlib.contextmanager
    def fetching(self, read: ReadContext) -> Iterator[ReadContext]:
        """The scope of one fetch whose bytes this pin confirms, from its request to its ``confirm``: ``read``
        as the fetch's context, whose answer tells the pin it has begun (see the module docstring)."""
        heard = False

        def answered() -> None:
            nonlocal heard
            early = None
            with self._count:
                self._last_answer = time.monotonic()
                if heard:
                    return  # a retry's answer: the first one already counted (and may have sent the check)
                heard = True
                self._unanswered -= 1
                # (no thread while the checkpoint's headers are read: a mount forks its daemon after that)
                if self._unanswered == 0 and self._early is None and self.source.options.read_ahead:
                    early = self._early = _EarlyCheck()
            if early is not None:
                threading.Thread(target=self._check_early, args=(early, read.deadline),
                                 name="ckptfs-version-check", daemon=True).start()

        with self._count:
            self._under_way += 1
            self._unanswered += 1
        try:
            yield dataclasses.replace(read, on_answer=answered)
        finally:
            with self._count:
                self._under_way -= 1
                if not heard:
                    self._unanswered -= 1

    def landed(self, read: ReadContext, offset: int) -> None:
        """``confirm`` the bytes of the fetch ``read`` (the context ``fetching`` gave it), which just landed."""
        self.confirm(read.answered_at if read.answered_at is not None else time.monotonic(), read, offset)

    def confirm(self, fetched_at: float, read: ReadContext, offset: int) -> None:
        """Bytes fetched by ``fetched_at`` may be served: a check sent after that found the file's last bytes
        unchanged (this one, or one another fetch sent). ``fetched_at`` is when the answer began where the
        scheme says (``ReadContext.answered``: its version was fixed then), else when its body was in.
        CheckpointError when the last bytes differ."""
        if self._checked_at > fetched_at:
            return  # a check sent after these bytes arrived passed
        early = self._early
        if early is not None and early.sent > fetched_at:
            # the early check covers these bytes: wait for it about as long as a check takes, no longer (one
            # that stalls costs the confirms a round trip or two, not the stall timeout)
            early.ended.wait(max(0.0, min(2 * self._check_took, read.deadline - time.monotonic())))
            if self._checked_at > fetched_at:
                return
        if read.ahead and self._under_way > 1:  # others under way may share the check: wait for them
            now = time.monotonic()  # (never more than half the time left: the check itself needs the rest)
            pause = min(self._check_sent + CHECK_SPACING_S - now, (read.deadline - now) / 2)
            if pause > 0 and self._checked_at <= fetched_at:
                self._pause(pause)  # (without the lock: a reader's own fetch is checked meanwhile, at once)
        if not self._lock.acquire(timeout=max(0.0, read.deadline - time.monotonic())):
            raise self.client.timeout_error(offset)
        try:
            if self._checked_at > fetched_at:
                return  # a check sent after these bytes arrived passed
            self._check(read, offset)
        finally:
            self._lock.release()

    def _pause(self, seconds: float) -> None:
        """A confirm's wait for others to share its check: cut short by a reader that waits for bytes under
        way (``awaited``), since the reader would wait for the pause too."""
        self._awaited.wait(seconds)

    def awaited(self) -> None:
        """A reader waits for bytes a fetch brings: the confirms waiting to share a check send it now (a
        stream's reader waits for the next piece; the spacing is for fetches nobody waits for yet)."""
        self._awaited.set()

    def _check_early(self, early: _EarlyCheck, deadline: float) -> None:
        """The early check (see the module docstring), on a thread of its own, at once: nothing else is to be
        answered that could share a later one. Best effort, one attempt outside the origin client's retries
        and outage rule, and without the lock a confirm's check holds: a failure, or an answer slower than
        ``confirm`` waits for, is left to the confirms, which send their own check through the client and
        report it (an early check that ran to the read's deadline would otherwise be the request that finds an
        outage, and the read's own error would say less)."""
        try:
            self._check(ReadContext(deadline, ahead=True), None, early)
        except Exception as exc:  # noqa: BLE001 - said by the confirm that checks again
            if isinstance(exc, Retryable) and exc.throttled:  # (the origin's word on its load, whoever asked)
                self.client.origin_limit().throttled()
            log.debug("%s: version check beside the last bodies: %s", self.source.name, exc)
        finally:
            early.ended.set()
            with self._count:
                self._early = None

    def _check(self, read: ReadContext, offset: int | None, early: _EarlyCheck | None = None) -> None:
        """Send one check: the file's last bytes asked again and compared with the pinned digest (a confirm's
        holds ``_lock``, through the client; an ``early`` one is one attempt). CheckpointError when they
        differ."""
        from ckptfs.sources.identity import sample_digest

        start, end, digest = self.sample
        sent = early.sent if early is not None else time.monotonic()
        self._check_sent = max(self._check_sent, sent)
        self._awaited.clear()  # this check serves the readers waiting now; one waiting later says so again
        check = dataclasses.replace(read, on_answer=None)  # (its own answer is no fetch's)
        if early is not None:
            body = self.source.fetch(start, end, check)
        else:
            body = self.client.retrying(functools.partial(self.source.fetch, start, end), check, offset,
                                        "re-checking the file's last bytes: ")
        data = body if isinstance(body, bytes) else b"".join(body)
        self.source.options.counters.request(self.source.scheme, "ok", len(data))
        if sample_digest(data) != digest:
            self.source.options.counters.request(self.source.scheme, "error")
            raise CheckpointError(self.source.name, offset,
                                  f"changed since it was opened: its last {end - start} bytes differ "
                                  f"(replaced by a file of the same size within the validator's one-second "
                                  f"resolution)")
        with self._count:
            self._check_took = time.monotonic() - sent
            self._checked_at = max(self._checked_at, sent)
