"""The files a mount shows: file name -> View, built from a Checkpoint. Knows nothing of FUSE.

For every tensor: ``STEM.raw`` and ``STEM.meta.json``, and ``STEM.npy`` when the tensor can be decoded
(unknown storage types are raw-only); then ``metadata.json``; then a model folder's other files, passed
through. Tensor files win a name clash; a clashing pass-through file gets ``~2``, ``~3``... before its
extension, so nothing is dropped. Views are created on first lookup; JSON is built on first access.
"""

from __future__ import annotations

import os
import threading

from .checkpoint import Checkpoint, Tensor
from .jsonutil import dumps_bytes
from .names import assign_stems
from .views import BytesView, FileView, NpyView, RawView, View, npy_header

METADATA_FILE = "metadata.json"
#: A file's size is a signed 64-bit off_t.
MAX_FILE_BYTES = (1 << 63) - 1


def _npy_fits_in_a_file(tensor: Tensor) -> bool:
    """False for a tensor that decodes to more than a file can hold (a hostile header: say 2^62 Q4_0 elements
    are 2^64 bytes of float32). Its .npy is left out: listed, its size would wrap around to the header's."""
    if tensor.nbytes < 1 << 62:
        return True
    return len(npy_header(tensor.shape, tensor.dtype)) + tensor.nbytes <= MAX_FILE_BYTES


def _numbered(name: str, n: int) -> str:
    stem, dot, ext = name.rpartition(".")
    return f"{stem}~{n}.{ext}" if dot and stem else f"{name}~{n}"


class MountTree:
    """A flat directory of views over one checkpoint."""

    def __init__(self, checkpoint: Checkpoint):
        self.checkpoint = checkpoint
        self._entries: dict[str, tuple[str, object]] = {}
        stems = assign_stems([t.name for t in checkpoint.tensors])
        for tensor, stem in zip(checkpoint.tensors, stems):
            if tensor.decodable and _npy_fits_in_a_file(tensor):
                self._entries[stem + ".npy"] = ("npy", tensor)
            self._entries[stem + ".raw"] = ("raw", tensor)
            self._entries[stem + ".meta.json"] = ("meta", tensor)
        self._entries[METADATA_FILE] = ("metadata", None)
        for name, path in sorted(checkpoint.passthrough.items()):
            final, n = name, 1
            while final in self._entries:
                n += 1
                final = _numbered(name, n)
            self._entries[final] = ("file", path)
        self.mtime_ns = max((os.stat(f).st_mtime_ns for f in checkpoint.files), default=0)
        self._views: dict[str, View] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def view(self, name: str) -> View | None:
        """The view serving file ``name``, or None if there is no such file."""
        view = self._views.get(name)
        if view is not None:
            return view
        entry = self._entries.get(name)
        if entry is None:
            return None
        with self._lock:
            view = self._views.get(name)
            if view is None:
                view = self._views[name] = self._make_view(*entry)
        return view

    def _make_view(self, kind: str, target) -> View:
        ck = self.checkpoint
        if kind == "npy":
            return NpyView(target.data)
        if kind == "raw":
            return RawView(target.info, ck.sources)
        if kind == "meta":
            tensor: Tensor = target
            return BytesView(lambda: dumps_bytes(tensor.meta))
        if kind == "metadata":
            return BytesView(self._metadata_json)
        return FileView(target, ck.sources)

    def _metadata_json(self) -> bytes:
        metadata = self.checkpoint.metadata
        value_of = getattr(metadata, "peek", metadata.__getitem__)  # lazy mappings: don't keep decoded copies
        return dumps_bytes({key: value_of(key) for key in metadata})

    def stats(self) -> dict:
        """Counters for monitoring and benchmarks (cache hits/misses, open files)."""
        return {"cache": self.checkpoint.cache.stats().as_dict(), "open_files": self.checkpoint.sources.open_count(),
                "files": len(self._entries)}
