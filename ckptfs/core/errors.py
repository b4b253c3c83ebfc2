"""The one public exception.

Every problem with a checkpoint, found at open (a header that cannot be right) or at read time (bytes that
are missing or changed), is a ``CheckpointError``. It subclasses ``ValueError`` so callers that already guard
against bad input catch it, and its message always names the file, the byte offset and what is wrong, so a
user can act on a single line.
"""

from __future__ import annotations

import re

# scheme://[userinfo@]host/path[?query][#fragment]
_URL = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^/?#@]*@)?(?P<rest>[^?#]*)(?P<query>[?#].*)?$", re.S)


def public_name(src: str) -> str:
    """``src`` as messages, logs and the mount table may show it: a URL without its user info and query (a
    presigned URL's signature is a credential), a path as it is."""
    match = _URL.match(src)
    if match is None:
        return src
    return match["scheme"] + match["rest"] + ("?…" if match["query"] else "")


class CheckpointError(ValueError):
    """A checkpoint is malformed, or data asked for is missing or damaged."""

    def __init__(self, file: str | None, offset: int | None, reason: str):
        self.file = file
        self.offset = offset
        self.reason = reason
        where = public_name(str(file)) if file is not None else "<checkpoint>"
        if offset is not None:
            where += f" @ byte {offset}"
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):
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
