"""What a forked child must redo, registered in one place: :func:`after_fork_in_child`.

A mount forks its daemon after the checkpoint is opened, and a DataLoader or multiprocessing worker forks a
process that holds open checkpoints. Threads do not survive ``fork``: a lock a parent's thread held at that
moment stays held in the child for ever, a worker pool's threads are gone while its queue says otherwise, and
a keep-alive socket would be shared by two processes. Each module that keeps such process-wide state
registers a callback here that gives the child fresh state; the one ``os.register_at_fork`` hook runs them
in the order they were registered (a module's callback registers when the module is imported, so one that
another builds on, imported first, is reset first).

A callback that raises does not keep the others from running: its error is logged and the next one runs
(``os.register_at_fork`` would only print it, and the rest of one hook would be skipped).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_callbacks: list[Callable[[], None]] = []
_lock = threading.Lock()


def after_fork_in_child(fn: Callable[[], None]) -> Callable[[], None]:
    """Run ``fn`` in every child forked from now on, before the child goes on (returns ``fn``: usable as a
    decorator)."""
    with _lock:
        _callbacks.append(fn)
    return fn


def registered() -> tuple[Callable[[], None], ...]:
    """The callbacks a child runs, in order."""
    with _lock:
        return tuple(_callbacks)


def _in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a parent's thread may have been registering at fork
    for fn in list(_callbacks):
        try:
            fn()
        except Exception:  # the other callbacks still run; the child's own work reports errors
            log.warning("after-fork callback %r failed", fn, exc_info=True)


if hasattr(os, "register_at_fork"):  # probe: platform
    os.register_at_fork(after_in_child=_in_child)
