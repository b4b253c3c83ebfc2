"""Files as byte ranges: every file a mount serves is a View with an exact ``size`` and one way to fill a
range of it, ``read_into``.

``read_into(offset, target)`` writes exactly ``min(len(target), self.size - offset)`` bytes into ``target``
(short only at end of file: in cached FUSE mode a short read is taken as end-of-file and would shrink the
file) and returns that number, or raises ``CheckpointError`` when the bytes it needs are missing; ``read``
is the same into a buffer of its own. Views know nothing of FUSE; the same objects back the Python API's
tests and the mount. Every read takes the caller's ``scope`` (``ckptfs.core.reads``: a mount's deadline, a
stream its decode-ahead decides) and hands it to the byte sources it reads.
"""

from __future__ import annotations

import functools
import io
import threading
from collections.abc import Callable, Hashable

import numpy as np

from ckptfs.ahead.decode import NOTHING_AHEAD, Ahead
from ckptfs.engine.blocks import TensorData
from ckptfs.engine.values import ComputedSegment, TensorValues
from ckptfs.core.descriptors import TensorInfo
from ckptfs.core.errors import CheckpointError
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.sources import SourcePool


class View:
    size: int
    #: Whether a sequential reader of this view gains from read-ahead (``ahead`` says what lies ahead).
    reads_ahead = False
    #: The view a reader of this one's end is likely to read next (the next tensor's file: tensor-aware
    #: read-ahead continues into it), or None. A callable, so that it is made only when asked for.
    following: Callable[[], View | None] = staticmethod(lambda: None)
    #: What names this file among the files of its kind (views of the same file have the same slot), or None.
    slot: Hashable | None = None
    #: Whether ``read_into`` decodes what it misses straight into the reply, on every core (a ``.npy``):
    #: the mount's read-ahead then only advises (``ckptfs.ahead.decode``).
    decodes_into_reply = False

    def read(self, offset: int, size: int, *, scope: ReadScope = NOTHING_SAID) -> bytes:
        """Bytes [offset, offset + size) (fewer only at the end of the file): ``read_into`` a buffer of its
        own, for a caller that wants the bytes (copying a file out, a library read)."""
        offset, size = self._clip(offset, size)
        buf = bytearray(size)
        done = self.read_into(offset, memoryview(buf), scope=scope) if size else 0
        return bytes(memoryview(buf)[:done])

    def read_into(self, offset: int, target: memoryview, keep: bool = True, *,
                  scope: ReadScope = NOTHING_SAID) -> int:  # pragma: no cover - interface
        """Bytes [offset, offset + len(target)) written into ``target`` (a writable byte buffer: the mount's
        reads fill libfuse's own buffer), each byte once; the number written. ``keep=False``: what is decoded
        for this read need not stay in the block cache (a sequential stream's bytes stay in the kernel's page
        cache; the groups its next read shares are kept anyway)."""
        raise NotImplementedError

    def ahead(self, start: int, stop: int) -> Ahead:
        """What bytes [start, stop) of this file will need: see :class:`Ahead`."""
        return NOTHING_AHEAD

    def plain_segments(self) -> list[tuple[int, int, object, int]] | None:
        """This file's bytes as pieces that are read, not made: ``(start, length, what, offset)`` in file order,
        covering the file, where ``what`` is a byte source of the pool (its bytes from ``offset``, as they
        are), a ``bytes`` object (its bytes from ``offset``), None (zeros) or a :class:`ComputedSegment`
        (values computed from its codes' source row by row; ``offset`` where they start). None for a file
        whose bytes are decoded or converted otherwise. The mount answers reads of such files in C
        (``ckptfs.fuse.direct``)."""
        return None

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

    def __init__(self, build: Callable[[], bytes]) -> None:
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
    def size(self) -> int:  # type: ignore[override]  # View.size is set at construction; here: once built
        return len(self.data)

    def read_into(self, offset: int, target: memoryview, keep: bool = True, *, scope: ReadScope = NOTHING_SAID) -> int:
        offset, size = self._clip(offset, len(target))
        target[:size] = self.data[offset: offset + size]
        return size


class RawView(View):
    """A tensor's stored bytes, exactly as in its source file."""

    reads_ahead = True

    def __init__(self, info: TensorInfo, sources: SourcePool) -> None:
        self.info = info
        self.size = info.stored_nbytes
        self._sources = sources

    def ahead(self, start: int, stop: int) -> Ahead:
        return Ahead(advise=((self.info.source, self.info.offset + start, stop - start),))

    def plain_segments(self) -> list[tuple[int, int, object, int]] | None:
        return [(0, self.size, self._sources.get(self.info.source), self.info.offset)]

    def read_into(self, offset: int, target: memoryview, keep: bool = True, *, scope: ReadScope = NOTHING_SAID) -> int:
        offset, size = self._clip(offset, len(target))
        if size:
            try:
                self._sources.get(self.info.source).pread_into(self.info.offset + offset, target[:size], scope=scope)
            except CheckpointError as exc:
                # the source only knows byte ranges; the one log line of a failed read must say which tensor
                raise exc.about_tensor(self.info.name) from None
        return size


