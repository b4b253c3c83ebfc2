"""An origin that does not serve: one deadline for an application's read, not one per kernel request.

The daemon sees kernel requests (handle, offset, size), and one application read is many of them: a buffered
read whose read-ahead request failed is read again page by page (4 KiB requests, each sent once the one
before failed), an O_DIRECT 64 MiB read is 64 requests of 1 MiB on libfuse's threads, an mmap fault the
pages around it. Each with a ``--timeout`` of its own, against a server that answers nothing — or answers
badly: a body trickling a byte a second, headers and then nothing, a 5xx to every request, bodies cut short —
the application's read lasted several. So failures are grouped by what fails, the origin (scheme and host):

- An **outage** of an origin starts when a fetch used its whole ``--timeout`` without getting its bytes,
  whatever happened meanwhile (silence, a trickle, answers that were errors): it starts at the moment that
  fetch arrived. Only a success ends it: a fetch that got all its bytes, or a probe answered in full. A
  failure with time left is retried as before, so a short outage still heals.
- While it lasts, every fetch's deadline is ``min(its own, outage start + --timeout)``: fetches under way
  end by then (at their next wait), new ones fail at once, all with one message per outage (one log line,
  whatever the number of requests).
- About once a second (``PROBE_INTERVAL_S`` after the last probe ended) one fetch is let through as a
  **probe**: ``PROBE_BYTES`` at its offset, which must all arrive within ``PROBE_SECONDS`` (so a trickle does
  not pass for an answer). Fetches that arrive while it is in flight wait for it (no longer than it may
  take): answered, the outage ends and they all go on; not answered, they fail at once, as does every fetch
  until the next probe is due.

So every application read ends within ``--timeout`` + ``PROBE_SECONDS`` of its first request that met the
outage, whatever its size or shape, and meets one full ``--timeout`` per outage; the first read once the
origin serves again is answered (docs/remote.md, "Failures"). Each origin's ``outages`` and
``deadlines_met`` are counted for ``ckptfs stats`` (``ckptfs.ahead.limits``).
"""

from __future__ import annotations

import enum
import threading
import time

from ckptfs.ahead.limits import Origins, OriginTally

#: A probe of an origin in an outage is sent at most this often (seconds after the last one ended).
PROBE_INTERVAL_S = 1.0
#: How long a probe may take, all its bytes in (seconds).
PROBE_SECONDS = 1.0
#: How many bytes a probe asks for: an origin that cannot send this much in ``PROBE_SECONDS`` serves nothing
#: a read could use (64 KiB/s), however alive it looks.
PROBE_BYTES = 64 * 1024


class Admission(enum.Enum):
    """What a fetch may do now (``Outage.admit``)."""

    ASK = "ask"        # no outage in force: ask the origin, within the deadline ``Outage.bound`` gives
    PROBE = "probe"    # the origin is out and a probe is due: this fetch sends it
    WAIT = "wait"      # a probe is in flight: wait for its answer (``Outage.wait_probe``)
    REFUSE = "refuse"  # the origin is out: fail at once


class Outage:
    """One origin's state: since when it is out (None: it is not), what the fetch that found it saw, and the
    probe in flight. ``tally``: the origin's process-wide counters."""

    def __init__(self, probe_interval: float = PROBE_INTERVAL_S, tally: OriginTally | None = None) -> None:
        self.probe_interval = probe_interval
        self.tally = tally if tally is not None else OriginTally()
        self._lock = threading.Lock()
        self.since: float | None = None
        self.found_at = 0.0  # wall-clock seconds the outage was found (its message names it)
        self.reason = ""     # what the fetch that found it saw
        self._probe_end = float("-inf")  # when the last probe ended
        self._probe: threading.Event | None = None  # set when the probe in flight ends

    def succeeded(self) -> None:
        """A fetch got all its bytes (or a probe was answered): any outage ends."""
        if self.since is not None:
            with self._lock:
                self.since = None

    def timed_out(self, arrival: float, timeout: float, reason: str = "") -> bool:
        """A fetch that arrived at ``arrival`` (monotonic seconds) used its whole ``timeout`` without getting its
        bytes (``reason``: what it saw): the origin is out since ``arrival``. True when this call started the
        outage (False: one was in force already)."""
        with self._lock:
            started = self.since is None
            if started:
                self.since, self.found_at, self.reason = arrival, time.time(), reason
            cut = not started and self.since is not None and self.since < arrival  # by the outage, not its own
        if not cut:
            self.tally.deadline_met(arrival, timeout)
        if started:
            self.tally.outage()
        return started

    def bound(self, deadline: float, timeout: float) -> float:
        """A fetch's deadline under the outage rule: its own, or the outage's start + ``timeout`` if sooner."""
        since = self.since
        return deadline if since is None else min(deadline, since + timeout)

    def admit(self, timeout: float) -> Admission:
        """Whether a fetch may ask the origin now (see the module docstring)."""
        since = self.since
        if since is None or time.monotonic() < since + timeout:
            return Admission.ASK
        with self._lock:
            if self.since is None:
                return Admission.ASK
            if self._probe is not None:
                return Admission.WAIT
            if time.monotonic() - self._probe_end < self.probe_interval:
                return Admission.REFUSE
            self._probe = threading.Event()
            return Admission.PROBE

    def wait_probe(self, seconds: float) -> bool:
        """For a fetch that ``admit`` told to wait: wait for the probe in flight, at most ``seconds``; whether
        the outage is over."""
        probe = self._probe
        if probe is not None:
            probe.wait(max(0.0, seconds))
        return self.since is None

    def probed(self, answered: bool) -> None:
        """The probe ``admit`` handed out ended; ``answered``: the origin answered it in full (the outage ends)."""
        if answered:
            self.succeeded()
        with self._lock:
            probe, self._probe = self._probe, None
            self._probe_end = time.monotonic()
        if probe is not None:
            probe.set()


def outage_for(registry: dict[str, Outage], origin: str, origins: Origins) -> Outage:
    """The state of ``origin`` in ``registry`` (one per ``ckptfs.open`` or mount: ``RemoteOptions.outages``),
    shared by every source it serves there; it counts in the origin's tally in ``origins`` (the runtime's)."""
    found = registry.get(origin)
    if found is None:  # two first uses at once: setdefault keeps one (a dict's own operation is atomic)
        found = registry.setdefault(origin, Outage(tally=origins.tally(origin)))
    return found
