"""The error every mount-side failure becomes: one line a user can act on; and the memory of the causes of
EIO already logged, so a cause is logged once (the daemon's log, ``service/logs.py``, says why)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

CAUSES_REMEMBERED = 4096


class MountError(OSError):
    """A mount or unmount cannot be done; ``str()`` is the one-line reason.

    An OSError because it is one in spirit (the system refuses), and so that callers printing OSErrors as
    one line (the CLI) print this one as is.

    ``exit_code`` is 1 for runtime failures and 2 for usage errors (an option that is refused), following
    the CLI's convention.
    """

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class OncePerCause:
    """Remembers the causes seen recently: ``first(cause)`` is True only the first time."""

    def __init__(self, limit: int = CAUSES_REMEMBERED):
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def first(self, cause: Hashable) -> bool:
        with self._lock:
            if cause in self._seen:
                self._seen.move_to_end(cause)
                return False
            self._seen[cause] = None
            if len(self._seen) > self._limit:
                self._seen.popitem(last=False)
            return True
