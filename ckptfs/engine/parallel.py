"""One request's decoding spread over the cores: the calling thread and idle workers of the decode pool.

A FUSE read that misses the cache needs several block groups decoded before it can answer (a 1 MiB request
is four 256 KiB groups). The C kernels and ``pread`` release the GIL, so the groups can be decoded at once on
every core. :func:`spread` runs a request's tasks on the calling thread *and* on workers of the read-ahead
scheduler's ``decode`` pool (one thread per core in all: the caller and ``concurrency - 1`` workers; more
threads than cores would only pass the GIL around more often). The tasks are taken from one shared list, so
a worker that starts late (busy with read-ahead) finds the list empty and returns at once, and the caller
never waits for a task nobody started — it runs whatever is left itself and waits only for tasks already
running elsewhere. The helpers reserve no bytes of the scheduler's budget: what they write is the caller's
own buffer. What the caller's read carries — a remote read's deadline, the mount's ``--timeout`` for the
whole request (``ckptfs.core.reads.ReadScope``) — is in each task's arguments, so it holds for the tasks run
elsewhere too, instead of each worker's task starting a deadline of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from ckptfs.core.runtime import runtime
from ckptfs.workers.scheduler import WORKERS, Scheduler


def spread(tasks: Sequence[Callable[[], None]], scheduler: Scheduler | None = None, kind: str = "decode") -> None:
    """Run every task once, here and on idle ``kind`` workers (``scheduler``'s, else the process runtime's);
    return when all are done. The first task's exception is raised (after every started task has ended: none
    outlives the call)."""
    if len(tasks) <= 1:
        for task in tasks:
            task()
        return
    lock = threading.Lock()
    done = threading.Event()
    state = {"next": 0, "left": len(tasks)}
    errors: list[BaseException] = []

    def drain() -> None:
        while True:
            with lock:
                i = state["next"]
                if i >= len(tasks):
                    return
                state["next"] = i + 1
            try:
                tasks[i]()
            except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
                errors.append(exc)
            finally:
                with lock:
                    state["left"] -= 1
                    if state["left"] == 0:
                        done.set()

    workers = scheduler if scheduler is not None else runtime().get(WORKERS)
    for _ in range(min(len(tasks), workers.concurrency.get(kind, 1)) - 1):  # the caller is one of them
        if workers.submit(kind, drain, 0) is None:
            break
    drain()
    done.wait()
    if errors:
        raise errors[0]
