"""Reads of stored bytes answered in C, without Python: the table behind ``ckptfs/fs/_direct.c``.

A mount's ``.raw`` files and passed-through files (the checkpoint's own files, a folder's config.json) are
plain ranges of local files: a read of them is one ``pread``. Answering it through mfusepy costs a ctypes
callback, the GIL and a few Python frames per request, which on a 1 MiB request is as much as the copy
itself. So at ``open`` such a file's handle is registered with the C helper (the source's pinned
descriptor, the range, the file's size and mtime as pinned at open); the mfusepy binding installs the
helper's read callback in libfuse's operations (fs/binding.py); a read of a registered handle is then served
on libfuse's thread without taking the GIL, and every other read goes to the Python callback as before.
While registered, the handle counts as a user of its source's descriptor (the pool does not close a source
in use, so the daemon holds one descriptor per file, as before); ``release`` unregisters it, which returns
once no read of the handle is in progress, and only then lets the descriptor go.

Registered only where the bytes are the source's, read as they are:

- the view's ``plain_range()`` gives ``(source, offset)``: a ``.npy``, a JSON file, a merged ``model.gguf``
  or a virtual safetensors file is built or joined, and stays in Python;
- the source is a plain ``FileSource`` (local file). Wrapped sources are not: a manifest-checked source
  (``--manifest``: every read is verified) or a mirror; nor a remote one (no descriptor);
- the range lies inside the file as pinned (a tensor whose bytes the file does not hold, a damaged one, is
  read by Python, which answers EIO with its log line).

In C, a read that ends short, fails, or finds the file's size or mtime changed since open is handed back to
Python, which answers it as it always does (an EIO with its log line and error counter): the C path only
ever answers what Python would have answered with the same bytes.

Counters stay exact: the helper counts the reads and bytes it served per file kind (atomics); ``snapshot``
gives them for ``ckptfs_read_bytes_total{kind}`` and the stats. ``CKPTFS_C_READS=0`` turns the path off
(every read in Python, as before: for A/B measurement). One mount per process (the daemon): the helper's
table and counters are the process's.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ckptfs.core.errors import CheckpointError
from ckptfs.sources.local import FileSource

try:
    from ckptfs.fs import _direct  # optional C helper (setup.py); without it every read is Python's
except ImportError:
    _direct = None

log = logging.getLogger(__name__)

ENV = "CKPTFS_C_READS"


def enabled_from_env() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class DirectReads:
    """The daemon's side of the C read path: which handles are registered, and the counters' kind names."""

    def __init__(self, enabled: bool | None = None):
        self.enabled = (enabled_from_env() if enabled is None else enabled) and _direct is not None
        self.active = False  # set once the binding installed the C callback (mfusepy only)
        self._kinds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._sources: dict[int, FileSource] = {}  # registered handle -> the source whose descriptor it reads

    def install(self, python_read_address: int, fh_offset: int) -> int:
        """The C read callback's address, falling back to ``python_read_address`` (mfusepy's read callback)
        for every read it does not serve; ``fh_offset``: where ``fh`` lies in libfuse's fuse_file_info."""
        address = _direct.install(python_read_address, fh_offset)
        self.active = True
        return address

    def register(self, fh: int, view: Any, kind: str) -> bool:
        """Serve ``fh``'s reads in C when ``view`` is a plain range of a local file (see the module docstring).
        Never fails the open: whatever goes wrong here, the reads are Python's."""
        if not self.active:
            return False
        try:
            return self._register(fh, view, kind)
        except Exception:  # noqa: BLE001 - e.g. a source that cannot be opened: its read will say so
            log.debug("reads of handle %d left to Python", fh, exc_info=True)
            return False

    def _register(self, fh: int, view: Any, kind: str) -> bool:
        plain = view.plain_range()
        if plain is None:
            return False
        source, base = plain
        if type(source) is not FileSource or base < 0 or base + view.size > source.size:
            return False
        slot = self._slot(kind)
        if slot is None:
            return False
        try:
            # the pinned descriptor, in use until unregister: the pool does not close a source in use
            fd = source._acquire_fd()
        except CheckpointError:  # replaced since it was pinned: Python's read of it says so
            return False
        _, _, st_size, mtime_ns, _ = source.identity
        if not _direct.register(fh, fd, base, view.size, st_size, mtime_ns, slot):
            source._release_fd()
            return False
        with self._lock:
            self._sources[fh] = source
        return True

    def unregister(self, fh: int) -> None:
        if not self.active:
            return
        with self._lock:
            source = self._sources.pop(fh, None)
        if source is not None:
            _direct.unregister(fh)  # returns once no read of fh uses the descriptor
            source._release_fd()

    def _slot(self, kind: str) -> int | None:
        slot = self._kinds.get(kind)
        if slot is None:
            with self._lock:
                slot = self._kinds.get(kind)
                if slot is None:
                    if len(self._kinds) >= _direct.KINDS:
                        return None
                    slot = self._kinds[kind] = len(self._kinds)
        return slot

    def snapshot(self) -> dict[str, Any]:
        """``{"reads": n, "bytes": n, "by_kind": {kind: {"reads", "bytes"}}, "handed_back": n, "handles": n}``:
        what the C path served since the mount (zeros when it is off)."""
        if not self.active:
            return {"enabled": False, "reads": 0, "bytes": 0, "by_kind": {}, "handed_back": 0, "handles": 0}
        per_slot, handed_back, handles = _direct.counters()
        by_kind = {kind: {"reads": per_slot[slot][0], "bytes": per_slot[slot][1]}
                   for kind, slot in list(self._kinds.items())}
        return {"enabled": True, "reads": sum(v["reads"] for v in by_kind.values()),
                "bytes": sum(v["bytes"] for v in by_kind.values()), "by_kind": by_kind,
                "handed_back": handed_back, "handles": handles}

