"""The process's worker pools: one byte budget over everything in flight, a worker pool per kind of work.

Work ahead of readers is of two kinds: *decode* (block groups decoded into the cache before a reader of the
``.npy`` asks: the C kernels release the GIL, so it overlaps the FUSE thread's copying) and *fetch* (remote
chunks on their way before a reader asks: waiting on the network). Each kind has its own pool, because a
decode job may read bytes that a queued fetch job is bringing: in one pool, decode jobs could occupy every
worker waiting for fetches queued behind them. The pools' sizes (``concurrency``) are parameters: the
throughput work tunes them. Everything in flight counts against one budget of bytes (``budget``: the data
fetched or decoded ahead and not yet consumed), and a caller may cap its own share further (the mount's
decode-ahead never takes more than a quarter of its cache).

A third kind, *read*, is work a caller waits on rather than work ahead of readers: the torch loader's next
pieces of stored bytes (read while the device decodes the current one) and the manifest's files hashed at
once. It has a pool of its own because such a job is a reader: its ``pread`` of a remote file may hand
pieces to the fetch pool and wait for them, and it may wait for its own hashing on the decode pool, so on
either of those pools it could hold every worker waiting for jobs queued behind it. ``call`` runs such a
job and hands its result or its exception back (a read-ahead job's failure is only logged: the read itself
reports it); hashing, like decoding, is CPU work on stored bytes and runs on the decode pool, in order where
its bytes must be fed in order (:class:`Ordered`).

A job may name a continuation (``then``): it runs on the same worker once the job's bytes are released, so
a pipeline that starts its next piece when one lands (remote read-ahead's ``pump``, a warm-up's refill)
finds the room the landed piece held. Started from inside the job instead, the next piece would find the
budget still full of the piece that just finished, and started from another thread, it would wait for that
thread to be woken (measured on a 2-core machine: a warm-up's dispatching thread kept 5 to 15 requests in
flight under a limit of 32).

Threads start on first use only, never while a checkpoint is opened (a mount forks its daemon after the
open), and a forked child starts with fresh pools: threads do not survive ``fork``.
"""

from __future__ import annotations

