"""Checkpoint tensors as torch tensors: ``to_torch``, ``load`` (and ``load_batch``, which needs no torch).

Host path (device "cpu"): the batch engine (batch.py) reads coalesced pieces and decodes them on every core
straight into the preallocated torch tensors (the C kernels write float32 results in place; other dtypes
are cast from bounded float32 runs, never from a whole-tensor float32 copy).

Device path (a CUDA device): the stored bytes are uploaded through two pinned staging buffers and
dequantized on the device by the torch kernels of kernels.py (the engine's decode door's "torch" device
backend: ``ckptfs.engine.decode.device_backend``), run by run, each run's float32 values cast
into the destination there; reads of the next pieces overlap the GPU work. Types without a torch kernel
(and big-endian files) are decoded on the host and copied. ``use_kernels=True`` runs this same path on the
CPU: that is how CI checks it bit for bit without a GPU.

Bad input fails before anything is allocated (unknown device, a dtype torch lacks, an unknown tensor name);
running out of device memory raises one MemoryError naming the tensor, after freeing what was loaded.
"""

from __future__ import annotations

import functools
import itertools
import traceback
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, wait

import numpy as np
import torch

from ckptfs.quant import codec_for
from ckptfs.checkpoint.api import opened
from ckptfs.engine import batch, decode
from ckptfs.core.runtime import runtime
from ckptfs.workers.scheduler import WORKERS
from ckptfs.torchio import kernels  # noqa: F401 - registers the "torch" device backend with the decode door

#: Storage types torch holds exactly: ``dtype=None`` keeps them; every other type becomes float32.
STORAGE_DTYPES: dict[str, torch.dtype] = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
    "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
    "U8": torch.uint8, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
    "BOOL": torch.bool, "C64": torch.complex64,
}
#: What floating values (every decoded type, and F16/BF16/F32/F64 storage) may be loaded as: a rounding of
#: the float32 (or float64) values torch defines. An integer, bool, float8 or complex dtype is a ValueError:
#: torch's casts would give zeros, all True, or saturated bytes, and that is never what was meant.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: Significand bits (implicit bit included) of FLOAT_DTYPES: the integers up to 2**bits are held exactly.
_SIGNIFICAND = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}
_QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
READ_AHEAD = 4                         # device path: pieces read ahead of the one being uploaded
DEVICE_BACKEND = "torch"               # the decode door's device backend (ckptfs.torchio.kernels registers it)


def resolve_device(device) -> torch.device:
    """``device`` as a torch.device with its index, or ValueError (unknown name, no CUDA, no such GPU)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"unknown device {device!r}: {str(exc).splitlines()[0]}") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ValueError(f"device {device!r} is not supported: use 'cpu' or 'cuda[:N]'")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available to this torch ({torch.__version__})")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present")
    return torch.device("cuda", index)


def resolve_dtype(dtype) -> torch.dtype | None:
    """A torch dtype from a torch dtype, its name ("bfloat16", "torch.float16") or a numpy dtype; ValueError
    for one torch lacks or cannot convert float values into."""
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        found = dtype
    elif (isinstance(dtype, str)
          and isinstance(getattr(torch, dtype.removeprefix("torch."), None), torch.dtype)):  # probe: third-party
        found = getattr(torch, dtype.removeprefix("torch."))
    else:
        try:
            found = torch.from_numpy(np.empty(0, np.dtype(dtype))).dtype
        except (TypeError, ValueError):
            raise ValueError(f"torch has no dtype {dtype!r}") from None
    if found in _QUANTIZED:
        raise ValueError(f"dtype {found}: a torch quantized dtype cannot hold decoded values")
    try:
        torch.empty(1, dtype=found).copy_(torch.zeros(1))
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"dtype {found}: torch cannot hold decoded values in it "
                         f"({str(exc).splitlines()[0]})") from None
    return found


def output_dtype(tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The torch dtype ``tensor`` is loaded as: ``dtype`` where it can hold the tensor's values, else the
    storage's own (``dtype`` None: the storage's own where torch holds it exactly, else float32).

    Floating values take only FLOAT_DTYPES; complex ones only complex64/complex128 (anything else is a
    ValueError naming the tensor and the dtype). Integer and bool storage takes ``dtype`` only where every
    value of its type is held exactly (int8 -> bfloat16, int16 -> float32, uint8 -> int16, bool -> any of
    those); otherwise it keeps its own dtype, as ``torch.nn.Module.to(dtype)`` leaves integer buffers alone,
    so that ``ckptfs.load(src, dtype=torch.bfloat16)`` of a model with int32 or int64 tensors loads them
    intact instead of failing or rounding them. The rule depends on the types only, never on the values.
    """
    exact = not tensor.virtual and tensor.info.block_elements == 1
    storage = STORAGE_DTYPES.get(tensor.storage_type) if exact else None
    if dtype is None:
        return storage or torch.float32
    if storage is not None and storage.is_complex:
        if dtype not in (torch.complex64, torch.complex128):
            raise ValueError(f"tensor {tensor.name!r} is complex ({tensor.storage_type}): {dtype} "
                             f"{'would drop its imaginary part' if not dtype.is_complex else 'cannot hold it'}; "
                             f"use torch.complex64 or torch.complex128")
        return dtype
    if storage is not None and not storage.is_floating_point:
        return dtype if holds_exactly(storage, dtype) else storage
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"tensor {tensor.name!r} holds floating values ({tensor.storage_type}): {dtype} cannot "
                         f"hold them; use torch.float32, torch.float16, torch.bfloat16 or torch.float64 "
                         f"(or dtype=None)")
    return dtype


