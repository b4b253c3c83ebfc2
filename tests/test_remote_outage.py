"""A read's deadline against an origin that stops answering: the application's read ends within ``--timeout``.

Debian's nginx on loopback, throttled (``limit_rate``) so that a read is still under way when the test
freezes the server (SIGSTOP: connections stay open, nothing more comes, as a hung origin behaves). Reads go
through real FUSE mounts; the bounds asserted are the product's promise plus slack for a loaded machine,
never a measurement of speed. After the server resumes, the same bytes read exact.
"""

from __future__ import annotations

import threading

from ckptfs.engine.parallel import spread
from ckptfs.readahead import Scheduler
from ckptfs.sources.remote.transport import deadline_scope, read_deadline


def test_decode_workers_carry_the_readers_deadline():
    """A .npy read's block groups decoded on the decode pool's workers read their bytes under the reader's
    deadline, not one each worker's task starts afresh (that made one FUSE read last several --timeouts)."""
    scheduler = Scheduler(concurrency={"decode": 2})
    second_started = threading.Event()
    seen: list[tuple[int, float]] = []

    def first() -> None:  # holds the caller until the other task has started elsewhere
        assert second_started.wait(10), "no worker took a task"
        seen.append((threading.get_ident(), read_deadline(1000)))

    def second() -> None:
        second_started.set()
        seen.append((threading.get_ident(), read_deadline(1000)))

    with deadline_scope(5):
        end = read_deadline(1000)
        spread([first, second], scheduler)
    assert len({thread for thread, _ in seen}) == 2  # one task ran on a worker
    assert all(deadline <= end for _, deadline in seen), (end, seen)
