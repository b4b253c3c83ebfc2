"""The hand-off to the scheduler: a reader's long run of missing chunks is fetched as parallel pieces.

A read of a long missing run (a loader's 64 MiB direct-I/O read, a whole tensor's bytes through the
library) would be one request after another on the reader's thread. An object store or CDN caps what one
request carries, so all pieces but each run's first go to the process's read-ahead scheduler (its
``fetch`` workers) at once, under the read-ahead budget, and the reader fetches the first itself: one read
is as many requests in parallel as a read-ahead would make. The reader then waits for the handed pieces as
for any other fetch under way (their flights), and fetches a piece itself if its worker failed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from ckptfs.sources.remote.store.chunks import CHUNK
from ckptfs.workers.scheduler import Scheduler
from ckptfs.ahead.fetch import FETCH_BUDGET
from ckptfs.util.redact import public_name

log = logging.getLogger(__name__)


def hand_out(name: str, runs: list[tuple[int, int]], step: int, fetch: Callable[[int, int], object],
             workers: Scheduler) -> tuple[list[tuple[int, int]], list[int]]:
    """Cut ``runs`` (of chunks) into pieces of ``step`` chunks and submit all but each run's first as
    ``fetch(c0, c1)`` on the fetch pool of ``workers``. Returns (the pieces the caller fetches itself: each
    run's first and any the scheduler refused, the chunks handed out: the caller waits for them)."""
    mine: list[tuple[int, int]] = []
    handed: list[int] = []
    for start, stop in runs:
        mine.append((start, min(stop, start + step)))
        for first in range(start + step, stop, step):
            last = min(stop, first + step)
            job = functools.partial(_fetch_handed, name, fetch, first, last)
            if workers.submit("fetch", job, (last - first) * CHUNK, cap=FETCH_BUDGET) is None:
                mine.append((first, last))
            else:
                handed.extend(range(first, last))
    return mine, handed


def _fetch_handed(name: str, fetch: Callable[[int, int], object], c0: int, c1: int) -> None:
    try:
        fetch(c0, c1)
    except Exception as exc:  # noqa: BLE001 - the reader waiting for these chunks fetches them itself
        log.debug("fetch of %s chunks %d..%d failed: %s", public_name(name), c0, c1, exc)