def holds_exactly(storage: torch.dtype, target: torch.dtype) -> bool:
    """Whether every value of the integer or bool dtype ``storage`` is exactly a value of ``target``."""
    if storage == target:
        return True
    if storage == torch.bool:
        lo, hi = 0, 1
    else:
        bits = storage.itemsize * 8
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if storage.is_signed else (0, (1 << bits) - 1)
    if target in _SIGNIFICAND:
        return max(-lo, hi) <= 1 << _SIGNIFICAND[target]
    if target == torch.bool or target.is_floating_point or target.is_complex:
        return False
    tbits = target.itemsize * 8
    tlo, thi = (-(1 << (tbits - 1)), (1 << (tbits - 1)) - 1) if target.is_signed else (0, (1 << tbits) - 1)
    return tlo <= lo and hi <= thi


def _numpy_view(flat: torch.Tensor) -> np.ndarray | None:
    if flat.device.type != "cpu":
        return None
    try:
        return flat.numpy()
    except (TypeError, RuntimeError):   # bfloat16, float8, ...: no numpy twin
        return None


class TorchDestination:
    """A flat torch tensor as a batch destination: numpy writes where numpy has the dtype (CPU), torch's
    ``copy_`` (with its casting) elsewhere (bfloat16, device memory)."""

    def __init__(self, flat: torch.Tensor):
        self.flat = flat
        self.array = _numpy_view(flat)

    def direct(self, e0: int, e1: int) -> np.ndarray | None:
        return self.array[e0:e1] if self.array is not None and self.array.dtype == np.float32 else None

    def put(self, e0: int, values: np.ndarray) -> None:
        if self.array is not None:
            with np.errstate(over="ignore"):
                self.array[e0:e0 + values.size] = values
            return
        if not values.flags.writeable:            # torch.from_numpy warns about read-only arrays
            values = values.copy()
        self.flat[e0:e0 + values.size].copy_(torch.from_numpy(values))


def _row_range(tensor, rows) -> tuple[int, int, tuple[int, ...]]:
    """Elements [e0, e1) and the shape of ``tensor[rows]`` (rows: None or a slice with step 1)."""
    if rows is None:
        return 0, tensor.size, tuple(tensor.shape)
    if not isinstance(rows, slice) or rows.step not in (None, 1) or not tensor.shape:
        raise ValueError("rows must be a slice of the first axis with step 1 (e.g. slice(100, 200))")
    r0, r1, _ = rows.indices(tensor.shape[0])
    r1 = max(r0, r1)
    row_elems = tensor.size // tensor.shape[0] if tensor.shape[0] else 0
    return r0 * row_elems, r1 * row_elems, (r1 - r0, *tensor.shape[1:])


