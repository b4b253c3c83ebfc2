"""The byte-source protocol: what every reader of stored bytes talks to.

Readers (headers), multi-file discovery, the block engine and the views never open files themselves: they ask
a ``ByteSource`` for exact byte ranges. A local file is one implementation (``local.FileSource``); a remote
object (HTTP range requests, S3, the Hugging Face Hub) is another, registered by URL scheme in
``ckptfs.sources``; wrappers (checked reads against a manifest, mirrors) are ByteSources around ByteSources.

The contract every implementation keeps:

- ``size`` and ``identity`` are fixed at open. A later answer from the medium with another identity is an
  error for that read, never bytes of another version.
- ``pread(offset, size)`` returns exactly ``size`` bytes or raises ``CheckpointError`` (the mount answers
  EIO); never a short result, never a hang past the source's own timeout.
- ``content_id()`` is what caches shared between processes and pickles key on (see ``identity``).
- ``advise`` is a hint and never fails; ``close`` releases what the source holds (a later read may reopen,
  identity-checked).
- ``scope`` (keyword-only, on ``pread``, ``pread_into`` and ``advise``) is what the caller says about the read
  (``ckptfs.core.reads.ReadScope``: a deadline, a copy behind it, a stream decided above); a wrapper hands it
  on to what it wraps (narrowed, if it knows more), a source that has no use for it ignores it.
"""

from __future__ import annotations

import builtins
from typing import Any, Protocol, runtime_checkable

from ckptfs.core.reads import NOTHING_SAID, ReadScope


class ByteSource:
    """Base class with the optional parts of the protocol filled in (see the module docstring)."""

    name: str
    size: int
    #: What a reopen must find again (a local file's device, inode, size, mtime...; () when nothing is known).
    identity: tuple[Any, ...] = ()
    #: Modification time shown as the mount's times (0 when the medium does not say).
    mtime_ns: int = 0
    #: Bytes a header reader asks for at least in its first read (remote sources: each read is a round trip).
    initial_read: int = 0
    #: How many times the source has seen its file's status change since it was opened with its size and
    #: mtime unchanged (a local file's ctime: chmod, chown, link, rename — or a rewrite that put the mtime
    #: back). It never fails a read; a reader that checks bytes (``integrity.checked``) checks them again.
    changes: int = 0

    def pread(self, offset: int, size: int, *, scope: ReadScope = NOTHING_SAID) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def pread_into(self, offset: int, target: memoryview, *, scope: ReadScope = NOTHING_SAID) -> None:
        """``pread`` of ``len(target)`` bytes into a writable byte buffer (the mount's reads fill libfuse's
        buffer). This default copies ``pread``'s answer, so wrappers (checked, mirrored) keep their checks;
        a source that can fill the buffer itself (a local file) overrides it, one copy fewer."""
        target[:] = self.pread(offset, len(target), scope=scope)

    def content_id(self) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def advise(self, offset: int, size: int, sequential: bool = False, *, scope: ReadScope = NOTHING_SAID) -> None:
        """Say these bytes are wanted soon (best effort); ``scope.decided``: by the layer that watches the
        reader's stream (the source then follows this advice rather than judging the stream itself)."""

    @property
    def fetches_ahead(self) -> bool:
        """Whether advice makes this source fetch bytes ahead of its reader that would each cost it a round
        trip otherwise (a remote source: read-ahead then advises it far ahead, across files). A local file's
        kernel reads ahead on its own; advising it far ahead only adds work on the reader's path."""
        return False

    @property
    def is_open(self) -> bool:
        """Whether the source holds an OS resource now (the pool bounds descriptors by this)."""
        return False

    def ensure_open(self) -> None:
        """Reacquire what ``close`` released, refusing a medium that is no longer the same."""

    def close_if_idle(self) -> bool:
        """Release held resources unless a read is using them; True if released."""
        self.close()
        return True

    def stats(self) -> dict[str, Any]:
        """Counters (remote sources: requests, bytes, retries, failovers)."""
        return {}

    def close(self) -> None:
        """Release held resources."""


@runtime_checkable
class WrapsSource(Protocol):
    """A source that reads through another (checked reads, mirrors): what the bytes finally come from is
    ``wrapped``'s (a remote source under a manifest's checks is still fetched chunk by chunk)."""

    @property
    def wrapped(self) -> ByteSource: ...


@runtime_checkable
class Mirrored(Protocol):
    """A source with byte-identical stand-ins (``--mirror``): a read that failed is asked of them once more."""

    mirrors: list[ByteSource]


@runtime_checkable
class HasLocalCopy(Protocol):
    """A source whose bytes may lie complete in a local file (a remote source's checked copy in the
    ``--cache-dir`` store): a mount then serves it in C like a local file (``ckptfs.fuse.direct``)."""

    def local_copy(self) -> tuple[int, int, int, int] | None:
        """``(descriptor, size, mtime_ns, gate)`` of the complete local copy (``ChunkStore.sealed_copy``), or
        None (none yet)."""
        ...


class Folder:
    """A model folder: the regular files directly in it, by name, and how to name one as a source."""

    name: str

    def list(self) -> dict[str, int]:  # pragma: no cover - interface
        """Regular files directly in the folder (hidden ones excluded): name -> size (-1 if unknown)."""
        raise NotImplementedError

    def broken(self) -> builtins.list[str]:  # builtins: ``list`` here is the method
        """Entries that are neither files nor folders (dangling links, sockets): reported, not served."""
        return []

    def join(self, name: str) -> str:  # pragma: no cover - interface
        """The source string (path or URL) of the file ``name`` in this folder."""
        raise NotImplementedError

    def places(self) -> dict[str, str]:
        """Listed names that ``join`` cannot derive from the name alone (a Hub file listed from a sub-folder,
        numbered ``~2`` or shortened with a hash): name -> its path in the folder. A listing kept for offline
        use keeps these with it, so each name still reads its own file."""
        return {}

    def adopt_places(self, places: dict[str, str]) -> None:
        """Take ``places`` from a kept listing (this process did not list the folder itself)."""
