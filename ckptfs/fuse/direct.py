"""Reads of stored bytes answered in C, without Python: the table behind ``ckptfs/fuse/_direct.c``.

A mount's ``.raw`` files and passed-through files (the checkpoint's own files, a folder's config.json) are
plain ranges of local files; the ``.npy`` of a type served as stored (F32, F16, ...) is a header held in
memory, then the stored bytes; a split GGUF set's merged ``model.gguf`` is a header, then ranges of the
shards with zeros between them: a read of any of them is a ``pread`` or two. Answering it
through mfusepy costs a ctypes callback, the GIL and a few Python frames per request, which on a 1 MiB
request is as much as the copy itself. So at ``open`` such a file's handle is registered with the C helper
(the view's ``plain_segments()``, packed: the sources' pinned descriptors with their pinned size and mtime,
the memory's address); the mfusepy binding installs the helper's read callback in libfuse's operations
(fuse/binding.py); a read of a registered handle is then served on libfuse's thread without taking the GIL,
and every other read goes to the Python callback as before. While registered, the handle counts as a user
of its sources' descriptors (the pool does not close a source in use, so the daemon holds one descriptor per
file, as before) and holds the memory segments' bytes objects; ``release`` unregisters it, which returns
once no read of the handle is in progress, and only then lets them go.

The ``.npy`` of a scaled-codes view (FP8 and int8 codes times a scale per block: ``packed/scaled.py``) is a
header, then values computed from the codes row by row: its data segment is *computed*
(``engine.values.ComputedSegment``), registered with a program (the code table, the scale grid as float32,
its geometry, the output type) whose arithmetic is the layer's kernel's (``quant/scaled_rows.h``, included by
both C extensions). A read there preads the codes of the rows it touches, with every check of a plain read,
and computes them into the reply: no Python, no decode engine, no cache, since computing a row costs less
than looking one up. Such a handle also holds the program and its arrays. Views that need the decode engine
keep it: other schemes, a layer with ``g_idx``, a mount with shared tiers (their decoded tiles are what other
daemons read), the numpy backend (``CKPTFS_NO_NATIVE=1``).

Registered only where the bytes are read as they are or computed so:

- the view gives ``plain_segments()``: the ``.npy`` of another decoded type, a JSON file or a virtual
  safetensors file is decoded, built or converted per read, and stays in Python;
- every source is a plain ``FileSource`` (local file), or a remote source whose file the ``--cache-dir``
  store holds complete (sealed) (``RemoteSource.local_copy``: the store's file keeps the remote file's
  offsets). The store checks such a file against its MACs once per process, from the first open, on threads
  of its own, chunk by chunk from the start; the copy comes with a *gate*, the address of how many bytes the
  check has passed, and C reads only bytes before it: a stream from the first open is served in C right
  behind the check, a read far ahead of it (or of a file that failed it) is Python's, which checks the
  chunks it reads itself. Wrapped sources are not: a manifest-checked source (``--manifest``:
  every read is verified) or a mirror; nor a remote file only partly stored;
- every range lies inside its file as pinned (a tensor whose bytes the file does not hold, a damaged one, is
  read by Python, which answers EIO with its log line).

In C, a read that ends short, fails, finds a file's size or mtime changed since open, or a chunk other than
it served before (the file's served checksums, sources/served.py: recorded at a chunk's first read, compared
once the ctime moved) is handed back to Python, which answers it as it always does (an EIO with its log line and error counter): the C path only
ever answers what Python would have answered with the same bytes.

Counters stay exact: the helper counts the reads and bytes it served per file kind (atomics); ``snapshot``
gives them for ``ckptfs_read_bytes_total{kind}`` and the stats. ``CKPTFS_C_READS=0`` turns the path off
(every read in Python, as before: for A/B measurement). One mount per process (the daemon): the helper's
table and counters are the process's.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
import threading
from typing import Any

import numpy as np

from ckptfs.core.errors import CheckpointError
from ckptfs.engine.values import ComputedSegment, PairedNibbles
from ckptfs.sources.local import FileSource
from ckptfs.sources.served import SUM_CHUNK
from ckptfs.sources.base import HasLocalCopy

try:
    from ckptfs.fuse import _direct  # optional C helper (setup.py); without it every read is Python's
except ImportError:
    _direct = None  # type: ignore[assignment]  # not built: the Python path serves

log = logging.getLogger(__name__)

ENV = "CKPTFS_C_READS"
#: One segment as ``_direct.c`` reads it (``struct segment``): start, length, fd (-1: memory or zeros),
#: offset in the file, the file's pinned size and mtime, the address of memory bytes (0: zeros), the address
#: of the file's check gate (0: none), the address of the file's served checksums (0: none), the address of a
#: computed segment's program (0: the file's bytes as they are).
SEGMENT = struct.Struct("<QQqqqqQQQQ")
#: A computed segment's program as ``_direct.c`` reads it (``struct program``): kind (1: scaled codes, 2: paired
#: nibbles), output type (0 float32, 1 float16, 2 bfloat16), rows, width, the addresses of the code table (or
#: pairs), the scales (paired nibbles: the nested second-level scales), the zeros (0: none) and the scale table
#: (0: none), the scales' rows (paired nibbles: blocks), groups, block width, rows per matrix, grid rows per
#: matrix, block height; for paired nibbles, the scales' file offset, their kind, the nested block and count and
#: the nested offset (float32).
PROGRAM = struct.Struct("<qqqqQQQQqqqqqqqqqqf4x")
#: how a paired-nibbles program's block scales are stored (``PairedNibbles.scale_kind``)
SCALE_KINDS = {"f32": 1, "table": 2, "nested": 3}
OUT_TYPES = {"float32": 0, "float16": 1, "bfloat16": 2}


def enabled_from_env() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class DirectReads:
    """The daemon's side of the C read path: which handles are registered, and the counters' kind names."""

    def __init__(self, enabled: bool | None = None):
        self.enabled = (enabled_from_env() if enabled is None else enabled) and _direct is not None
        self.active = False  # set once the binding installed the C callback (mfusepy only)
        self._kinds: dict[str, int] = {}
        self._lock = threading.Lock()
        #: registered handle -> (the sources whose descriptors it reads, the memory it reads: bytes objects,
        #: computed segments' programs and their tables)
        self._held: dict[int, tuple[list[FileSource], list[object]]] = {}

    def install(self, python_read_address: int, fh_offset: int) -> int:
        """The C read callback's address, falling back to ``python_read_address`` (mfusepy's read callback)
        for every read it does not serve; ``fh_offset``: where ``fh`` lies in libfuse's fuse_file_info."""
        if SEGMENT.size != _direct.SEGMENT_SIZE:  # a helper built from another version of _direct.c
            raise RuntimeError(f"ckptfs.fuse._direct packs {_direct.SEGMENT_SIZE}-byte segments, not {SEGMENT.size}")
        if PROGRAM.size != _direct.PROGRAM_SIZE:
            raise RuntimeError(f"ckptfs.fuse._direct packs {_direct.PROGRAM_SIZE}-byte programs, not {PROGRAM.size}")
        if SUM_CHUNK != _direct.SUM_CHUNK:
            raise RuntimeError(f"ckptfs.fuse._direct checksums {_direct.SUM_CHUNK}-byte chunks, not {SUM_CHUNK}")
        address = _direct.install(python_read_address, fh_offset)
        self.active = True
        return address

    def register(self, fh: int, view: Any, kind: str) -> bool:
        """Serve ``fh``'s reads in C when ``view``'s bytes are plain pieces of local files and memory (see the
        module docstring). Never fails the open: whatever goes wrong here, the reads are Python's."""
        if not self.active:
            return False
        try:
            return self._register(fh, view, kind)
        except Exception:  # e.g. a source that cannot be opened: its read will say so
            log.debug("reads of handle %d left to Python", fh, exc_info=True)
            return False

    def _register(self, fh: int, view: Any, kind: str) -> bool:
        segments = view.plain_segments() if view.size > 0 else None
        if not segments:
            return False
        slot = self._slot(kind)
        if slot is None:
            return False
        copies: dict[int, tuple[int, int, int, int]] = {}  # remote sources' complete local copies
        for _, length, what, offset in segments:
            if isinstance(what, (bytes, type(None))):
                continue
            source, extent = _file_range(what, length)
            if type(source) is not FileSource:
                copy = copies.get(id(source)) or _local_copy(source)
                if copy is None:
                    return False  # wrapped (checked, mirrored), or remote with no complete local copy
                copies[id(source)] = copy
            if offset < 0 or offset + extent > source.size:
                return False  # bytes the file does not hold
        held: list[FileSource] = []  # the sources whose descriptors the handle uses, acquired once each
        kept: list[object] = []      # what C reads in memory: bytes segments, programs and their tables
        fds: dict[int, int] = {}
        packed = bytearray()
        registered = False
        try:
            for start, length, what, offset in segments:
                if what is None:
                    packed += SEGMENT.pack(start, length, -1, 0, 0, 0, 0, 0, 0, 0)
                    continue
                if isinstance(what, bytes):
                    if offset < 0 or offset + length > len(what):
                        return False
                    packed += SEGMENT.pack(start, length, -1, 0, 0, 0, _address(what) + offset, 0, 0, 0)
                    kept.append(what)
                    continue
                program = 0
                if isinstance(what, ComputedSegment):
                    program = _program(what, kept)
                    what = what.codes.source
                if id(what) in copies:  # the store's descriptor and gate, kept for the process: nothing to hold
                    fd, st_size, mtime_ns, gate = copies[id(what)]
                    packed += SEGMENT.pack(start, length, fd, offset, st_size, mtime_ns, 0, gate, 0, program)
                else:
                    pinned = fds.get(id(what))
                    if pinned is None:
                        # the pinned descriptor, in use until unregister: the pool does not close a source in use
                        pinned = fds[id(what)] = what._acquire_fd()
                        held.append(what)
                    _, _, st_size, mtime_ns, _ = what.identity
                    # its served checksums: recorded and compared as Python's reads do (sources/served.py)
                    packed += SEGMENT.pack(start, length, pinned, offset, st_size, mtime_ns, 0, 0, what.sums.address,
                                           program)
            registered = _direct.register(fh, slot, view.size, bytes(packed))
        except CheckpointError:  # a source replaced since it was pinned: Python's read of it says so
            return False
        finally:
            if not registered:
                for source in held:
                    source._release_fd()
        if registered:
            with self._lock:
                self._held[fh] = (held, kept)
        return registered

    def unregister(self, fh: int) -> None:
        if not self.active:
            return
        with self._lock:
            held = self._held.pop(fh, None)
        if held is not None:
            _direct.unregister(fh)  # returns once no read of fh uses its descriptors or memory
            for source in held[0]:
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
        per_slot, handed_back, handles, _ = _direct.counters()
        by_kind = {kind: {"reads": per_slot[slot][0], "bytes": per_slot[slot][1]}
                   for kind, slot in list(self._kinds.items())}
        return {"enabled": True, "reads": sum(v["reads"] for v in by_kind.values()),
                "bytes": sum(v["bytes"] for v in by_kind.values()), "by_kind": by_kind,
                "handed_back": handed_back, "handles": handles}

    def short_replies(self) -> int:
        """Answers of registered handles with fewer bytes than due before the end of the file, turned into EIO
        by the C helper (0 unless there is a bug: see ``short_replies`` in the mount's stats)."""
        return _direct.counters()[3] if self.active else 0