def _allocate(shape, dtype, device, name) -> torch.Tensor:
    try:
        return torch.empty(shape, dtype=dtype, device=device)
    except torch.OutOfMemoryError as exc:
        raise _no_memory(device, name, shape, dtype, exc) from None
    except RuntimeError as exc:                   # the CPU allocator says it as a RuntimeError
        if "alloc" not in str(exc):
            raise
        raise _no_memory(device, name, shape, dtype, exc) from None


def _no_memory(device, name, shape, dtype, exc) -> MemoryError:
    nbytes = int(np.prod(shape)) * dtype.itemsize
    return MemoryError(f"{device}: no memory for tensor {name!r} ({tuple(shape)} {dtype}, {nbytes} bytes); "
                       f"nothing was kept: {str(exc).splitlines()[0]}")


def load_tensors(ck, tensors: Sequence, device, dtype=None, rows=None, use_kernels: bool | None = None) -> list:
    """The torch tensors of ``tensors`` (all of one open checkpoint), or an exception with nothing kept:
    on failure the frames that held the partial results are cleared and the device's cache is released."""
    dev, want = resolve_device(device), resolve_dtype(dtype)
    plans = [(t, *_row_range(t, rows), output_dtype(t, want)) for t in tensors]
    on_device = dev.type == "cuda" if use_kernels is None else use_kernels
    try:
        return _fill(ck, plans, dev, on_device)
    except torch.OutOfMemoryError as exc:
        traceback.clear_frames(exc.__traceback__)
        failure = MemoryError(f"{dev}: out of memory while loading {len(tensors)} tensor(s); nothing was kept: "
                              f"{str(exc).splitlines()[0]}")
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)
        _release(dev)
        raise
    _release(dev)
    raise failure


def _fill(ck, plans, dev: torch.device, on_device: bool) -> list[torch.Tensor]:
    results, requests = [], []
    for t, e0, e1, shape, out_dtype in plans:
        results.append(_allocate(shape, out_dtype, dev, t.name))
        requests.append(_request(t, e0, e1, results[-1].view(-1)))
    pieces = batch.plan(batch.decode_virtual(requests))
    if on_device:
        _decode_on_device(pieces, ck.sources, dev)
    else:
        batch.run(pieces, ck.sources)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return results


def _request(tensor, e0: int, e1: int, flat: torch.Tensor) -> batch.Request:
    """The batch request filling ``flat``. BF16 storage into bfloat16 is a copy of the 16-bit words (the
    I16 codec, into an int16 view): exact, NaN payloads included, where float32 and back would not be."""
    if flat.dtype == torch.bfloat16 and tensor.storage_type == "BF16" and not tensor.virtual:
        return batch.Request.of(tensor, e0, e1, TorchDestination(flat.view(torch.int16)), codec=codec_for("I16"))
    return batch.Request.of(tensor, e0, e1, TorchDestination(flat))


