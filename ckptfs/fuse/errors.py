"""The error every mount-side failure becomes: one line a user can act on."""

from __future__ import annotations

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
