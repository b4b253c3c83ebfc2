"""The retrying origin client: one request to a remote source's origin, asked until it is answered within the
read's deadline, and what its failures mean.

A scheme's range client (``ranges.RangeClient``: ``http``, ``s3``) makes one attempt at a time and says how it
failed: a :class:`Retryable` (connection errors, stalls, 5xx, 429, short bodies: another attempt may succeed), a
:class:`Changed` (the medium answered with another identity than the one fixed at open) or a final
``CheckpointError`` (404, 403). :class:`OriginClient` turns attempts into an answer:

- Retryable failures are retried with exponential backoff and full jitter (capped at ``BACKOFF_CAP``),
  honouring a server's ``Retry-After``, for as long as the read's deadline allows: a 3 s outage inside a
  30 s ``--timeout`` costs 3 s, not the read. With a mirror to turn to (``ReadContext.fallback``) a failure
  is retried once and a stall not at all, so the next copy gets the rest of the deadline (``max_retries``
  bounds the count too where a caller sets it). Everything else ends the read at once.
- An origin from which a request got nothing usable for a whole ``--timeout`` (silence, a trickle, errors
  answered) is in an outage (``outage``): until a request to it succeeds again, every request to it ends by
  the outage's start + ``--timeout`` and new ones fail at once, with one message, but for a probe about
  once a second (the requests that arrive meanwhile wait for its answer); so an application's read, however
  many kernel requests it is, ends within ``--timeout`` (and a second) of its first request that met the
  outage, and the first read once the origin serves again is answered.
- Timeouts are reported as what they are: a wait cut short by the read's deadline says ``--timeout`` and
  its number; a server silent for ``--stall-timeout`` seconds, with time left, is a stall (and retried).
- Two answers are asked again at once, not retried: an odd answer (``odd.OddAnswer``: one that cannot be
  the bytes asked for) on a connection of its own (``ReadContext.fresh``), decided by the second answer
  (``asked_again``); and a refusal at the location the URL last redirected to (:class:`Relocated`: an
  expired signed CDN URL), at the URL itself, once.

The rule lives in :class:`Attempts`, the state of one request's attempts; the loops that drive it
(``OriginClient.fetch`` for bytes, ``OriginClient.retrying`` for any other request) call the range client
themselves, so a read's walk down the chain is one frame per part.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TypeVar

from ckptfs.core.errors import CheckpointError, SourceUnavailable
from ckptfs.ahead.limits import ORIGINS, OriginLimit
from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.odd import OddAnswer
from ckptfs.sources.remote.options import RemoteOptions
from ckptfs.sources.remote.outage import PROBE_BYTES, PROBE_SECONDS, Admission, Outage, outage_for
from ckptfs.sources.remote.ranges import RangeClient
from ckptfs.util.redact import public_name

log = logging.getLogger(__name__)

BACKOFF_BASE = 0.1
BACKOFF_CAP = 2.0
#: A retry is not started with less than this left of the deadline (it could not get an answer).
MIN_ATTEMPT_SECONDS = 0.05

T = TypeVar("T")


class Retryable(Exception):
    """One attempt failed in a way another attempt may not (``retry_after``: the server's wish, seconds;
    ``timeout``: a wait ran out; ``deadline``: the wait that ran out was cut short by the read's deadline,
    ``--timeout``, not by ``--stall-timeout``)."""

    def __init__(self, message: str, retry_after: float | None = None, timeout: bool = False,
                 deadline: bool = False, throttled: bool = False):
        super().__init__(message)
        self.retry_after = retry_after
        self.timeout = timeout or deadline
        self.deadline = deadline
        self.throttled = throttled  # the origin asks for fewer requests (429, 503, SlowDown): see limit.py


class TimedOut(SourceUnavailable):
    """A read's deadline (``--timeout``) ran out before the origin answered."""


class Changed(Exception):
    """The medium answered with another identity than the one fixed at open."""


class Relocated(Exception):
    """An attempt sent to the location the URL last redirected to was refused there (``cause``: an expired
    signed CDN URL answers 403 or 404): the range client has gone back to the URL itself, and the request
    is asked again at once, which resolves the redirect anew."""

    def __init__(self, cause: CheckpointError):
        super().__init__(str(cause))
        self.cause = cause


