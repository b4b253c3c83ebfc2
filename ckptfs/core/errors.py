"""The one public exception.

Every problem with a checkpoint, found at open (a header that cannot be right) or at read time (bytes that
are missing or changed), is a ``CheckpointError``. It subclasses ``ValueError`` so callers that already guard
against bad input catch it, and its message always names the file, the byte offset and what is wrong, so a
user can act on a single line.
"""

from __future__ import annotations

from typing import Any
from ckptfs.util.redact import public_name, redact

__all__ = ["CheckpointError", "IntegrityError", "SourceUnavailable", "public_name"]


class CheckpointError(ValueError):
    """A checkpoint is malformed, or data asked for is missing or damaged."""

    def __init__(self, file: str | None, offset: int | None, reason: str) -> None:
        self.file = file
        self.offset = offset
        self.reason = redact(reason)  # a reason quoting a URL (a redirect target) shows no secret either
        where = public_name(str(file)) if file is not None else "<checkpoint>"
        if offset is not None:
            where += f" @ byte {offset}"
        super().__init__(f"{where}: {self.reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.file, self.offset, self.reason))

    def about_tensor(self, name: str) -> CheckpointError:
        """The same error (same class) with the tensor named in front, unless the reason names it already."""
        prefix = f"tensor {name!r}: "
        if self.reason.startswith(prefix):
            return self
        return type(self)(self.file, self.offset, prefix + self.reason)


class IntegrityError(CheckpointError):
    """Stored bytes that are present but differ from what a manifest recorded for them (bit rot, an in-place
    rewrite). A CheckpointError, so every layer that turns a failed read into EIO or tries a mirror treats it
    as one; its own class, so a caller can tell changed bytes from missing ones."""


class SourceUnavailable(CheckpointError):
    """A source that could not be reached (connection failures, timeouts, 5xx/429 until the read's deadline):
    it may answer later, unlike a source that answered wrongly (404, another file). A mirror that is
    unavailable at mount time is tried again when a read needs it; one that answers wrongly is refused."""
