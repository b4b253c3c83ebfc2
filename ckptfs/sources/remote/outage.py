"""An origin that stopped answering: one deadline for an application's read, not one per kernel request.

The daemon sees kernel requests (handle, offset, size), and one application read is many of them: a buffered
read whose read-ahead request failed is read again page by page (4 KiB requests, each sent once the one
before failed), an O_DIRECT 64 MiB read is 64 requests of 1 MiB on libfuse's threads, an mmap fault the
pages around it. Each with a ``--timeout`` of its own, against a server that answers nothing, the
application's read lasted several. So failures are grouped by what fails, the origin (scheme and host):

- An **outage** of an origin starts when a fetch's whole ``--timeout`` ran out: at the moment that fetch
  arrived, or at the last moment anything came from the origin if that was later (an origin that is slow but
  answering is not out: its next byte ends the outage at once). A stall with time left is retried as before,
  so a short outage still heals.
- Until anything arrives from that origin again, every fetch's deadline is ``min(its own, outage start +
  --timeout)``: fetches under way end by then (at their next wait), new ones fail at once; all but the fetch
  that found the outage fail with one message per origin (one log line per file, not one per request).
- About once a second (``PROBE_INTERVAL_S``) one fetch is let through as a **probe**: a one-byte range
  allowed ``PROBE_SECONDS``. An answer ends the outage and that fetch goes on as usual; no answer, and it
  fails at once like the others.

So every application read ends within ``--timeout`` + ``PROBE_SECONDS`` of its first request that met the
outage, whatever its size or shape (docs/remote.md, "Failures").
"""

from __future__ import annotations

import enum
import threading
import time

#: A probe of an origin in an outage is sent at most this often (seconds).
PROBE_INTERVAL_S = 1.0
#: How long a probe waits for its answer (seconds).
PROBE_SECONDS = 1.0


class Admission(enum.Enum):
    """What a fetch may do now (``Outage.admit``)."""

    ASK = "ask"        # no outage in force: ask the origin, within the deadline ``Outage.bound`` gives
    PROBE = "probe"    # the origin is out and a probe is due: this fetch sends it
    REFUSE = "refuse"  # the origin is out: fail at once


class Outage:
    """One origin's state: when anything last came from it, and since when it is out (None: it is not)."""

    def __init__(self, probe_interval: float = PROBE_INTERVAL_S) -> None:
        self.probe_interval = probe_interval
        self._lock = threading.Lock()
        self.heard_at = time.monotonic()
        self.since: float | None = None
        self._probe_at = float("-inf")
        self._probing = False

    def heard(self) -> None:
        """Something came from the origin (an answer's status, body bytes): any outage ends."""
        self.heard_at = time.monotonic()
        if self.since is not None:
            with self._lock:
                self.since = None

    def timed_out(self, arrival: float) -> bool:
        """A fetch that arrived at ``arrival`` (monotonic seconds) spent its whole ``--timeout``: the origin is
        out since then, or since it last sent anything if that was later. True when this call started the
        outage (False: one was in force already)."""
        with self._lock:
            if self.since is not None:
                return False
            self.since = max(arrival, self.heard_at)
            return True

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
            now = time.monotonic()
            if self.since is None:
                return Admission.ASK
            if self._probing or now - self._probe_at < self.probe_interval:
                return Admission.REFUSE
            self._probing, self._probe_at = True, now
            return Admission.PROBE

    def probed(self, answered: bool) -> None:
        """The probe ``admit`` handed out ended; ``answered``: the origin answered it (the outage ends)."""
        with self._lock:
            self._probing = False
        if answered:
            self.heard()


_registry_lock = threading.Lock()


def outage_for(registry: dict[str, Outage], origin: str) -> Outage:
    """The state of ``origin`` in ``registry`` (one per ``ckptfs.open`` or mount: ``RemoteOptions.outages``),
    shared by every source it serves there."""
    found = registry.get(origin)
    if found is None:
        with _registry_lock:
            found = registry.setdefault(origin, Outage())
    return found
