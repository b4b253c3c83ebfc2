"""Many tensors (or row ranges) decoded at once: coalesced reads, decoding on every core, straight into place.

A request is (tensor, element range, destination). The planner cuts each request into *runs* of whole blocks
bounded in stored bytes and in decoded elements, then joins runs that lie back to back in one file (the many
small norms and biases of a real model sit between the big matrices) into *pieces*: one ``pread`` each. A
thread pool works through the pieces; the C kernels and numpy's loops release the GIL, so decoding spreads
over the cores while other threads wait on reads.

Each run is decoded into its destination directly where it can be (a float32 destination and a type with a
C kernel: the kernel writes there), otherwise into a scratch array of at most ``RUN_ELEMENTS`` values that
is then copied (and cast) into place. So the memory in flight is bounded by the number of workers times one
run, never by the size of a tensor: a bfloat16 or float16 result never has a whole-tensor float32 copy.

This module needs only numpy (``load_batch`` returns numpy arrays); api.py plugs torch destinations in.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ckptfs.core.errors import CheckpointError
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.engine.decode import decode_blocks
from ckptfs.engine.parallel import spread

if TYPE_CHECKING:  # blocks.py imports this module
    from ckptfs.core.descriptors import TensorInfo
    from ckptfs.engine.values import TensorValues
    from ckptfs.quant import Codec
    from ckptfs.sources import SourcePool

RUN_ELEMENTS = 1 << 20                 # decoded values per run: 4 MiB of float32 scratch at most
RUN_STORED_BYTES = 8 << 20             # stored bytes per run (plain types: one run is one copy)
PIECE_BYTES = 8 << 20                  # a pread joins runs up to this many bytes ...
MAX_GAP = 64 << 10                     # ... across gaps (padding, skipped tensors) of at most this
ALIGN = 64                             # load_batch: each array starts on a cache line


class Destination(Protocol):
    """Where decoded elements of one request go (flat, C order, element 0 = the request's first element)."""

    def direct(self, e0: int, e1: int) -> np.ndarray | None:
        """A writable float32 array for elements [e0, e1) that a C kernel may decode into, or None."""

    def put(self, e0: int, values: np.ndarray) -> None:
        """Store ``values`` (the codec's output dtype) as elements [e0, e0 + len(values))."""


class ArrayDestination:
    """A flat numpy array: values are cast into it with numpy's rules (float16 overflow becomes inf)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def direct(self, e0: int, e1: int) -> np.ndarray | None:
        return self.array[e0:e1] if self.array.dtype == np.float32 else None

    def put(self, e0: int, values: np.ndarray) -> None:
        with np.errstate(over="ignore"):
            self.array[e0:e0 + values.size] = values


class Tensor(Protocol):
    """What a batch reads of a tensor (``ckptfs.Tensor`` has it; the engine does not import the API)."""

    name: str
    info: TensorInfo
    shape: tuple[int, ...]
    storage_type: str
    codec: Codec | None
    dtype: np.dtype | None
    virtual: bool

    @property
    def data(self) -> TensorValues: ...

    @property
    def decodable(self) -> bool: ...

    @property
    def size(self) -> int: ...

    @property
    def nbytes(self) -> int | None: ...


class Checkpoint(Protocol):
    """What a batch reads of a checkpoint: its tensors by name and the pool their bytes are read through."""

    sources: SourcePool

    def __getitem__(self, name: str) -> Tensor: ...


@dataclass
class Request:
    values: TensorValues               # the tensor's values: a TensorData or, for a view of a packed layer
                                       # (virtual), a PackedData (read)
    e0: int                            # elements [e0, e1) of the flattened tensor
    e1: int
    dest: Destination                  # element e0 of the tensor is element 0 of dest
    codec: Codec | None = None         # what decodes the stored blocks: the tensor's codec, or another
                                       # (api.py: BF16 storage into a bfloat16 tensor is copied as 16-bit words)
    virtual: bool = False              # a packed layer's view: its values read and decode their own parts

    @classmethod
    def of(cls, tensor: Tensor, e0: int, e1: int, dest: Destination, codec: Codec | None = None) -> Request:
        """The request for elements [e0, e1) of a ckptfs Tensor."""
        return cls(tensor.data, e0, e1, dest, codec if codec is not None else tensor.codec, tensor.virtual)


@dataclass
class Run:
    request: Request
    b0: int                            # blocks [b0, b1) of the tensor
    b1: int

    @property
    def info(self) -> TensorInfo:
        return self.request.values.info

    @property
    def offset(self) -> int:
        return self.info.offset + self.b0 * self.info.block_bytes

    @property
    def size(self) -> int:
        return (self.b1 - self.b0) * self.info.block_bytes


@dataclass
class Piece:
    source: str
    offset: int
    size: int
    runs: list[Run] = field(default_factory=list)


def decode_virtual(requests: Sequence[Request]) -> list[Request]:
    """Decode the requests of virtual tensors (views of packed layers, ckptfs.packed, which read and decode
    their own parts) into their destinations now; return the others, for :func:`plan`."""
    stored = []
    for req in requests:
        if req.virtual:
            for e in range(req.e0, req.e1, RUN_ELEMENTS):     # bounded runs, as for stored tensors
                req.dest.put(e - req.e0, req.values.read(e, min(e + RUN_ELEMENTS, req.e1), use_cache=False))
        else:
            stored.append(req)
    return stored


def plan(requests: Sequence[Request]) -> list[Piece]:
    """Runs of bounded size for every request, joined into one read where they lie close in one file.

    Raises CheckpointError naming the tensor when blocks a request needs are missing from its file, before
    anything is read.
    """
    runs: list[Run] = []
    for req in requests:
        if req.e1 <= req.e0:
            continue
        info = req.values.info
        b0, b1 = req.values.present_blocks(req.e0, req.e1)   # CheckpointError if any are missing
        step = max(1, min(RUN_ELEMENTS // info.block_elements, RUN_STORED_BYTES // info.block_bytes))
        runs += [Run(req, s, min(s + step, b1)) for s in range(b0, b1, step)]
    runs.sort(key=lambda r: (r.info.source, r.offset))
    pieces: list[Piece] = []
    for run in runs:
        last = pieces[-1] if pieces else None
        if (last is not None and last.source == run.info.source and run.offset >= last.offset
                and run.offset - (last.offset + last.size) <= MAX_GAP
                and run.offset + run.size - last.offset <= PIECE_BYTES):
            last.size = max(last.size, run.offset + run.size - last.offset)
        else:
            last = Piece(run.info.source, run.offset, run.size)
            pieces.append(last)
        last.runs.append(run)
    return pieces


def decode_run(run: Run, raw: memoryview | bytes) -> None:
    """Decode the run's stored bytes ``raw`` into its destination: straight into place when the run covers
    whole blocks of the request and the destination takes the codec's output (ckptfs.engine.decode)."""
    req, info = run.request, run.info
    codec, be = req.codec, info.block_elements
    assert codec is not None, "a stored tensor's request carries its codec (Request.of)"
    first, last = run.b0 * be, run.b1 * be                       # the elements these blocks hold
    e0, e1 = max(first, req.e0), min(last, req.e1)
    out = req.dest.direct(e0 - req.e0, e1 - req.e0) if (e0, e1) == (first, last) else None
    if out is not None and out.dtype == codec.dtype:
        decode_blocks(codec, info, raw, codec.dtype, out)
        return
    values = decode_blocks(codec, info, raw, codec.dtype)[e0 - first: e1 - first]
    req.dest.put(e0 - req.e0, values)


def read_piece(piece: Piece, sources: SourcePool, scope: ReadScope = NOTHING_SAID) -> memoryview:
    """The stored bytes of ``piece``; a source error (file changed, bytes missing, bytes that differ from a
    manifest) names a tensor in it."""
    try:
        return memoryview(sources.get(piece.source).pread(piece.offset, piece.size, scope=scope))
    except CheckpointError as exc:  # the same class (an IntegrityError stays one), the tensor it hit named
        hit = [r for r in piece.runs if exc.offset is not None and r.offset <= exc.offset < r.offset + r.size]
        raise exc.about_tensor(min(r.info.name for r in (hit or piece.runs))) from None


def run(pieces: Sequence[Piece], sources: SourcePool, scope: ReadScope = NOTHING_SAID) -> None:
    """Read and decode every piece, here and on the idle decode workers (``spread``), under the caller's
    ``scope``; the first error is raised once the pieces already started have ended (the ones not started yet
    are skipped)."""
    failed: list[bool] = []

    def work(piece: Piece) -> None:
        if failed:
            return
        try:
            raw = read_piece(piece, sources, scope)
            for r in piece.runs:
                start = r.offset - piece.offset
                decode_run(r, raw[start:start + r.size])
        except BaseException:
            failed.append(True)
            raise

    spread([functools.partial(work, piece) for piece in pieces])


def tensors_named(ck: Checkpoint, names: Sequence[str]) -> list[Tensor]:
    """The Tensors of ``names``, checked before anything is allocated or read: KeyError for an unknown name,
    ValueError for a name given twice, CheckpointError for a tensor that cannot be decoded."""
    if isinstance(names, str):
        raise TypeError(f"names must be a list of tensor names, not the string {names!r}")
    if len(set(names)) != len(names):
        raise ValueError("a tensor name is given twice")
    return check_decodable([ck[name] for name in names])


def check_decodable(tensors: list[Tensor]) -> list[Tensor]:
    for t in tensors:
        if not t.decodable:
            reason = t.info.damaged or f"no codec for {t.storage_type}"
            raise CheckpointError(t.info.source, t.info.offset, f"tensor {t.name!r}: cannot decode: {reason}")
    return tensors


def _served(tensor: Tensor) -> tuple[int, np.dtype]:
    """(bytes, dtype) of a decodable tensor's values (``check_decodable`` said it is)."""
    assert tensor.nbytes is not None and tensor.dtype is not None
    return tensor.nbytes, tensor.dtype


def load_batch(ck: Checkpoint, names: Sequence[str], *, stack: bool = False) -> Any:
    """Tensors ``names`` decoded (dtype as ``Tensor.dtype``) into ONE new contiguous buffer.

    Returns ``{name: array}``, each array a view into that buffer, or with ``stack=True`` one array of shape
    ``(len(names), *shape)`` (every tensor must have the same shape and dtype: ValueError otherwise) of the
    open checkpoint ``ck`` (``ckptfs.load_batch`` also takes a path).
    """
    names = names if isinstance(names, str) else list(names)
    tensors = tensors_named(ck, names)
    if stack:
        kinds = {(t.shape, t.dtype) for t in tensors}
        if len(kinds) > 1:
            got = ", ".join(f"{t.name}: {t.shape} {t.dtype}" for t in tensors[:4])
            raise ValueError(f"load_batch(stack=True) needs tensors of one shape and dtype, got {got}"
                             f"{' ...' if len(tensors) > 4 else ''}")
        shape, dtype = kinds.pop() if kinds else ((), np.dtype(np.float32))
        stacked = np.empty((len(tensors), *shape), dtype)
        arrays = list(stacked) if tensors else []
    else:
        offsets, total = [], 0
        served = [_served(t) for t in tensors]
        for nbytes, _ in served:
            total = -(-total // ALIGN) * ALIGN
            offsets.append(total)
            total += nbytes
        buffer = np.empty(total, np.uint8)
        arrays = [buffer[o:o + nbytes].view(dtype).reshape(t.shape)
                  for o, (nbytes, dtype), t in zip(offsets, served, tensors)]
    requests = [Request.of(t, 0, t.size, ArrayDestination(a.reshape(-1))) for t, a in zip(tensors, arrays)]
    run(plan(decode_virtual(requests)), ck.sources)
    return stacked if stack else dict(zip(names, arrays))
