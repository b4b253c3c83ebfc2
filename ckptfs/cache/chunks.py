"""Fetched remote bytes, kept: a bounded in-memory LRU per process, and optionally the ``--cache-dir`` store.

Remote bytes are cached in fixed, aligned chunks (``CHUNK`` bytes; the last chunk of a file may be shorter)
keyed by the source's content identity and the chunk number, so a chunk can never be served for another
file or another version of the same file. The memory LRU is shared by every remote source of the process;
the disk store (``--cache-dir``, shared by every ckptfs process on the machine) makes a remount or a second
process find the bytes without a request. A disk store that fails costs speed, never a read: its errors are
swallowed here (the store itself logs and counts them).
"""

from __future__ import annotations

import logging
import os
import threading

from ckptfs.cache.keys import CacheKey
from ckptfs.cache.lru import BytesLRU

log = logging.getLogger(__name__)

#: Cache and fetch unit. A random read fetches only the chunks covering it (a block group of stored bytes is
#: at most 256 KiB, so at most two chunks); a sequential reader's read-ahead fetches many in one request.
CHUNK = 256 * 1024
#: Twice what remote read-ahead keeps ahead of its reader (128 MiB): chunks that landed ahead of a reader are
#: not evicted by the ones it just read.
DEFAULT_MEMORY_BYTES = 256 * 1024 * 1024


def chunk_key(content_id: str, index: int) -> CacheKey:
    """The key of fetched chunk ``index`` (bytes ``index * CHUNK`` on) of the file ``content_id``."""
    return CacheKey(content_id, 0, "bytes", "raw", index, index + 1)


class MemoryChunks(BytesLRU):
    """Fetched chunks in memory: the package's one LRU (ckptfs.cache.lru), of ``bytes``."""

    def __init__(self, capacity: int = DEFAULT_MEMORY_BYTES):
        super().__init__(capacity)

    def stats(self) -> dict:
        counts = super().stats()
        return {"hits": counts.hits, "misses": counts.misses, "bytes": counts.bytes, "capacity": counts.capacity}


MEMORY = MemoryChunks()

_stores: dict[tuple[str, int, str | None], object] = {}
_stores_lock = threading.Lock()


def disk_store(root: str | None, max_bytes: int, key_file: str | None = None):
    """The shared ``DiskStore(root, max_bytes, namespace="bytes", key_file)`` for ``--cache-dir`` (one per
    process, directory and key), or None when no directory is set or the store cannot be made (a folder this
    user must not trust included: its bytes are then fetched, never read from it). Its entries are
    authenticated like the decoded groups' (``auth.py``)."""
    if not root:
        return None
    with _stores_lock:
        store = _stores.get((root, max_bytes, key_file))
        if store is None:
            try:
                from ckptfs.cache.disk import DiskStore

                store = DiskStore(root, max_bytes, namespace="bytes", key_file=key_file)
            except Exception as exc:  # noqa: BLE001 - a cache that cannot open costs speed, not the read
                log.warning("remote byte cache in %s not used: %s", root, exc)
                store = False
            _stores[(root, max_bytes, key_file)] = store
    return store or None


def _fresh_locks_in_child() -> None:
    # a read-ahead thread of the parent may have held a lock at fork; in the child nobody would release it
    global _stores_lock
    MEMORY.reset_lock()
    _stores_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_in_child)


class ChunkCache:
    """Memory first, then the disk store (when given); what is found on disk is promoted to memory."""

    def __init__(self, disk=None, memory: MemoryChunks = MEMORY):
        self.memory = memory
        self.disk = disk

    def get(self, key: str) -> bytes | None:
        data = self.memory.get(key)
        if data is not None or self.disk is None:
            return data
        try:
            data = self.disk.get(key)
        except Exception as exc:  # noqa: BLE001 - see the module docstring
            log.debug("disk cache get failed: %s", exc)
            return None
        if data is not None:
            data = bytes(data)
            self.memory.put(key, data)
        return data

    def has(self, key: str) -> bool:
        """In memory or on disk (read-ahead must not fetch what the disk store holds)."""
        if key in self.memory:
            return True
        try:
            return self.disk is not None and bool(self.disk.contains(key))
        except Exception:  # noqa: BLE001 - see the module docstring
            return False

    def put(self, key: str, data: bytes, persist: bool = True) -> None:
        self.memory.put(key, data)
        if persist and self.disk is not None:
            try:
                self.disk.put(key, data)
            except Exception as exc:  # noqa: BLE001 - see the module docstring
                log.debug("disk cache put failed: %s", exc)