#: What an attempt may fail with that the retry rule decides on (``Attempts.failed``); anything else ends the
#: request as it is.
DECIDED = (Retryable, OddAnswer, Relocated, Changed)


def asked_again(first: OddAnswer, second: OddAnswer) -> Exception:
    """What two odd answers to one request mean: the second's error when it is wrong the same way as the
    first (the file was replaced, the server cannot serve ranges), else a Retryable."""
    if second.signature == first.signature:
        return second.final
    return Retryable(f"two different wrong answers: {first}; then {second}")


def wait_bound(options: RemoteOptions, deadline: float) -> tuple[float, bool]:
    """How long one socket wait may last (the stall timeout, or less when the deadline is nearer), and whether
    the deadline is what bounds it (then a timeout is the read's ``--timeout``, not a stall)."""
    remaining = deadline - time.monotonic()
    return (remaining, True) if remaining < options.stall_timeout else (options.stall_timeout, False)


def stalled(what: str, options: RemoteOptions, detail: str = "") -> Retryable:
    """The Retryable for a server silent for the whole stall timeout (a wait the deadline did not cut short,
    see ``wait_bound``)."""
    return Retryable(f"{what} (no data for {options.stall_timeout:g} s, --stall-timeout){detail}", timeout=True)


def backoff_delay(attempt: int) -> float:
    """Exponential backoff with full jitter (attempt 1, 2, ...)."""
    return random.uniform(0.5, 1.0) * min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** (attempt - 1))