def _release(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()


class _Uploader:
    """Stored bytes -> a uint8 tensor on the device: through two pinned buffers used in turn on CUDA (the
    copy of one runs while the other is refilled), a plain copy on the CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buffers: list[torch.Tensor | None] = [None, None]
        self.events: list = [None, None]
        self.turn = 0

    def upload(self, raw) -> torch.Tensor:
        host = np.frombuffer(raw, np.uint8)
        if self.device.type != "cuda":
            return torch.from_numpy(host.copy())
        i, self.turn = self.turn, self.turn ^ 1
        if self.events[i] is not None:
            self.events[i].synchronize()           # its last upload has left the buffer
        buffer = self.buffers[i]
        if buffer is None or buffer.numel() < host.size:
            buffer = self.buffers[i] = torch.empty(max(host.size, batch.PIECE_BYTES), dtype=torch.uint8,
                                                   pin_memory=True)
        staged = buffer[:host.size]
        staged.numpy()[:] = host
        on_device = staged.to(self.device, non_blocking=True)
        self.events[i] = torch.cuda.Event()
        self.events[i].record()
        return on_device


def _decode_on_device(pieces: Sequence[batch.Piece], sources, device: torch.device) -> None:
    """Read pieces (a few ahead, on the scheduler's read pool), upload those with a torch kernel and decode
    them on the device; the rest decode on the host into their destination."""
    uploader = _Uploader(device)
    todo = iter(pieces)
    # (islice, not zip with a range: zip takes one more piece off ``todo`` before it sees the range end, and
    # that piece would never be decoded)
    pending = deque((p, _read_ahead(p, sources)) for p in itertools.islice(todo, READ_AHEAD))
    try:
        while pending:
            piece, future = pending.popleft()
            raw = future.result() if future is not None else batch.read_piece(piece, sources)
            following = next(todo, None)
            if following is not None:
                pending.append((following, _read_ahead(following, sources)))
            uploaded = None
            for run in piece.runs:
                start = run.offset - piece.offset
                if not _device_decodable(run):
                    batch.decode_run(run, raw[start:start + run.size])
                    continue
                if uploaded is None:
                    uploaded = uploader.upload(raw)
                _device_run(run, uploaded[start:start + run.size])
    finally:  # no read outlives the load (a failed one's neighbours end first)
        for _, future in pending:
            if future is not None and not future.cancel():
                wait([future])


def _read_ahead(piece: batch.Piece, sources) -> Future | None:
    """``piece``'s stored bytes read on the scheduler's read pool (counted in its budget until read); None
    when the budget is full: the loop reads it itself when it gets there."""
    return runtime().get(WORKERS).call("read", functools.partial(batch.read_piece, piece, sources), piece.size)


def _device_decodable(run: batch.Run) -> bool:
    return decode.device_backend(DEVICE_BACKEND, run.request.codec, run.info) is not None


def _device_run(run: batch.Run, stored: torch.Tensor) -> None:
    info, req = run.info, run.request
    codec, dest = req.codec, req.dest
    backend = decode.device_backend(DEVICE_BACKEND, codec, info)
    assert codec is not None and backend is not None and isinstance(dest, TorchDestination)  # _device_decodable
    be = info.block_elements
    values = backend.dequantize(codec.name, stored.view(run.b1 - run.b0, info.block_bytes)).reshape(-1)
    first = run.b0 * be
    e0, e1 = max(first, req.e0), min(run.b1 * be, req.e1)
    dest.flat[e0 - req.e0:e1 - req.e0].copy_(values[e0 - first:e1 - first])


# ------------------------------------------------------------------------------------------------ public


def to_torch(tensor, device="cpu", dtype=None, *, rows: slice | None = None,
             use_kernels: bool | None = None) -> torch.Tensor:
    """``tensor`` (a ckptfs Tensor) as a torch tensor on ``device``; ``rows=slice(a, b)`` decodes only
    those rows of the first axis. dtype None: the storage dtype where torch holds it exactly, else float32."""
    (result,) = load_tensors(tensor._ck, batch.check_decodable([tensor]), device, dtype, rows, use_kernels)
    return result


def load(src, names: Sequence[str] | None = None, *, device="cpu", dtype=None,
         use_kernels: bool | None = None) -> dict[str, torch.Tensor]:
    """``{name: torch.Tensor}`` for ``names`` (default: every decodable, undamaged tensor of the release,
    below) of ``src`` (a path, or an open Checkpoint, which is left open). Reads are coalesced across tensors
    and decoded on every core (CPU), or uploaded and dequantized on the GPU (CUDA).

    A quantized folder's default is the unquantized release's state dict: each layer's dense view under
    its name, and not the stored parts a view is computed from (``qweight``, ``weight_scale_inv``,
    ``input_scale``...) nor the activation and KV-cache scales (``self_attn.k_scale``...); ``names`` may
    still name them, and ``ck.stored(name)`` reaches codes a view
    stands in for."""
    resolve_device(device)
    resolve_dtype(dtype)
    with opened(src) as ck:
        if names is None:
            names = ck.release_names()
        names = names if isinstance(names, str) else list(names)
        tensors = batch.tensors_named(ck, names)
        return dict(zip(names, load_tensors(ck, tensors, device, dtype, use_kernels=use_kernels)))


load_batch = batch.load_batch
