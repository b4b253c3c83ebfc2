"""The process's shared state in one object: :class:`Runtime`, holding each :class:`Part` it is asked for.

What every checkpoint and mount of a process shares — the remote sources' counters, the HTTP connection pool,
the S3 clients, the fetched chunks kept in memory, the hold on prune threads, ... — is a part of a runtime,
not a module global: a component is handed the runtime where it is built (``RemoteOptions.runtime``, the
mount's operations) and takes its parts from what it was handed. The runtime knows no part in advance: each
is declared by the module that owns its type, as a ``Part`` naming how to build one (on first use) and what a
forked child keeps of it, so this module, at the bottom of the layers, imports none of them.

One runtime per process is the default (:func:`runtime`); library use gets it implicitly, a mount's daemon
passes it down, and a library user may build one of their own. A forked child renews every runtime in place
(from ``ckptfs.util.forks``, the process's one ``os.register_at_fork`` hook): objects built before the fork
(a mount opens its checkpoint, then forks its daemon; a DataLoader forks its workers) hold the same runtime
and find the child's parts in it. Threads do not survive ``fork``: a lock a parent's thread held stays held for ever,
a keep-alive socket would be shared by two processes. So a part is dropped in the child (built afresh on first
use there) unless its ``in_child`` says what the child keeps (memory it may serve from, with a fresh lock).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

from ckptfs.util.forks import after_fork_in_child

log = logging.getLogger(__name__)

T = TypeVar("T")


def _drop(part: object) -> None:
    """A forked child builds its own (the default ``Part.in_child``)."""
    return None


@dataclass(frozen=True, eq=False)
class Part(Generic[T]):
    """One piece of a runtime: ``build()`` makes it on first use; ``in_child(parent's)`` is what a forked child
    keeps (the same object with fresh locks, a new one, or None: built afresh on first use there). Compared by
    identity: the module that declares it holds the one key."""

    name: str
    build: Callable[[], T] = field(repr=False)
    in_child: Callable[[T], T | None] = field(default=_drop, repr=False)


class Runtime:
    """The parts a process's components share (see the module docstring), each built on first use."""

    def __init__(self) -> None:
        self._parts: dict[Part[Any], Any] = {}
        self._lock = threading.Lock()
        _runtimes.add(self)  # renewed in a forked child, like the default one

    def get(self, part: Part[T]) -> T:
        """This runtime's ``part``, built now if it is the first use."""
        try:
            return cast(T, self._parts[part])
        except KeyError:
            pass
        with self._lock:
            if part not in self._parts:
                self._parts[part] = part.build()
            return cast(T, self._parts[part])

    def built(self) -> tuple[str, ...]:
        """The names of the parts built so far (for a log line or a test)."""
        with self._lock:
            return tuple(part.name for part in self._parts)

    def renew_in_child(self) -> None:
        """In a forked child: a fresh lock, and each part as its ``in_child`` says (dropped by default). A part
        whose ``in_child`` raises is dropped, the error logged: the child builds it afresh."""
        self._lock = threading.Lock()  # a parent's thread may have been building a part at fork
        kept: dict[Part[Any], Any] = {}
        for part, value in self._parts.items():
            try:
                renewed = part.in_child(value)
            except Exception:  # the other parts are still renewed; this one is built afresh
                log.warning("after fork: %s not kept", part.name, exc_info=True)
                renewed = None
            if renewed is not None:
                kept[part] = renewed
        self._parts = kept


class ForkReset(Protocol):
    """An object whose threads' state a forked child must reset (``Live``)."""

    def in_child(self) -> None: ...


class Live:
    """The objects of a runtime that a forked child must reset, held weakly (a read-ahead whose fetches were
    the parent's threads, a version pin whose checks were): each's ``in_child`` runs in the child. One that
    raises is logged; the others are still reset."""

    def __init__(self) -> None:
        self._objects: weakref.WeakSet[ForkReset] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, obj: ForkReset) -> None:
        with self._lock:
            self._objects.add(obj)

    def in_child(self) -> Live:
        self._lock = threading.Lock()
        for obj in list(self._objects):
            try:
                obj.in_child()
            except Exception:  # the others are still reset; this one's own work reports its errors
                log.warning("after fork: %r not reset", obj, exc_info=True)
        return self


#: A runtime's objects to reset in a forked child (``Live``).
LIVE = Part("objects reset in a forked child", Live, Live.in_child)

#: Every runtime of the process, held weakly: each is renewed in a forked child (platform-bound: the fork hook
#: must reach the runtimes that objects built before the fork hold).
_runtimes: weakref.WeakSet[Runtime] = weakref.WeakSet()

#: The process's runtime (platform-bound: one per process, renewed in place in a forked child).
_default = Runtime()


def runtime() -> Runtime:
    """The process's default runtime: what a component not handed one uses."""
    return _default


@after_fork_in_child
def _renew_in_child() -> None:
    for each in list(_runtimes):
        each.renew_in_child()