class OriginClient:
    """Requests to one file's origin through its range client (``ranges.RangeClient``, the one part below),
    retried within the read's deadline (see the module docstring)."""

    def __init__(self, range_client: RangeClient):
        self.range = range_client
        self._limit: OriginLimit | None = None
        self._outage: Outage | None = None

    def origin_limit(self) -> OriginLimit:
        """The in-flight limit learnt for this origin (``ckptfs.ahead.limits``: one per scheme and host)."""
        limit = self._limit
        if limit is None:
            limit = self._limit = self.range.options.runtime.get(ORIGINS).limit(self.range.origin())
        return limit

    def outage(self) -> Outage:
        """This origin's outage state (``outage``: shared by every source of the origin in one open)."""
        outage = self._outage
        if outage is None:
            options = self.range.options
            outage = self._outage = outage_for(options.outages, self.range.origin(), options.runtime.get(ORIGINS))
        return outage

    def moved(self) -> None:
        """The source's origin changed (a redirect to a CDN host): its own limit and outage state from now."""
        self._limit = self._outage = None

    def fetch(self, start: int, end: int, read: ReadContext) -> list[bytes] | list[memoryview]:
        """Bytes [start, end) as the range client read them (consecutive parts), asked under the retry rule
        (``Attempts``); counted, heard by the outage state and timed for the in-flight limit.
        ``read.answered_at`` is the successful attempt's. A short answer is never served (a range client must
        check; this is the last line)."""
        sent = time.monotonic()
        self._admit(start)
        attempts = Attempts(self, read, start)
        while True:
            one = attempts.next()
            try:
                body = self.range.fetch(start, end, one)
                break
            except DECIDED as exc:
                attempts.failed(exc)
        read.answered_at = one.answered_at
        read.body_in()
        parts = body if isinstance(body, list) else [body]
        got = sum(len(p) for p in parts)
        done = time.monotonic()
        self.outage().succeeded()
        self.origin_limit().finished(got, done - sent)
        if got != end - start:
            raise CheckpointError(self.range.name, start, f"got {got} bytes for a {end - start}-byte range")
        self.range.options.counters.request(self.range.scheme, "ok", got)
        return parts

    def retrying(self, attempt: Callable[[ReadContext], T], read: ReadContext, offset: int | None,
                 what: str = "") -> T:
        """``attempt(context)`` under the retry rule (``Attempts``) until it succeeds or the rule gives up. A
        request that finds the origin in an outage fails at once, or sends the probe that is due, or waits
        for the one in flight (``_admit``). ``what`` prefixes the final error's reason."""
        self._admit(offset, what)
        attempts = Attempts(self, read, offset, what)
        while True:
            one = attempts.next()
            try:
                result = attempt(one)
                read.answered_at = one.answered_at
                return result
            except DECIDED as exc:
                attempts.failed(exc)

    def ran_out(self, read: ReadContext, reason: str, what: str = "") -> SourceUnavailable:
        """A request (or a reader waiting for another's fetch of its bytes) reached its deadline without its
        bytes (``reason``: what it saw): the origin is out since the read arrived, unless an outage is in
        force already; the outage's one message (``outage_error``)."""
        timeout = self.range.options.timeout
        self.outage().timed_out(read.deadline - timeout, timeout, reason)
        return self.outage_error(what)

    def _admit(self, offset: int | None, what: str = "") -> None:
        """Before a request asks the origin: nothing to do unless the origin is in an outage (``outage``); then
        this request sends the probe that is due (``PROBE_BYTES`` at ``offset``, all in within
        ``PROBE_SECONDS``) and goes on if it was answered, or waits for the probe in flight and goes on if that
        was answered, or fails at once."""
        offset = offset or 0
        outage, source = self.outage(), self.range
        admission = outage.admit(source.options.timeout)
        if admission is Admission.ASK:
            return
        if admission is Admission.WAIT and outage.wait_probe(PROBE_SECONDS):
            return
        if admission is Admission.PROBE:
            answered = True  # an answer that is not the bytes (404, another version) is the fetch's to judge
            end = min(offset + PROBE_BYTES, source.size) if source.size > offset else offset + 1
            try:
                source.fetch(offset, end, ReadContext(time.monotonic() + PROBE_SECONDS))
            except Retryable:  # no answer, or not all of it in time (a trickle, a stall, a 5xx, a short body)
                answered = False
            except Exception:  # noqa: BLE001 - see above
                pass
            finally:
                outage.probed(answered)
            if answered:
                source.options.counters.request(source.scheme, "ok")
                return
        source.options.counters.request(source.scheme, "timeout")
        raise self.outage_error(what)

    def outage_error(self, what: str = "") -> SourceUnavailable:
        """How a request fails while its origin is in an outage: one message for all of the outage (one log
        line per file), naming when it was found and what the request that found it saw (``what``: the
        caller's prefix, as for the retry loop's errors)."""
        outage, timeout = self.outage(), self.range.options.timeout
        found = datetime.fromtimestamp(outage.found_at, timezone.utc).strftime("%H:%M:%S.%f")[:-3]
        saw = f"{outage.reason}; " if outage.reason else ""
        return SourceUnavailable(self.range.name, None,
                                 f"{what}{saw}{public_name(self.range.origin())} is not answering (nothing usable "
                                 f"came from it for --timeout {timeout:g} s, since {found} UTC): its reads fail at "
                                 f"once until it answers again")

    def timeout_error(self, offset: int | None, what: str = "", tries: int = 0, last: Retryable | None = None,
                      before: Retryable | None = None) -> TimedOut:
        """The read's deadline (``--timeout``) passed: say so, with the number, and what the last attempt
        was doing (counted here unless ``last`` was counted by the retry loop)."""
        if last is None:
            self.range.options.counters.request(self.range.scheme, "timeout")
        detail = f" after {tries} attempt{'s' if tries > 1 else ''}" if tries else ""
        if last is not None:
            detail += f"; the last {last}"
        if before is not None and not before.deadline:
            detail += f"; the one before: {before}"
        return TimedOut(self.range.name, offset, f"{what}read timed out (--timeout {self.range.options.timeout:g} s"
                                                  f"{detail})")


