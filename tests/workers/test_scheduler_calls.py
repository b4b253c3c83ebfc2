"""Work a caller waits on, on the read-ahead scheduler's pools (``Scheduler.call``, ``Ordered``): what the
torch loader's pieces read ahead and the manifest's hashing rely on.

- ``call`` hands back the function's result or its exception, and is refused (nothing run) over budget;
- ``Ordered`` runs its jobs one at a time in the order put, on a pool of several workers, ``wait(most)``
  bounds what is queued, and ``wait`` raises a job's exception (nothing after it runs).
"""

from __future__ import annotations

import threading

import pytest

from ckptfs.workers.scheduler import Ordered, Scheduler

WAIT_S = 10.0


def test_call_hands_back_the_result_and_the_exception():
    scheduler = Scheduler(budget=1 << 20, concurrency={"read": 2})
    ok = scheduler.call("read", lambda: threading.current_thread().name, 100)
    assert ok is not None and ok.result(WAIT_S).startswith("ckptfs-read-ahead")

    def fails() -> None:
        raise ValueError("the source said no")

    bad = scheduler.call("read", fails, 100)
    assert bad is not None
    with pytest.raises(ValueError, match="the source said no"):
        bad.result(WAIT_S)
    assert scheduler.in_flight() == 0


def test_call_over_budget_is_refused_and_runs_nothing():
    scheduler = Scheduler(budget=1000, concurrency={"read": 1})
    ran = []
    assert scheduler.call("read", lambda: ran.append(1), 1001) is None
    assert ran == [] and scheduler.in_flight() == 0


def test_ordered_jobs_run_one_at_a_time_in_order_on_many_workers():
    scheduler = Scheduler(concurrency={"decode": 4})
    stream = Ordered(scheduler, "decode")
    seen: list[int] = []
    running = [0]
    overlap = []
    lock = threading.Lock()

    def job(i: int) -> None:
        with lock:
            running[0] += 1
            overlap.append(running[0])
        seen.append(i)
        with lock:
            running[0] -= 1

    for i in range(200):
        stream.put(lambda i=i: job(i))
        if i % 7 == 0:
            stream.wait(most=3)
            assert stream.pending() <= 3
    stream.wait()
    assert seen == list(range(200)) and max(overlap) == 1 and stream.pending() == 0


def test_ordered_wait_raises_the_first_error_and_runs_nothing_after_it():
    scheduler = Scheduler(concurrency={"decode": 2})
    stream = Ordered(scheduler, "decode")
    seen: list[int] = []
    gate = threading.Event()
    stream.put(lambda: gate.wait(WAIT_S))

    def fails() -> None:
        raise OSError("disk gone")

    stream.put(fails)
    stream.put(lambda: seen.append(3))
    gate.set()
    with pytest.raises(OSError, match="disk gone"):
        stream.wait()
    assert seen == []
