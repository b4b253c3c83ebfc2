"""What a runtime keeps per origin: how many requests it gets in flight at once (found by measuring, not
assumed), and what it cost its readers.

Object stores and CDNs cap what one connection carries (a few tens of MB/s a request is common), so a cold
stream is as fast as the number of ranges in flight: four requests behind a 20 MB/s-per-request origin make
80 MB/s however fast the link is. How many help depends on the origin (its per-request cap, its latency, its
throttling) and cannot be known in advance, so each origin gets an :class:`OriginLimit` that climbs like a
parallel downloader tuned by hand would: start where downloaders do (hf_transfer keeps 20-25 ranges in flight
with the Hub's settings), **grow while throughput grows** (each step is kept
only when an epoch at the new limit moved at least ``GAIN`` more bytes a second than the one before it),
**step back when it stops paying** (a larger limit that moved no more bytes, or whose requests took much
longer each, costs connections and memory for nothing), and **halve at once on a throttle** (HTTP 429/503,
S3's SlowDown), staying there for a while. An epoch is judged only when readers wanted more than the limit
(``saturated``): a reader slower than the link says nothing about the origin. A plateau is probed again
every ``REPROBE_EPOCHS`` epochs, since origins change.

The limit gates read-ahead only (``ckptfs.ahead.fetch`` asks ``try_start`` before each piece);
a reader's own request is never held back, but every request, read-ahead or not, is measured (``finished``).

A runtime keeps one :class:`Origin` per origin, in one registry (:class:`Origins`, the part ``ORIGINS`` of
``ckptfs.core.runtime``): its limit, and what the origin cost its readers (:class:`OriginTally`: its outages
and the full deadlines they met, counted by ``ckptfs.sources.remote.outage``). ``Origins.stats`` shows both, under ``source.origins`` in ``ckptfs stats``
and as the ``ckptfs_source_*`` per-origin families of ``--metrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
import math
import os
import threading
import time

from ckptfs.core.runtime import Part
from ckptfs.util.keyed import MadeOnce
from ckptfs.workers.scheduler import ORIGIN_CEILING

#: Requests in flight per origin: where a new origin starts, and the bounds of the climb.
INITIAL = 32
FLOOR = 1
CEILING = ORIGIN_CEILING  # the fetch pool is sized by it (ckptfs.workers.scheduler)
#: Growth factor per step, and the gain in throughput a step must show to be kept.
STEP = 2.0
GAIN = 1.10
#: An epoch: at least this long, and at least ``limit`` requests finished (one round of the window).
EPOCH_SECONDS = 0.1
#: A request this many times slower per byte than the fastest seen, in an epoch that gained nothing, is a
#: queue building up at the origin: step down.
LATENCY_CLIMB = 3.0
#: Epochs without growth after a throttle or a plateau before growth is tried again.
REPROBE_EPOCHS = 8
#: A request this long is timed for ``OriginLimit.reach``: long enough to show what the origin gives one request,
#: past what its buffers and the kernel's let out at once (a capped server sends its first few MB unpaced).
TIMED_BYTES = 4 << 20
#: The fastest one reader takes in a stream (bytes a second: a FUSE reader of a page-cache file on a fast
#: machine): what the bytes kept ahead of it are sized for (``OriginLimit.reach``).
READER_RATE = 4e9
#: A stream keeps at least this many pieces ahead of its reader, however fast the origin answers one: a few
#: requests at once keep both ends of a fast link busy while one piece's body is handed over.
MIN_PIECES_AHEAD = 4


class OriginLimit:
    """The adaptive in-flight limit of one origin (see the module docstring). Thread-safe."""

    def __init__(self, initial: int = INITIAL, floor: int = FLOOR, ceiling: int = CEILING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.floor, self.ceiling = floor, ceiling
        self.limit = max(floor, min(ceiling, initial))
        self._clock = clock
        self._lock = threading.Lock()
        self.in_flight = 0
        self._epoch_start = clock()
        self._epoch_bytes = 0
        self._epoch_done = 0
        self._epoch_seconds_per_byte: list[float] = []
        self._saturated = False
        self._previous: tuple[int, float] | None = None  # (limit, bytes/s) of the last judged epoch
        self._fastest_per_byte = math.inf
        self._fastest_piece_per_byte = math.inf  # of requests of TIMED_BYTES or more (``reach``)
        self._hold = 0  # epochs left without growth
        self.throttles = 0
        self.peak = self.limit

    # -- read-ahead asks -------------------------------------------------------------------------------
    def try_start(self) -> bool:
        """Take a slot for one read-ahead request; False (and the epoch marked as wanting more) when the
        limit is reached."""
        with self._lock:
            if self.in_flight >= self.limit:
                self._saturated = True
                return False
            self.in_flight += 1
            return True

    def done(self) -> None:
        """Give back a slot taken by ``try_start``."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)

    def reach(self, piece: int, budget: int) -> int:
        """The bytes worth keeping ahead of one reader of this origin, in pieces of ``piece`` bytes (Little's
        law): what ``READER_RATE`` takes in while one piece comes at the best speed a request of ``TIMED_BYTES``
        or more has had, between ``MIN_PIECES_AHEAD`` pieces and ``budget`` (the budget until such a request
        has been timed).

        Behind a capped or distant origin a piece takes long and this is the budget: many requests at once
        are what makes it fast. From a fast one (a LAN or loopback server: a piece in a few milliseconds)
        more bytes ahead only cost. Their pieces share the link, so the reader's next piece lands only about
        when all of them do, and each is fresh memory where a stream's few pieces reuse what its reader has
        read past (``ckptfs.ahead.fetch``)."""
        with self._lock:
            per_byte = self._fastest_piece_per_byte
        if per_byte == math.inf:
            return budget
        return int(max(MIN_PIECES_AHEAD * piece, min(budget, READER_RATE * piece * per_byte)))

    def held(self, then: Callable[[], None] | None = None) -> HeldSlot:
        """The slot just taken by ``try_start``, to be given back once (see :class:`HeldSlot`)."""
        return HeldSlot(self, then)

    # -- every request reports -------------------------------------------------------------------------
    def finished(self, nbytes: int, seconds: float) -> None:
        """One request to the origin brought ``nbytes`` in ``seconds``."""
        with self._lock:
            self._epoch_bytes += nbytes
            self._epoch_done += 1
            if nbytes > 0:
                per_byte = max(seconds, 1e-6) / nbytes
                self._epoch_seconds_per_byte.append(per_byte)
                self._fastest_per_byte = min(self._fastest_per_byte, per_byte)
                if nbytes >= TIMED_BYTES:
                    self._fastest_piece_per_byte = min(self._fastest_piece_per_byte, per_byte)
            now = self._clock()
            if now - self._epoch_start >= EPOCH_SECONDS and self._epoch_done >= self.limit:
                self._judge(now)

    def throttled(self) -> None:
        """The origin asked us to slow down (429, 503, SlowDown): halve now, and hold."""
        with self._lock:
            self.throttles += 1
            self.limit = max(self.floor, self.limit // 2)
            self._hold = REPROBE_EPOCHS
            self._previous = None
            self._start_epoch(self._clock())

    def _judge(self, now: float) -> None:
        rate = self._epoch_bytes / max(now - self._epoch_start, 1e-6)
        latencies = sorted(self._epoch_seconds_per_byte)
        median = latencies[len(latencies) // 2] if latencies else 0.0
        saturated = self._saturated
        self._start_epoch(now)
        if not saturated:
            return  # the readers, not the origin, set this epoch's pace
        previous = self._previous
        if previous is not None and previous[0] < self.limit and rate < previous[1] * GAIN:
            # the last step up did not pay: go back to where the same bytes came with fewer requests
            self.limit = previous[0]
            self._hold = REPROBE_EPOCHS
            self._previous = (self.limit, max(rate, previous[1]))
            return
        if previous is not None and rate < previous[1] and median > LATENCY_CLIMB * self._fastest_per_byte:
            self.limit = max(self.floor, int(self.limit * 0.75))
            self._previous = (self.limit, rate)
            return
        self._previous = (self.limit, rate)
        if self._hold > 0:
            self._hold -= 1
            return
        grown = min(self.ceiling, max(self.limit + 1, math.ceil(self.limit * STEP)))
        if grown != self.limit:
            self.limit = grown
            self.peak = max(self.peak, grown)

    def _start_epoch(self, now: float) -> None:
        self._epoch_start = now
        self._epoch_bytes = 0
        self._epoch_done = 0
        self._epoch_seconds_per_byte = []
        self._saturated = False

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"limit": self.limit, "in_flight": self.in_flight, "peak": self.peak,
                    "throttles": self.throttles}


class OriginTally:
    """What one origin cost its readers in this process. Thread-safe.

    An **outage** (``ckptfs.sources.remote.outage``) starts when a fetch used its whole ``--timeout`` without
    getting its bytes; while it lasts, fetches end by its start + ``--timeout`` or fail at once.
    ``deadlines_met`` counts the times readers waited a whole ``--timeout`` for the origin: fetches that ran
    out side by side (the kernel's parallel requests of one read, arrived before the first of them ran out) are
    one wait, as the application sees it. With the rule holding, an origin that stays down costs one deadline
    per outage (``deadlines_met`` == ``outages``); more means reads met a deadline each."""

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


#: ``CKPTFS_REMOTE_IN_FLIGHT=N`` pins every origin's limit at N requests in flight instead of learning it (as
#: a downloader's ``-x N`` does: for an origin whose best is known, and for measuring). A pinned limit does not
#: halve on throttles; the retry loop still backs off each throttled request.
PIN_ENV = "CKPTFS_REMOTE_IN_FLIGHT"


def _new_limit() -> OriginLimit:
    pinned = os.environ.get(PIN_ENV, "").strip()
    if pinned.isdigit() and int(pinned) > 0:
        n = min(int(pinned), CEILING)
        return OriginLimit(initial=n, floor=n, ceiling=n)
    return OriginLimit()


class Origin:
    """Everything the process keeps about one origin (a scheme and host: every source and every open of it
    share it): its in-flight limit and its tally."""

    def __init__(self) -> None:
        self.limit = _new_limit()
        self.tally = OriginTally()

    def stats(self) -> dict[str, Any]:
        return {**self.limit.stats(), **self.tally.stats()}

    def forget_in_child(self) -> None:
        """A forked child's requests are its own (what the parent had in flight is not); it counts on from the
        parent's figures. Fresh locks: a parent's thread may have held one at the fork."""
        self.limit._lock = threading.Lock()
        self.limit.in_flight = 0
        self.tally._lock = threading.Lock()


class Origins:
    """A runtime's :class:`Origin` of each origin it reads from, made on first use."""

    def __init__(self) -> None:
        self._origins: MadeOnce[str, Origin] = MadeOnce()

    def state(self, origin: str) -> Origin:
        return self._origins.get(origin, Origin)

    def limit(self, origin: str) -> OriginLimit:
        """The limit of ``origin`` (every source on it shares what it learns)."""
        return self.state(origin).limit

    def tally(self, origin: str) -> OriginTally:
        """The counters of ``origin`` (every open of it adds to the same)."""
        return self.state(origin).tally

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each origin's learnt limit and what it cost its readers (its outages and deadlines met)."""
        return {origin: state.stats() for origin, state in self._origins.items()}

    def in_child(self) -> Origins:
        """In a forked child: the same origins, each forgetting the parent's requests in flight."""
        self._origins.in_child()
        for _, state in self._origins.items():
            state.forget_in_child()
        return self


#: A runtime's origins (``RemoteOptions.runtime``: what every source of the same origin learns and counts).
ORIGINS = Part("per-origin limits", Origins, Origins.in_child)


class HeldSlot:
    """A slot of an :class:`OriginLimit` held by one fetch ahead, given back exactly once: when the answer's
    body is in (``ReadContext.body_in``: the origin no longer works for it, though the fetch may still wait
    for a version check before its bytes are served) or when the fetch ends, whichever comes first. Giving it
    back at the body keeps the origin busy: a version check's wait (tens of ms behind a distant origin) would
    otherwise hold every landed piece's slot and stall the next round of pieces. ``then`` runs after it is
    given back (a read-ahead starts its next piece). A piece of several runs (chunks already held between
    them) gives it back at its first body: its other requests go out beside the limit."""

    def __init__(self, limit: OriginLimit, then: Callable[[], None] | None = None) -> None:
        self._limit, self._then = limit, then
        self._lock = threading.Lock()
        self._held = True

    def release(self) -> None:
        with self._lock:
            if not self._held:
                return
            self._held = False
        self._limit.done()
        if self._then is not None:
            self._then()