class Attempts:
    """The retry rule of one request (see the module docstring) as the state of its loop: ``next()`` is the
    next attempt's context, ``failed(exc)`` decides after an attempt failed with one of ``DECIDED``: it
    returns when another attempt is due (having waited the backoff, if any) and raises what the request ends
    with otherwise. Each attempt is bounded by the read's deadline or, while the origin is in an outage, the
    outage's end of patience; a deadline that runs out starts an outage (``OriginClient.ran_out``)."""

    def __init__(self, client: OriginClient, read: ReadContext, offset: int | None, what: str = ""):
        self.client, self.read, self.offset, self.what = client, read, offset, what
        self.outage = client.outage()
        self.options = client.range.options
        self.tries = 0
        self.started = time.monotonic()
        self.before: Retryable | None = None  # the failure before the last, for the final message
        self.odd: OddAnswer | None = None     # a first odd answer, asked again on a fresh connection
        self.relocated = False
        self.bound = read.deadline
        max_retries = self.options.max_retries
        if read.fallback:
            max_retries = 1 if max_retries is None else min(1, max_retries)
        if read.once:  # a stored copy waits behind this request (``RemoteOptions.open_once``)
            max_retries = 0
        self.max_retries = max_retries

    def next(self) -> ReadContext:
        """The next attempt's context: on a connection of its own after an odd answer."""
        timeout = self.options.timeout
        self.bound = self.outage.bound(self.read.deadline, timeout)
        if time.monotonic() >= self.bound:
            raise self._ran_out(self.client.timeout_error(self.offset, self.what, self.tries))
        one = self.read.bounded(self.bound, lambda deadline: self.outage.bound(deadline, timeout))
        return dataclasses.replace(one, fresh=True) if self.odd is not None else one

    def failed(self, exc: Exception) -> None:
        """After an attempt failed with ``exc`` (one of ``DECIDED``): return to ask again, or raise."""
        source = self.client.range
        if isinstance(exc, OddAnswer):
            if self.odd is None:  # asked again at once, on a fresh connection
                self.odd = exc
                return
            first, self.odd = self.odd, None
            exc = asked_again(first, exc)
            if not isinstance(exc, (Retryable, Changed)):
                raise exc
        if isinstance(exc, Relocated):  # asked again at once at the URL itself, once
            if self.relocated:
                raise exc.cause
            self.relocated, self.odd = True, None
            return
        if isinstance(exc, Changed):
            source.options.counters.request(source.scheme, "error")
            raise CheckpointError(source.name, self.offset, f"changed since it was opened: {exc}") from None
        assert isinstance(exc, Retryable)
        self.odd = None
        self.tries += 1
        if exc.throttled:
            self.client.origin_limit().throttled()
        left = self.bound - time.monotonic()
        if exc.retry_after is not None:
            delay, too_late = exc.retry_after, exc.retry_after >= left  # not before the server's time
        else:
            delay = min(backoff_delay(self.tries), max(0.0, left - MIN_ATTEMPT_SECONDS))
            too_late = left <= MIN_ATTEMPT_SECONDS
        give_up = (exc.deadline or too_late or (self.max_retries is not None and self.tries > self.max_retries)
                   or (self.read.fallback and exc.timeout))
        source.options.counters.request(source.scheme, "timeout" if exc.timeout else ("error" if give_up else "retry"),
                                        retried=not give_up)
        if give_up:
            raise self._given_up(exc, too_late) from None
        log.debug("%s @ %s: %s; retrying in %.2f s", source.name, self.offset, exc, delay)
        self.before = exc
        time.sleep(delay)

    def _given_up(self, exc: Retryable, too_late: bool) -> SourceUnavailable:
        """The error of a request given up after ``tries`` attempts, the last failing with ``exc``;
        ``too_late``: no time was left in the deadline for another."""
        what, tries, timeout = self.what, self.tries, self.options.timeout
        count = f"{tries} attempt{'s' if tries > 1 else ''}"
        if exc.deadline:  # the last attempt itself was cut short by the deadline
            return self._ran_out(self.client.timeout_error(self.offset, what, tries, exc, self.before))
        spent = time.monotonic() - self.started
        if too_late and exc.retry_after is not None:  # no use waiting for the server's time
            why = (f"; the server asks to retry in {exc.retry_after:g} s, past the read's deadline "
                   f"(--timeout {timeout:g} s)")
        elif too_late:
            why = f" ({count} in {spent:.1f} s, until the read's deadline: --timeout {timeout:g} s)"
            return self._ran_out(TimedOut(self.client.range.name, self.offset, f"{what}{exc}{why}"))
        else:
            why = f" (gave up after {count} in {spent:.1f} s)"
        return SourceUnavailable(self.client.range.name, self.offset, f"{what}{exc}{why}")

    def _ran_out(self, exc: TimedOut) -> SourceUnavailable:
        """The read's deadline ran out: the outage rule's error (``OriginClient.ran_out``)."""
        return self.client.ran_out(self.read, exc.reason.removeprefix(self.what), self.what)