def _file_range(what: Any, length: int) -> tuple[Any, int]:
    """The source a segment reads and how many of its bytes (from the segment's offset): a computed segment's
    codes, a byte per value or per two."""
    if isinstance(what, ComputedSegment):
        values = what.codes.rows * what.codes.width
        return what.codes.source, (values + 1) // 2 if isinstance(what.codes, PairedNibbles) else values
    return what, length


def _program(segment: ComputedSegment, kept: list[object]) -> int:
    """The address of ``segment``'s packed program; the program and the arrays it points at are appended to
    ``kept`` (held while the handle is registered)."""
    codes = segment.codes
    out = OUT_TYPES[segment.dtype]
    if isinstance(codes, PairedNibbles):
        pairs = np.ascontiguousarray(codes.pairs, np.float32)
        table = None if codes.table is None else np.ascontiguousarray(codes.table, np.float32)
        nested = None if codes.nested is None else np.ascontiguousarray(codes.nested, np.float32).reshape(-1)
        kind = SCALE_KINDS[codes.scale_kind]
        if pairs.size != 512 or (table is not None and table.size != 256) or (kind > 1 and table is None) \
                or (kind == 3 and nested is None):
            raise ValueError("a computed segment's tables do not fit its program")
        program = PROGRAM.pack(2, out, codes.rows, codes.width, pairs.ctypes.data,
                               0 if nested is None else nested.ctypes.data, 0,
                               0 if table is None else table.ctypes.data, codes.blocks, 1, codes.block, 1, 1, 1,
                               codes.scale_offset, kind, codes.nested_block, 0 if nested is None else nested.size,
                               codes.nested_offset)
        kept += [program, pairs, table, nested]
        return _address(program)
    table = np.ascontiguousarray(codes.table, np.float32)
    scales = np.ascontiguousarray(codes.scales, np.float32)
    zeros = None if codes.zeros is None else np.ascontiguousarray(codes.zeros, np.float32)
    if table.size != 256 or scales.ndim != 2 or not len(scales) or (zeros is not None and zeros.shape != scales.shape):
        raise ValueError("a computed segment's tables do not fit its program")
    program = PROGRAM.pack(1, out, codes.rows, codes.width, table.ctypes.data, scales.ctypes.data,
                           0 if zeros is None else zeros.ctypes.data, 0, len(scales), scales.size // len(scales),
                           codes.block_width, codes.matrix_rows, codes.grid_rows, codes.block_height, 0, 0, 0, 0, 0.0)
    kept += [program, table, scales, zeros]
    return _address(program)


def _local_copy(source: Any) -> tuple[int, int, int, int] | None:
    """A remote source's complete local copy in the ``--cache-dir`` store (``RemoteSource.local_copy``: its
    bytes at the remote file's own offsets, and its check gate), else None. Asking starts the store's one
    check of the copy in this process."""
    if not isinstance(source, HasLocalCopy):
        return None
    return source.local_copy()


def _address(data: bytes) -> int:
    """Where a bytes object's own buffer lies (ctypes hands C that buffer itself for ``c_char_p``, no copy);
    valid while the object lives, and a bytes object never moves or changes."""
    address = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    assert address is not None  # a bytes object's buffer is never NULL
    return address
