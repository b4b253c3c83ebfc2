"""What a forked child redoes is registered in one place (``ckptfs.util.forks``).

- the callbacks run in a forked child, in the order registered, and one that raises does not keep the next
  from running;
- the runtime's worker pools work in a child forked while the parent's workers run;
- the runtime's per-origin registry works in a child forked while a parent's thread holds its locks: the child has no
  request in flight and counts on from the parent's outages and deadlines met;
- no module of ckptfs calls ``os.register_at_fork`` but the registry.
"""

from __future__ import annotations

import ast
import json
import threading
from pathlib import Path

from ckptfs.ahead.limits import ORIGINS
from ckptfs.core.runtime import runtime
from ckptfs.workers.scheduler import WORKERS
from ckptfs.util import forks
from forking import WAIT_S, in_child

ROOT = Path(__file__).resolve().parents[2]

_armed = {"on": False}  # the callbacks below act only in the test that registers them (and its children)


def test_callbacks_run_in_the_child_in_order_past_one_that_raises():
    seen: list[str] = []

    def first() -> None:
        if _armed["on"]:
            seen.append("first")

    def broken() -> None:
        if _armed["on"]:
            raise RuntimeError("a callback that fails")

    def last() -> None:
        if _armed["on"]:
            seen.append("last")

    for fn in (first, broken, last):
        forks.after_fork_in_child(fn)
    assert forks.registered()[-3:] == (first, broken, last)
    _armed["on"] = True
    try:
        assert in_child(lambda: ",".join(seen).encode()) == b"first,last"
    finally:
        _armed["on"] = False
    assert seen == []  # the parent ran none of them


def test_the_scheduler_serves_a_child_forked_while_its_workers_run():
    scheduler = runtime().get(WORKERS)
    workers = scheduler.concurrency["decode"]
    started, release = threading.Semaphore(0), threading.Event()
    for _ in range(workers):
        assert scheduler.submit("decode", lambda: (started.release(), release.wait(WAIT_S)), 1) is not None
    for _ in range(workers):
        assert started.acquire(timeout=WAIT_S)  # every worker of the parent's pool is busy at the fork
    try:
        def child() -> bytes:
            done = threading.Event()
            future = scheduler.submit("decode", done.set, 1)
            return b"ran" if future is not None and done.wait(WAIT_S) else b"stuck"

        assert in_child(child) == b"ran"
    finally:
        release.set()


def test_the_origin_registry_serves_a_child_forked_while_its_locks_are_held():
    origin = "http://forked.test:1"
    origins = runtime().get(ORIGINS)
    state = origins.state(origin)
    assert state.limit.try_start()  # a request of the parent's in flight at the fork
    state.tally.outage()
    state.tally.deadline_met(0.0, 5.0)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with origins._origins._lock, state.limit._lock, state.tally._lock:
            holding.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(WAIT_S)
    try:
        def child() -> bytes:
            again = runtime().get(ORIGINS).state(origin)
            assert again.limit.try_start()
            again.tally.outage()
            return json.dumps([again is state, runtime().get(ORIGINS).stats()[origin]]).encode()

        got = in_child(child)
    finally:
        release.set()
        holder.join(WAIT_S)
        state.limit.done()
    assert got, "the child hung on a lock a parent's thread held at the fork"
    inherited, figures = json.loads(got)
    assert inherited  # the parent's object: one registry, reset in place
    assert (figures["in_flight"], figures["outages"], figures["deadlines_met"]) == (1, 2, 1)


def test_only_the_registry_registers_with_os():
    callers = []
    for path in sorted((ROOT / "ckptfs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr == "register_at_fork"
                    and path.relative_to(ROOT).as_posix() != "ckptfs/util/forks.py"):
                callers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert callers == []
