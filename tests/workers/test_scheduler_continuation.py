"""The read-ahead scheduler's continuation (``Scheduler.submit(..., then=...)``): what a pipeline that starts
its next piece when one lands (remote read-ahead's ``pump``, a warm-up's refill) relies on.

- ``then`` runs once the job's bytes are released, so a piece the size of the whole budget can start the next
  one of that size from there (from inside the job the budget is still full: refused);
- it runs on the worker that ran the job, after it, also when the job raised;
- a failing continuation is logged, and the pool keeps serving;
- a refused submit runs neither the job nor its continuation.
"""

from __future__ import annotations

import logging
import threading

from ckptfs.workers.scheduler import Scheduler

BUDGET = 8 << 20
WAIT_S = 10.0


def test_a_continuation_finds_the_room_its_job_held():
    scheduler = Scheduler(budget=BUDGET, concurrency={"fetch": 2})
    seen: dict = {}
    done = threading.Event()
    continued = threading.Event()

    def job() -> None:
        # from inside the job its own bytes still count: a second whole-budget piece does not fit
        seen["inside"] = scheduler.submit("fetch", lambda: None, BUDGET)

    def then() -> None:
        seen["in_flight"] = scheduler.in_flight("fetch")
        seen["next"] = scheduler.submit("fetch", done.set, BUDGET)
        continued.set()  # the piece it submitted may run (and set ``done``) before submit returns here

    assert scheduler.submit("fetch", job, BUDGET, then=then) is not None
    assert done.wait(WAIT_S), "the piece started by the continuation never ran"
    assert continued.wait(WAIT_S), "the continuation never returned"
    assert seen["inside"] is None
    assert seen["in_flight"] == 0
    assert seen["next"] is not None


def test_the_continuation_runs_after_the_job_on_its_worker_even_when_the_job_raised():
    scheduler = Scheduler(budget=BUDGET, concurrency={"fetch": 4})
    order: list[tuple[str, str]] = []
    done = threading.Event()

    def job() -> None:
        order.append(("job", threading.current_thread().name))
        raise RuntimeError("a failed fetch")

    def then() -> None:
        order.append(("then", threading.current_thread().name))
        done.set()

    future = scheduler.submit("fetch", job, 1 << 20, then=then)
    assert future is not None and done.wait(WAIT_S)
    future.result(WAIT_S)  # the job's failure stays inside the scheduler (read-ahead is best effort)
    assert [what for what, _ in order] == ["job", "then"]
    assert order[0][1] == order[1][1] and order[0][1].startswith("ckptfs-fetch-ahead")
    assert scheduler.in_flight() == 0


def test_a_failing_continuation_leaves_the_pool_serving(caplog):
    caplog.set_level(logging.DEBUG, logger="ckptfs.workers.scheduler")
    scheduler = Scheduler(budget=BUDGET, concurrency={"fetch": 1})

    def then() -> None:
        raise ValueError("a continuation that fails")

    first = scheduler.submit("fetch", lambda: None, 1 << 20, then=then)
    assert first is not None
    first.result(WAIT_S)
    ran = threading.Event()
    assert scheduler.submit("fetch", ran.set, 1 << 20) is not None
    assert ran.wait(WAIT_S)
    assert scheduler.in_flight() == 0
    assert any("continuation" in r.getMessage() and r.exc_info for r in caplog.records), caplog.records


def test_a_refused_submit_runs_neither_the_job_nor_its_continuation():
    scheduler = Scheduler(budget=BUDGET, concurrency={"fetch": 2})
    ran: list[str] = []
    assert scheduler.submit("fetch", lambda: ran.append("job"), BUDGET + 1,
                            then=lambda: ran.append("then")) is None
    assert scheduler.submit("fetch", lambda: ran.append("job"), 1 << 20, cap=1 << 19,
                            then=lambda: ran.append("then")) is None
    # a job that does run, to be sure nothing refused is still on its way
    done = threading.Event()
    assert scheduler.submit("fetch", done.set, 1 << 20) is not None
    assert done.wait(WAIT_S)
    assert ran == [] and scheduler.in_flight() == 0