from typing import Any, TypeVar
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ckptfs.core.runtime import Part
from ckptfs.util.procinfo import cores

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Bytes fetched or decoded ahead, in flight at once over the whole process (remote read-ahead takes at most
#: 128 MiB of it: ``ckptfs.ahead.fetch.FETCH_BUDGET``).
DEFAULT_BUDGET = 192 << 20
#: The most requests one origin may have in flight (``ckptfs.ahead.limits.CEILING``, the bound of its learnt
#: limit): the fetch pool is sized by it, so a pool too small is never what holds an origin's limit back.
ORIGIN_CEILING = 64
#: Workers per kind of work. Fetch workers wait on the network: as many as the most requests in flight that
#: origins are allowed (``ORIGIN_CEILING``) plus readers' own pieces, started as needed; how
#: many run at once is each origin's adaptive limit, not this. Decode: one per core (a FUSE read that misses
#: decodes its groups on the calling thread and the idle decode workers at once, ``ckptfs.engine.parallel``).
#: Read: readers a caller waits on (a few pieces ahead of a torch load, a manifest's files at once).
DEFAULT_CONCURRENCY = {"fetch": ORIGIN_CEILING + 32, "decode": cores(), "read": max(4, cores())}


class Scheduler:
    """See the module docstring. ``submit`` never blocks: work over budget is refused, to be asked again by a
    later read."""

    def __init__(self, budget: int = DEFAULT_BUDGET, concurrency: dict[str, int] | None = None) -> None:
        self.budget = budget
        self.concurrency = dict(DEFAULT_CONCURRENCY if concurrency is None else concurrency)
        self._lock = threading.Lock()
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._in_flight: dict[str, int] = {}

    def in_flight(self, kind: str | None = None) -> int:
        """Bytes reserved by work not yet done (of one kind, or all)."""
        with self._lock:
            return self._in_flight.get(kind, 0) if kind is not None else sum(self._in_flight.values())

    def has_room(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more would fit the budget now (a caller checks before claiming work that others
        would then wait for; ``submit`` decides)."""
        with self._lock:
            return sum(self._in_flight.values()) + nbytes <= self.budget

    def submit(self, kind: str, job: Callable[[], None], nbytes: int, cap: int | None = None,
               then: Callable[[], None] | None = None) -> Future[Any] | None:
        """Run ``job`` on the ``kind`` pool, its ``nbytes`` counted in flight until it returns, then ``then``
        (when given: after the bytes are released, on the same worker); None (and neither run) when that
        would pass the budget, or the caller's ``cap`` for this kind."""
        with self._lock:
            mine = self._in_flight.get(kind, 0)
            if sum(self._in_flight.values()) + nbytes > self.budget or (cap is not None and mine + nbytes > cap):
                return None
            self._in_flight[kind] = mine + nbytes
            pool = self._pools.get(kind)
            if pool is None:
                pool = self._pools[kind] = ThreadPoolExecutor(self.concurrency.get(kind, 1),
                                                              thread_name_prefix=f"ckptfs-{kind}-ahead")
        try:
            return pool.submit(self._run, kind, job, nbytes, then)
        except RuntimeError:  # the interpreter is shutting down
            self._release(kind, nbytes)
            return None

    def call(self, kind: str, fn: Callable[[], T], nbytes: int) -> Future[T] | None:
        """Run ``fn`` on the ``kind`` pool for a caller that waits on it (what it reads under is in its
        arguments: ``ckptfs.core.reads``): the future carries ``fn``'s result or its exception. None when
        ``nbytes`` more would pass the budget: the caller runs ``fn`` itself."""
        result: Future[T] = Future()

        def job() -> None:
            if not result.set_running_or_notify_cancel():
                return
            try:
                value = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller waiting on the future
                result.set_exception(exc)
            else:
                result.set_result(value)

        return result if self.submit(kind, job, nbytes) is not None else None

    def _run(self, kind: str, job: Callable[[], None], nbytes: int, then: Callable[[], None] | None) -> None:
        try:
            job()
        except Exception:  # read-ahead is an optimization; the read itself reports errors
            log.debug("%s-ahead job %r failed", kind, job, exc_info=True)
        finally:
            self._release(kind, nbytes)
        if then is not None:
            try:
                then()
            except Exception:  # as the job's own
                log.debug("%s-ahead continuation %r failed", kind, then, exc_info=True)

    def _release(self, kind: str, nbytes: int) -> None:
        with self._lock:
            self._in_flight[kind] = max(0, self._in_flight.get(kind, 0) - nbytes)

    def in_child(self) -> Scheduler:
        """In a forked child: the same scheduler (what holds it goes on using it), the parent's workers
        forgotten, and what they had in flight; pools start afresh on first use."""
        self._lock = threading.Lock()
        self._pools = {}
        self._in_flight = {}
        return self


class Ordered:
    """Jobs run one at a time in the order they are put, on a scheduler's ``kind`` pool: a hash fed buffer by
    buffer while the thread reading the buffers goes on. One worker drains the queue and returns when it is
    empty, so no worker is held between buffers (the caller drains it itself when the pool is gone: the
    interpreter shutting down). The caller bounds what it has queued (``wait(most)``): the jobs reserve none
    of the budget. After a job raised, nothing more runs and ``wait`` raises its exception."""

    def __init__(self, scheduler: Scheduler, kind: str) -> None:
        self._scheduler = scheduler
        self._kind = kind
        self._cond = threading.Condition()
        self._queue: deque[Callable[[], None]] = deque()
        self._draining = False
        self._error: BaseException | None = None

    def put(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._queue.append(job)
            if self._draining:
                return
            self._draining = True
        if self._scheduler.submit(self._kind, self._drain, 0) is None:
            self._drain()

    def pending(self) -> int:
        """Jobs put and not yet run (the one running included)."""
        with self._cond:
            return len(self._queue)

    def wait(self, most: int = 0) -> None:
        """Until at most ``most`` jobs are pending; the first job's exception, if one raised."""
        with self._cond:
            self._cond.wait_for(lambda: len(self._queue) <= most or self._error is not None)
            if self._error is not None:
                raise self._error

    def _drain(self) -> None:
        while True:
            with self._cond:
                if not self._queue or self._error is not None:
                    self._draining = False
                    self._cond.notify_all()
                    return
                job = self._queue[0]
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - raised to the caller by wait()
                with self._cond:
                    self._error = exc
            with self._cond:
                self._queue.popleft()
                self._cond.notify_all()


#: A runtime's worker pools (taken where their users are built: a source's read-ahead from its options'
#: runtime, a decode-ahead from the mount's).
WORKERS = Part("worker pools", Scheduler, Scheduler.in_child)
