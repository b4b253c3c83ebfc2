"""The chunk-store protocol: where ``ChunkCache`` (``chunks.py``) keeps fetched remote chunks beyond memory.

A store holds chunk ``i`` (bytes ``i * CHUNK`` on, the last one of a file shorter) of the remote file named
by a content identity (``ckptfs.sources.identity``), and coordinates the processes of one machine so that
each chunk is fetched once (``lease`` / ``wait`` / ``release``). Its one implementation is the sparse-file
store (``sparse_store.py``); tests plug in others (a broken one: a store that fails costs speed, never a
read, and ``ChunkCache`` swallows its errors).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol


class ChunkStore(Protocol):
    def get(self, content_id: str, index: int) -> bytes | None:
        """Chunk ``index`` of the file, checked; None when absent or bad (a miss)."""

    def put_chunks(self, content_id: str, first: int, parts: Sequence[bytes] | Sequence[memoryview],
                   chunks: int | None, direct: bool = False) -> bool:
        """Store consecutive chunks ``first, first + 1, ...`` (``parts``) of a file of ``chunks`` chunks (None:
        not known here); True when they are all stored. Gives up this process's leases of them. ``direct``:
        no reader waits for these bytes (a warm-up's): the store may write them past the page cache."""

    def landing(self, nbytes: int) -> contextlib.AbstractContextManager[memoryview]:
        """A writable buffer of ``nbytes``, lent for a ``with`` block, for a warm-up's body to be fetched
        straight into and stored from: ``put_chunks(..., direct=True)`` of its views at multiples of ``CHUNK``
        writes them from there (no copy). Whoever fills it holds no view of it past the block."""

    def let_go_of_landings(self) -> None:
        """The landing buffers kept for reuse and not lent now are given back to the system: a warm-up ended
        (a mount's daemon goes on without it)."""

    def stored_chunks(self, content_id: str, indexes: Sequence[int]) -> set[int]:
        """Of the chunks ``indexes``, those the store holds (not checked against their MACs here)."""

    def writes_paused(self) -> str | None:
        """Why nothing is stored now (the file system full, ...), or None."""

    def lease(self, content_id: str, indexes: Sequence[int]) -> list[bool]:
        """For each chunk: True when this process now holds its lease (fetch it, then ``put_chunks`` or
        ``release``), False when it is stored already or another process holds the lease (``wait``)."""

    def wait(self, content_id: str, indexes: Sequence[int], timeout: float) -> list[bytes | None]:
        """The chunks other processes fetch under their leases, once stored; None for each whose lease ended
        without it being stored, or past ``timeout`` seconds."""

    def release(self, content_id: str, indexes: Sequence[int]) -> None:
        """Give up leases unfetched: their waiters fetch them."""

    def sealed_copy(self, content_id: str, size: int) -> tuple[int, int, int, int] | None:
        """``(descriptor, size, mtime_ns, gate)`` of the file's complete local copy, or None (not complete, it
        failed its check, or no such copy). ``gate``: the address of an int64 that says how many bytes from
        the start this process has checked against their MACs so far (-1 once the check failed): only those
        may be read from the descriptor."""

    def stats(self) -> dict[str, Any]:
        """This process's counters."""

    def pin(self, content_id: str, name: str, record: dict[str, Any]) -> None:
        """Keep ``record`` as what the remote name ``name`` (a URL) stands for — ``content_id`` and its parts —
        once bytes of ``content_id`` are stored (``names.py``)."""

    def recall(self, name: str) -> dict[str, Any] | None:
        """The record kept for the remote name ``name`` (a file's or a folder's), or None."""

    def remember(self, name: str, record: dict[str, Any]) -> None:
        """Keep ``record`` for ``name`` now (a folder's listing: no bytes of its own)."""
