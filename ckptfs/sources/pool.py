"""The byte sources of one checkpoint, opened lazily through a factory, with a bound on open descriptors."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable

from ckptfs.core.errors import CheckpointError
from ckptfs.sources.base import ByteSource


class SourcePool:
    """The files of one checkpoint, opened lazily, with a bound on descriptors held open at once.

    Sources are made by ``opener(name, base_dir)`` (default: ``ckptfs.sources.open_source``, which picks the
    implementation by URL scheme) and then passed through ``wrapper`` when one is given (checked reads,
    mirrors), so the block engine and the views never know what kind of source they read.

    A checkpoint of hundreds of shards must not hold hundreds of descriptors; the least recently used idle
    ones are closed and reopened (identity-checked) when needed again. Only open sources are tracked in
    the LRU order, so a lookup costs O(1) however many shards there are.

    Relative paths are opened from the working directory the pool was made in: files are opened lazily, and
    by then the process may have moved (libfuse puts a mount daemon in ``/``; a program may ``chdir``), so
    ``model.gguf`` given in the model's folder must still name that file. The path stays as given everywhere
    else (messages, ``source`` in meta.json).
    """

    def __init__(self, max_open: int = 64, opener: Callable[[str, str | None], ByteSource] | None = None,
                 wrapper: Callable[[ByteSource], ByteSource] | None = None) -> None:
        if opener is None:
            from ckptfs.sources.registry import open_source
            opener = open_source
        self._opener = opener
        self._wrapper = wrapper
        self.max_open = max(1, max_open)
        try:
            self._base: str | None = os.getcwd()
        except OSError:  # the working directory was deleted: only absolute paths can be opened anyway
            self._base = None
        self._sources: dict[str, ByteSource] = {}
        self._open_lru: OrderedDict[str, ByteSource] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    def get(self, path: str) -> ByteSource:
        with self._lock:
            if self._closed:
                raise CheckpointError(path, None, "the checkpoint is closed (open it again to read)")
            src = self._sources.get(path)
            if src is None:
                src = self._opener(path, self._base)
                if self._wrapper is not None:
                    src = self._wrapper(src)
                self._sources[path] = src
            else:
                src.ensure_open()
            self._open_lru[path] = src
            self._open_lru.move_to_end(path)
            if len(self._open_lru) > self.max_open:
                self._trim()
            return src

    def _trim(self) -> None:
        for path, src in list(self._open_lru.items())[:-1]:
            if len(self._open_lru) <= self.max_open:
                break
            if src.close_if_idle():
                del self._open_lru[path]

    def open_count(self) -> int:
        with self._lock:
            return sum(1 for s in self._sources.values() if s.is_open)

    def sources(self) -> list[ByteSource]:
        with self._lock:
            return list(self._sources.values())

    def close(self) -> None:
        """Close every descriptor and connection, for good: a later ``get`` raises CheckpointError. Reopening
        after close (as this pool once did) left a descriptor that nothing would ever close again."""
        with self._lock:
            self._closed = True
            for src in self._sources.values():
                src.close()
            self._open_lru.clear()
