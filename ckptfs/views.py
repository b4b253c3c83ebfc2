"""Files as byte ranges: every file a mount serves is a View with an exact ``size`` and ``read``.

``read(offset, size)`` returns exactly ``min(size, self.size - offset)`` bytes (short only at end of file:
in cached FUSE mode a short read is taken as end-of-file and would shrink the file), or raises
``CheckpointError`` when the bytes it needs are missing. Views know nothing of FUSE; the same objects back
the Python API's tests and the mount.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable

import numpy as np

from .blocks import TensorData
from .descriptors import TensorInfo
from .errors import CheckpointError
from .sources import SourcePool


class View:
    size: int

    def read(self, offset: int, size: int) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError

    def _clip(self, offset: int, size: int) -> tuple[int, int]:
        offset = max(0, offset)
        return offset, max(0, min(size, self.size - offset))


def npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The .npy header np.save writes for a C-order array of this shape and dtype (version 1.0, or 2.0
    only when the header needs it), built with numpy's own writer so the bytes match np.save exactly."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
              "shape": tuple(int(d) for d in shape)}
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, header)
    except ValueError:
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, header)
    return buf.getvalue()


class BytesView(View):
    """A small file held in memory, built on first access (metadata.json, NAME.meta.json)."""

    def __init__(self, build: Callable[[], bytes]):
        self._build = build
        self._data: bytes | None = None
        self._lock = threading.Lock()

    @property
    def data(self) -> bytes:
        if self._data is None:
            with self._lock:
                if self._data is None:
                    self._data = self._build()
        return self._data

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self, offset: int, size: int) -> bytes:
        offset, size = self._clip(offset, size)
        return self.data[offset: offset + size]


class RawView(View):
    """A tensor's stored bytes, exactly as in its source file."""

    def __init__(self, info: TensorInfo, sources: SourcePool):
        self.info = info
        self.size = info.stored_nbytes
        self._sources = sources

    def read(self, offset: int, size: int) -> bytes:
        offset, size = self._clip(offset, size)
        if size == 0:
            return b""
        try:
            return self._sources.get(self.info.source).pread(self.info.offset + offset, size)
        except CheckpointError as exc:
            # the source only knows byte ranges; the one log line of a failed read must say which tensor
            raise exc.about_tensor(self.info.name) from None


class FileView(View):
    """A whole non-tensor file passed through unchanged (config.json of a model folder)."""

    def __init__(self, path: str, sources: SourcePool):
        self.path = path
        self._sources = sources
        self.size = sources.get(path).size

    def read(self, offset: int, size: int) -> bytes:
        offset, size = self._clip(offset, size)
        return self._sources.get(self.path).pread(offset, size) if size else b""


class NpyView(View):
    """A real .npy file of the decoded tensor: np.save's header, then the values in C order.

    Only the elements under the requested bytes are decoded (through ``TensorData``, block by block).
    """

    def __init__(self, data: TensorData):
        self.data = data
        self.header = npy_header(data.info.shape, data.dtype)
        self.itemsize = data.dtype.itemsize
        self.size = len(self.header) + data.n_elements * self.itemsize

    def read(self, offset: int, size: int) -> bytes:
        offset, size = self._clip(offset, size)
        if size == 0:
            return b""
        end = offset + size
        hlen = len(self.header)
        parts = []
        if offset < hlen:
            parts.append(self.header[offset: min(end, hlen)])
        if end > hlen:
            parts += self.data.byte_segments(max(offset, hlen) - hlen, end - hlen)
        # one copy into the answer; none when the answer already is one bytes object (a direct type)
        return parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)
