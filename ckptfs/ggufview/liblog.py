"""gguf-py's log lines while a header is built, kept in the mount's log at debug level.

gguf-py logs what the converter shows its user (an unknown separator token in a post-processor, a key written
twice where an architecture overrides a common one) through the ``gguf`` loggers, which have no handler of
their own: Python would print them on the terminal of ``ckptfs mount``. A mount says what it serves or why not
in one line; these details stay in its log for debugging.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

LIBRARY_LOGGER = "gguf"
_lock = threading.Lock()
_active = 0


class _Forward(logging.Handler):
    def __init__(self, target: logging.Logger):
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.debug("%s: %s", record.name, record.getMessage())


@contextmanager
def library_logs_to(target: logging.Logger) -> Iterator[None]:
    """While the block runs (in any thread), gguf-py's records go to ``target`` at debug level only."""
    global _active
    library = logging.getLogger(LIBRARY_LOGGER)
    handler = _Forward(target)
    with _lock:
        _active += 1
        if _active == 1:
            library.propagate = False
        library.addHandler(handler)
    try:
        yield
    finally:
        with _lock:
            library.removeHandler(handler)
            _active -= 1
            if _active == 0:
                library.propagate = True