class FileView(View):
    """A whole file passed through unchanged (config.json of a model folder, the checkpoint's own GGUF),
    read through the checkpoint's pool; a sequential reader's next bytes are advised to its source."""

    reads_ahead = True

    def __init__(self, path: str, sources: SourcePool) -> None:
        self.path = path
        self._sources = sources
        self.size = sources.get(path).size

    def ahead(self, start: int, stop: int) -> Ahead:
        return Ahead(advise=((self.path, start, stop - start),))

    def plain_segments(self) -> list[tuple[int, int, object, int]] | None:
        return [(0, self.size, self._sources.get(self.path), 0)]

    def read_into(self, offset: int, target: memoryview, keep: bool = True, *, scope: ReadScope = NOTHING_SAID) -> int:
        offset, size = self._clip(offset, len(target))
        if size:
            self._sources.get(self.path).pread_into(offset, target[:size], scope=scope)
        return size


class HeaderBodyView(View):
    """A file made of a header held in memory and a body whose bytes ``body_into`` writes where they are asked
    for (a .npy, a virtual safetensors or GGUF file)."""

    header: bytes

    def read_into(self, offset: int, target: memoryview, keep: bool = True, *, scope: ReadScope = NOTHING_SAID) -> int:
        """The header's part copied, the body's written by ``body_into`` (each byte once)."""
        offset, size = self._clip(offset, len(target))
        hlen, done = len(self.header), 0
        if size and offset < hlen:
            done = min(size, hlen - offset)
            target[:done] = self.header[offset: offset + done]
        if size > done:
            self.body_into(offset + done - hlen, np.frombuffer(target, np.uint8, size - done, done), keep, scope)
        return size

    def body_into(self, d0: int, target: np.ndarray, keep: bool = True,
                  scope: ReadScope = NOTHING_SAID) -> None:  # pragma: no cover - interface
        """Body bytes [d0, d0 + len(target)) written into ``target`` (uint8; ``keep``: see
        ``View.read_into``)."""
        raise NotImplementedError


class NpyView(HeaderBodyView):
    """A real .npy file of the decoded tensor: np.save's header, then the values in C order.

    Only the elements under the requested bytes are decoded (through its ``TensorValues``: a stored
    tensor's blocks, a packed view's tiles of rows).
    """

    reads_ahead = True

    def __init__(self, data: TensorValues) -> None:
        self.data = data
        self.decodes_into_reply = data.decodes_into_reply
        self.header = npy_header(data.info.shape, data.dtype)
        self.itemsize = data.dtype.itemsize
        self.size = len(self.header) + data.n_elements * self.itemsize

    def ahead(self, start: int, stop: int) -> Ahead:
        """The stored blocks behind bytes [start, stop), and their block groups as decoding jobs (none for a
        type served as its stored bytes)."""
        data, hlen, item = self.data, len(self.header), self.itemsize
        e0 = max(0, start - hlen) // item
        e1 = min(data.n_elements, -(-max(0, stop - hlen) // item))
        if e1 <= e0:
            return NOTHING_AHEAD
        offset, nbytes = data.stored_range(e0, e1)
        advise = ((data.info.source, offset, nbytes),)
        if data.direct:
            return Ahead(advise)
        group_elements = data.group_blocks * data.info.block_elements
        group_bytes = group_elements * item
        jobs = tuple((hlen + (g + 1) * group_bytes, group_bytes, functools.partial(data.decode_group, g))
                     for g in range(data.group_of_element(e0), data.group_of_element(e1 - 1) + 1))
        return Ahead(advise, jobs)

    def plain_segments(self) -> list[tuple[int, int, object, int]] | None:
        """A type served as its stored bytes (``direct``: F32, F16, ... little-endian): the header, then the
        tensor's bytes in its source, as they are; values computed from codes (``computed_codes``): the
        header, then those values computed from the codes."""
        data, hlen = self.data, len(self.header)
        if isinstance(data, TensorData) and data.direct:
            return [(0, hlen, self.header, 0), (hlen, self.size - hlen, data.source, data.info.offset)]
        codes = data.computed_codes() if data.dtype in (np.float32, np.float16) else None
        if codes is None:
            return None
        return [(0, hlen, self.header, 0), (hlen, self.size - hlen, ComputedSegment(codes, data.dtype.name), codes.offset)]

    def body_into(self, d0: int, target: np.ndarray, keep: bool = True, scope: ReadScope = NOTHING_SAID) -> None:
        """The values decoded straight into the reply (``TensorValues.bytes_into``: a stored tensor's block
        groups, a packed view's tiles of rows)."""
        self.data.bytes_into(d0, target, keep, scope=scope)
