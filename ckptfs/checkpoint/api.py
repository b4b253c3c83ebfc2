"""The library API: ``ckptfs.open(src)`` -> Checkpoint, a mapping of names to lazy Tensors.

The API uses the very objects the mount serves from (``TensorData`` for values, ``NpyView`` for the header
geometry, the same cache and sources), so what a test sees through the API is what ``NAME.npy`` holds.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union, overload

import numpy as np

from ckptfs.cache.tiered import BlockCache, TieredCache
from ckptfs.checkpoint.meta import tensor_meta
from ckptfs.core.descriptors import ParsedCheckpoint, TensorInfo, TensorTable, tensor_names
from ckptfs.core.errors import CheckpointError
from ckptfs.core.features import feature
from ckptfs.core.options import DEFAULT_CACHE_BYTES, OpenOptions, absolute, spelled_fields
from ckptfs.core.reads import ReadScope
from ckptfs.core.runtime import Part
from ckptfs.core.runtime import runtime as default_runtime
from ckptfs.engine.blocks import UNCACHED_STEP_BYTES, TensorData
from ckptfs.engine.values import TensorValues
from ckptfs.core.options import DTYPE_MODES
from ckptfs.quant import Codec, codec_for, output_dtype
from ckptfs.util.redact import redact
from ckptfs.sources import DEFAULT_OPENER, ByteSource, SourcePool, checkpoint_content_id

if TYPE_CHECKING:  # source_plan imports it when a checkpoint's sources need one
    from ckptfs.sources.plan import SourcePlan

#: What ``open`` takes: a path (str, bytes or os.PathLike) or a URL.
PathOrUrl = Union[str, bytes, "os.PathLike[str]"]

__all__ = ["open", "opened", "Checkpoint", "Tensor", "TensorList", "OpenOptions", "DEFAULT_CACHE_BYTES",
           "decode_plan"]


def decode_plan(info: TensorInfo, dtype_mode: str) -> tuple[Codec | None, np.dtype | None]:
    """The codec that decodes a stored tensor and the dtype it is served as; (None, None) for a tensor served
    raw only (unknown storage type, or a big-endian layout its codec cannot swap)."""
    codec = codec_for(info.storage_type) if info.block_elements else None
    if codec is not None and info.byte_order == ">" and codec.swap is None:
        codec = None
    return codec, (output_dtype(codec, dtype_mode) if codec is not None else None)


class Tensor:
    """A tensor whose values are decoded only for the parts asked for."""

    def __init__(self, checkpoint: Checkpoint, info: TensorInfo, index: int):
        self._ck = checkpoint
        self.info = info
        self.index = index
        self.name = info.name
        self.storage_type = info.storage_type
        self.shape = info.shape
        self.stored_nbytes = info.stored_nbytes
        self.codec, self.dtype = decode_plan(info, checkpoint.dtype_mode)
        self._data: TensorValues | None = None
        self._meta: dict[str, Any] | None = None

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint the tensor was opened from (its cache, options and sources)."""
        return self._ck

    @property
    def data_made(self) -> bool:
        """Whether ``data`` was made already: it took the tensor's codec then (a mount's counters wrap the
        codec only before)."""
        return self._data is not None

    @property
    def annotations(self) -> dict[str, Any]:
        """Extra keys for NAME.meta.json from features that look at several tensors (``packed_view``). Kept by
        the checkpoint's tensor list, which holds Tensors weakly and may make this one again."""
        return self._ck.tensors.annotations(self.index)

    #: True for a tensor computed from other stored tensors (a GPTQ/AWQ/FP8 view): .npy and .meta.json only
    virtual = False

    @property
    def decodable(self) -> bool:
        """False for tensors served raw-only (unknown storage type, undecodable byte order)."""
        return self.codec is not None

    @property
    def data(self) -> TensorValues:
        """The tensor's values by element range (a packed view's: ``PackedData``)."""
        if self.codec is None or self.dtype is None:  # decode_plan gives both or neither
            raise CheckpointError(self.info.source, self.info.offset,
                                  f"tensor {self.name!r}: cannot decode: {self.info.damaged or 'no codec'}")
        if self._data is None:
            self._data = TensorData(self.info, self.codec, self.dtype, self._ck.sources, self._ck.cache)
        return self._data

    def values_as(self, dtype: np.dtype) -> TensorValues:
        """The values read through as ``dtype`` whatever the checkpoint's dtype mode: hf/ rounds each float32
        value once to its own dtype, never a float16 one again (a view answers with its own kind:
        ``PackedTensor.values_as``)."""
        if self.dtype is not None and np.dtype(dtype) == self.dtype:
            return self.data
        if self.codec is None:
            raise CheckpointError(self.info.source, self.info.offset,
                                  f"tensor {self.name!r}: cannot decode: {self.info.damaged or 'no codec'}")
        return TensorData(self.info, self.codec, np.dtype(dtype), self._ck.sources, self._ck.cache)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return self.info.n_elements

    @property
    def nbytes(self) -> int | None:
        return None if self.dtype is None else self.size * self.dtype.itemsize

    @property
    def meta(self) -> dict[str, Any]:
        """The dict NAME.meta.json holds."""
        if self._meta is None:
            self._meta = {**tensor_meta(self, self._ck), **self.annotations}
        return self._meta

    def raw(self) -> bytes:
        """The stored bytes (a copy: never a view that can fault if the file changes)."""
        return self._ck.sources.get(self.info.source).pread(self.info.offset, self.info.stored_nbytes)

    def numpy(self) -> np.ndarray:
        """The whole tensor, decoded (a new, writable array)."""
        values = self.data.read(0, self.size, use_cache=False)
        if not values.flags.writeable:
            values = values.copy()
        return values.reshape(self.shape)

    def to_torch(self, device: Any = "cpu", dtype: Any = None, *, rows: slice | None = None) -> Any:
        """This tensor as a torch.Tensor on ``device`` (CUDA: dequantized there); ``rows=slice(a, b)``
        decodes only those rows. dtype None: the storage dtype where torch holds it exactly, else float32.
        Needs torch (imported here, never by ``import ckptfs``); see ckptfs.torchio."""
        return feature("to_torch")(self, device, dtype, rows=rows)  # a torch.Tensor (torch is optional)

    def shared(self) -> np.ndarray:
        """The whole tensor, read-only, decoded once per machine into the cache folder and mapped: every
        process calling this maps the same pages (one copy for N workers; see ckptfs.checkpoint.shared)."""
        from ckptfs.checkpoint.shared import shared_array, tensor_store

        store = tensor_store(self._ck.cache, self._ck.options.cache_key_file)
        return shared_array(self.name, self.data, store, self.numpy).reshape(self.shape)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:  # numpy 2's protocol: say so when a copy cannot be avoided (values are decoded anew)
            raise ValueError("a ckptfs Tensor has no array to share: its values are decoded on each request")
        values = self.numpy()
        return values if dtype is None else values.astype(dtype, copy=False)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __getitem__(self, key: Any) -> Any:
        """Index like numpy; only the rows of the first axis that the key touches are decoded.

        Rows are decoded from their own blocks straight into the result, never kept as whole cached groups
        (see ``_rows``): a picked row costs its row, and memory peaks at the result plus one bounded step.
        """
        if not self.shape:
            return self.numpy()[key]
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) and key else (key, ())
        if first is Ellipsis or isinstance(first, bool):  # numpy reads a bool as a 0-d mask, not as 0/1
            return self.numpy()[key]
        rows = self.shape[0]
        if isinstance(first, (int, np.integer)):
            i = int(first)
            if not -rows <= i < rows:
                raise IndexError(f"index {i} is out of bounds for axis 0 with size {rows}")
            # index a one-row array with 0 in place of i: the integer stays an (advanced) index where it
            # was, so axis order and scalar results are numpy's (a[0, :, [1, 2]] is not a[0][:, [1, 2]])
            return self._rows(np.array([i % rows]))[(0,) + rest].copy()
        if isinstance(first, slice):
            return _rest_of(self._rows(np.arange(*first.indices(rows), dtype=np.int64)), rest)
        picked_rows = _row_list(first, rows)
        if picked_rows is not None and not any(_is_array_index(k) for k in rest):
            # t[token_ids]: an embedding lookup decodes the rows it names, once each, not the whole table.
            # With only basic indexes after it, a[ids, rest] is a[ids][:, rest] in numpy too.
            return _rest_of(self._rows(picked_rows), rest)
        return self.numpy()[key]

    def _rows(self, picked: np.ndarray) -> np.ndarray:
        """Rows ``picked`` (int64 in range, any order, repeats allowed) as a new array ``(n, *shape[1:])``.

        Nearby rows are decoded together in windows (at most twice the rows they hold, at most
        ``UNCACHED_STEP_BYTES``), each straight from its blocks into the result, bypassing the cache: a view
        into a cached group would keep the whole group alive per row (t[::16] of an embedding then peaked at
        gigabytes), and decoding a group for one row costs the group. Repeated rows are decoded once.
        """
        data = self.data
        row_elems = self.size // self.shape[0] if self.shape[0] else 0
        out = np.empty((picked.size, row_elems), data.dtype)
        if picked.size and row_elems:
            max_rows = max(1, UNCACHED_STEP_BYTES // (row_elems * data.dtype.itemsize))
            ascending = bool(np.all(picked[1:] > picked[:-1]))  # t[a:b], t[::k], sorted ids: no reordering
            order = None if ascending else np.argsort(picked, kind="stable")
            ordered = picked if order is None else picked[order]
            if ascending and int(picked[-1] - picked[0]) == picked.size - 1:  # one run of rows: fixed windows
                first = int(picked[0])
                windows: Iterator[tuple[int, int, int, int]] = (
                    (k, min(k + max_rows, picked.size), first + k, first + min(k + max_rows, picked.size))
                    for k in range(0, picked.size, max_rows))
            else:
                windows = _windows(ordered.tolist(), max_rows)
            for k0, k1, lo, hi in windows:
                values = data.read(lo * row_elems, hi * row_elems, use_cache=False).reshape(hi - lo, row_elems)
                if not (ascending and k1 - k0 == hi - lo):  # else every row of the window, in order
                    values = values[ordered[k0:k1] - lo]
                if order is None:
                    out[k0:k1] = values
                else:
                    out[order[k0:k1]] = values
        return out.reshape((picked.size,) + self.shape[1:])

    def __repr__(self) -> str:
        return (f"<ckptfs.Tensor {self.name!r} {self.storage_type} shape={self.shape} "
                f"dtype={self.dtype}{' damaged' if self.info.damaged else ''}>")

    def __reduce__(self) -> tuple[Callable[..., Tensor], tuple[str, OpenOptions, int, str]]:
        # the options travel whole: the receiving process checks, fails over and shares tiers as this one
        return (_reopen_tensor, (self._ck._reopen_src, self._ck.options, self.index, self._ck.content_id))


def _rest_of(block: np.ndarray, rest: tuple[Any, ...]) -> np.ndarray:
    """``block[:, *rest]`` as an array of its own (no view keeping the larger block alive)."""
    return np.array(block[(slice(None),) + rest]) if rest else block


def _windows(ordered: list[int], max_rows: int) -> Iterator[tuple[int, int, int, int]]:
    """Split sorted row numbers into windows ``(k0, k1, lo, hi)``: ``ordered[k0:k1]`` lie in rows [lo, hi),
    which span at most ``max_rows`` rows and at most twice the distinct rows picked in them (t[::2] decodes
    its span once; t[::1000] decodes only its rows)."""
    k0, n = 0, len(ordered)
    while k0 < n:
        lo = ordered[k0]
        hi, distinct, k1 = lo + 1, 1, k0 + 1
        while k1 < n:
            row = ordered[k1]
            more = distinct + (row >= hi)
            if row + 1 - lo > max_rows or row + 1 - lo > 2 * more:
                break
            hi, distinct, k1 = row + 1, more, k1 + 1
        yield k0, k1, lo, hi
        k0 = k1


def _is_array_index(key: Any) -> bool:
    return isinstance(key, (list, np.ndarray, bool, np.bool_))


def _row_list(key: Any, rows: int) -> np.ndarray | None:
    """A non-empty 1-D list or array of integer row numbers as non-negative int64 (IndexError when one is out
    of range, as numpy says it); None for any other kind of index."""
    if not isinstance(key, (list, np.ndarray)):
        return None
    picked = np.asarray(key)
    if picked.ndim != 1 or picked.size == 0 or picked.dtype.kind not in "iu":
        return None
    picked = picked.astype(np.int64)
    bad = (picked < -rows) | (picked >= rows)
    if bad.any():
        raise IndexError(f"index {picked[bad][0]} is out of bounds for axis 0 with size {rows}")
    return picked % rows if rows else picked


class TensorList(Sequence["Tensor"]):
    """``Checkpoint.tensors``: every tensor in file order, each :class:`Tensor` made on first access.

    A checkpoint of 94,000 tensors is opened to read a few of them; making every Tensor (codec lookup,
    output dtype) up front cost more than parsing the header. Virtual tensors (GPTQ/AWQ views) are appended
    after the stored ones.
    """

    def __init__(self, checkpoint: Checkpoint, infos: Sequence[TensorInfo]):
        # A Tensor holds its checkpoint; the checkpoint holds its stored Tensors only weakly (and itself
        # weakly here), so no reference cycle keeps a dropped checkpoint's descriptors open until a garbage
        # collection: it is released at once (see Checkpoint.close). Virtual tensors are held strongly.
        self._ck = weakref.ref(checkpoint)
        self._infos = infos
        self._made: list[weakref.ref[Tensor] | None] = [None] * len(infos)
        self._extra: list[Tensor] = []
        self._annotations: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._hooks: list[Callable[[Tensor], None]] = []
        self._replaced: dict[int, int] = {}  # virtual index -> the stored tensor of that name it stands for

    def __len__(self) -> int:
        return len(self._infos) + len(self._extra)

    @overload
    def __getitem__(self, index: int) -> Tensor: ...

    @overload
    def __getitem__(self, index: slice) -> list[Tensor]: ...

    def __getitem__(self, index: int | slice) -> Tensor | list[Tensor]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        stored = len(self._infos)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("tensor index out of range")
        if index >= stored:
            return self._extra[index - stored]
        tensor = self.made(index)
        if tensor is None:
            with self._lock:
                tensor = self.made(index)
                if tensor is None:
                    checkpoint = self._ck()
                    if checkpoint is None:
                        raise CheckpointError(None, None, "the checkpoint of this tensor list was dropped")
                    tensor = Tensor(checkpoint, self._infos[index], index)
                    for hook in self._hooks:
                        hook(tensor)
                    self._made[index] = weakref.ref(tensor)
        return tensor

    def annotations(self, index: int) -> dict[str, Any]:
        """The extra meta.json keys of tensor ``index`` (kept here: its Tensor may be made again)."""
        with self._lock:
            return self._annotations.setdefault(index, {})

    def on_made(self, hook: Callable[[Tensor], None]) -> None:
        """Call ``hook`` on every Tensor: those made already now, the others as they are made (a mount's
        counters wrap each tensor's codec this way without making 94,000 Tensors up front)."""
        with self._lock:
            self._hooks.append(hook)
            made = [t for t in (r() for r in self._made if r is not None) if t is not None] + self._extra
        for tensor in made:
            hook(tensor)

    def __iter__(self) -> Iterator[Tensor]:
        return (self[i] for i in range(len(self)))

    def append(self, tensor: Tensor, replaces: int | None = None) -> None:
        """Add a virtual tensor; ``replaces``: the index of the stored tensor of the same name whose ``.npy``
        and ``.meta.json`` it takes over (the stored one keeps its ``.raw``)."""
        for hook in self._hooks:
            hook(tensor)
        if replaces is not None:
            self._replaced[len(self._infos) + len(self._extra)] = replaces
        self._extra.append(tensor)

    def replaced(self) -> dict[int, int]:
        """``{virtual index: stored index}`` of the views that stand in a stored tensor's name."""
        return dict(self._replaced)

    def made(self, index: int) -> Tensor | None:
        """The Tensor at ``index`` if it was made already (a virtual one always is), else None."""
        stored = len(self._infos)
        if index >= stored:
            return self._extra[index - stored]
        made = self._made[index]
        return None if made is None else made()

    def info(self, index: int) -> TensorInfo:
        """The descriptor at ``index``, without making the Tensor."""
        made = self.made(index)
        return made.info if made is not None else self._infos[index]

    def layout(self, index: int) -> tuple[str, int, str, tuple[int, ...]]:
        """(storage type, block elements, byte order, shape) of a stored tensor, from the columns when the
        descriptors are a TensorTable (no TensorInfo made)."""
        infos = self._infos
        if isinstance(infos, TensorTable):
            storage_type = infos.storage_types[index]
            return (storage_type, infos.geometry.get(storage_type, (0, 0))[0], infos.byte_order,
                    infos.shapes[index])
        info = self.info(index)
        return info.storage_type, info.block_elements, info.byte_order, info.shape

    def positions(self) -> list[tuple[str, int]]:
        """(source file, data offset) of every stored tensor, from the columns when the descriptors are a
        TensorTable (no TensorInfo made)."""
        infos = self._infos
        if isinstance(infos, TensorTable):
            return [(infos.source, offset) for offset in infos.offsets]
        return [(info.source, info.offset) for info in infos]

    def names(self) -> list[str]:
        """Every tensor's name in order, without making Tensor objects."""
        return [*tensor_names(self._infos), *(t.name for t in self._extra)]

    def damaged_indices(self) -> list[int]:
        if isinstance(self._infos, TensorTable):
            stored = sorted(self._infos.damaged)
        else:
            stored = [i for i, info in enumerate(self._infos) if info.damaged]
        return stored + [len(self._infos) + i for i, t in enumerate(self._extra) if t.info.damaged]


class Checkpoint(Mapping[str, Tensor]):
    """An opened checkpoint: a read-only mapping of tensor name -> Tensor (the first of that name)."""

    def __init__(self, parsed: ParsedCheckpoint, src: str, options: OpenOptions | None = None, *,
                 cache: TieredCache | None = None,
                 source_wrapper: Callable[[ByteSource], ByteSource] | None = None,
                 source_opener: Callable[[str, str | None], ByteSource] | None = None,
                 read_scope: Callable[[], ReadScope] | None = None):
        """``options``: how it was opened (kept whole, and carried by pickled tensors); ``cache``: the tiers
        decoded groups go to (default: a memory tier of ``options.cache_size``); ``source_wrapper``: applied
        to every byte source as it is opened (checked reads, mirrors); ``source_opener``: opens them (default
        ``ckptfs.sources.open_source``; remote options); ``read_scope``: the scope a mount passes down with each
        read (``ckptfs.core.reads``: a remote checkpoint's deadline), or None."""
        options = options if options is not None else OpenOptions()
        if options.dtype not in DTYPE_MODES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_MODES)}, not {options.dtype!r}")
        self.parsed = parsed
        self.src = src
        self.options = options
        self.read_scope = read_scope
        self._reopen_src = absolute(src)
        self.dtype_mode = options.dtype
        self.format = parsed.format
        self.version = parsed.version
        self.files = parsed.files
        self.notes = parsed.notes
        self.passthrough = parsed.passthrough
        self.sources = SourcePool(options.max_open_files, opener=source_opener, wrapper=source_wrapper)
        # Pin every file now, while its header is fresh (sources otherwise open at the first read): a file
        # replaced or rewritten after that must give errors, or the old bytes, never new bytes read at the
        # old header's offsets.
        pinned = [self.sources.get(path) for path in parsed.files]
        #: What caches shared between processes and pickled tensors key on (``ckptfs.sources.identity``).
        self.content_id = checkpoint_content_id([source.content_id() for source in pinned])
        self.cache = cache if cache is not None else TieredCache([BlockCache(options.cache_size)])
        # Closed on collection: a checkpoint dropped without close() releases its descriptors, connections
        # and tiers. Not at interpreter exit: the process is ending, and a forked mount daemon's
        # copy must not be closed by its parent's exit.
        self._finalizer = weakref.finalize(self, _release, self.sources, self.cache)
        self._finalizer.atexit = False
        self.tensors = TensorList(self, parsed.tensors)
        self._by_name: dict[str, int] = {}
        self._stored_by_name: dict[str, int] = {}  # names a view stands in: the stored tensor's index
        for i, name in enumerate(self.tensors.names()):
            self._by_name.setdefault(name, i)
        self.packed_views: list[dict[str, Any]] = []
        self.activation_scales: list[str] = []  # stored scales of activations and the KV cache (packed.attach)
        if any(name in parsed.passthrough for name in ("config.json", "quantize_config.json")):
            feature("packed_views")(self)  # GPTQ/AWQ/compressed-tensors views; a plain file never imports them

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.parsed.metadata

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self.tensors[self._by_name[name]]
        except KeyError:
            raise KeyError(name) from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def add_virtual(self, tensor: Tensor, replaces: bool = False) -> None:
        """Append a virtual tensor (``tensor.index`` must be its position). A stored tensor of the same name
        wins, unless ``replaces``: then the view is ``ck[name]`` and the stored tensor ``ck.stored(name)``
        (an FP8 ``X.weight`` stored as F8_E4M3, whose dense view has the same name)."""
        stored = self._by_name.get(tensor.name)
        if replaces and (stored is None or stored >= len(self.parsed.tensors)):
            raise ValueError(f"no stored tensor {tensor.name!r} for the view to stand in for")
        self.tensors.append(tensor, stored if replaces else None)
        if replaces:
            assert stored is not None
            self._stored_by_name[tensor.name] = stored
            self._by_name[tensor.name] = tensor.index
        else:
            self._by_name.setdefault(tensor.name, tensor.index)

    def stored(self, name: str) -> Tensor:
        """The stored tensor ``name`` even where a view stands in its name (``ck.stored("X.weight")``: the
        F8_E4M3 codes of an FP8 layer, whose ``ck["X.weight"]`` is the dense view); KeyError for a name
        only a view has."""
        index = self._stored_by_name.get(name, self._by_name.get(name))
        if index is None or index >= len(self.parsed.tensors):
            raise KeyError(name)
        return self.tensors[index]

    def release_names(self) -> list[str]:
        """The names of the unquantized release's state dict: every decodable, undamaged tensor, a quantized
        layer's view under its name and none of the stored parts a present view is computed from
        (``qweight``, ``weight_scale_inv``, ``input_scale``...) nor the scales of activations and the KV cache
        no layer claims (``self_attn.k_scale``: ``activation_scales``), which the unquantized model has no
        parameter for. ``ckptfs.load``'s default and hf/'s tensors."""
        parts = {p for row in self.packed_views if row["present"] for p in row["parts"] if p != row["name"]}
        parts.update(self.activation_scales)
        return [n for n in self if n not in parts and self[n].decodable and not self[n].info.damaged]

    def damaged(self) -> list[Tensor]:
        return [self.tensors[i] for i in self.tensors.damaged_indices()]

    def close(self) -> None:
        """Release the sources' descriptors and connections and the cache tiers now (the memory tier's entries
        are dropped; shared tiers keep theirs). Afterwards every read raises CheckpointError ("the checkpoint
        is closed") rather than reopening a descriptor nobody would close; names, shapes, metadata and meta
        stay available. Closing again does nothing; a dropped checkpoint is closed on collection."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        # a repr ends up in logs and tracebacks: the source as every shown name is (no URL secret)
        return f"<ckptfs.Checkpoint {redact(repr(self.src))} {self.format} tensors={len(self.tensors)}>"


def open(src: PathOrUrl, *positional: Any, options: OpenOptions | None = None,
         **changes: Any) -> Checkpoint:
    """Open a checkpoint: a GGUF or safetensors file, a split-GGUF shard, a shard folder or an index file.

    Every field of :class:`OpenOptions` is a keyword (its signature below is generated from them), and
    ``dtype``, ``cache_size`` and ``max_open_files`` may also come by position; a keyword of None keeps the
    default. ``dtype`` "auto" (default), "float32" or "float16"; ``cache_size`` bytes of decoded groups kept
    in memory (default 512 MiB). ``cache_dir`` (bounded by ``cache_dir_size``, default 10G) and ``redis``
    (``redis://HOST:PORT/DB``) add decoded-group tiers shared with other processes and machines below the
    memory cache (ckptfs.cache), their entries authenticated with the key in ``cache_key_file``.
    ``manifest`` (a ``ckptfs manifest`` file or a loaded Manifest): every read of tensor bytes is checked
    against its chunk crc32s on first access (ckptfs.integrity.checked). ``src`` may be a URL (``http(s)://``,
    ``s3://``, ``hf://``); ``mirrors``: byte-identical copies read when a read from ``src`` fails; ``timeout``
    (default 30 s) bounds every remote read, failover included, and ``stall_timeout`` (default 10 s) each
    attempt's wait for bytes; ``cache_dir`` also keeps fetched remote bytes (ckptfs.sources.plan), keeping
    ``cache_dir_min_free`` percent of its file system free (default 5). ``options``: an :class:`OpenOptions`
    to start from (the keywords given change it); the checkpoint keeps the result as ``ck.options``, and its
    pickled tensors carry it. An unknown keyword is a TypeError."""
    names = OpenOptions.POSITIONAL
    if len(positional) > len(names):
        raise TypeError(f"open() takes {', '.join(names)} by position, not {len(positional)} values")
    twice = set(names[:len(positional)]) & set(changes)
    if twice:
        raise TypeError(f"open() got multiple values for {', '.join(sorted(twice))}")
    return open_with(src, OpenOptions.build(options, **dict(zip(names, positional)), **changes))


def _open_signature(cls: type[OpenOptions] = OpenOptions) -> inspect.Signature:
    """``open()``'s signature as ``help()`` and editors show it: ``src``, the fields ``cls.POSITIONAL`` names,
    then every other field keyword-only, then ``options``."""
    fields = {f.name: f for f, _ in spelled_fields(cls)}
    kinds = inspect.Parameter
    params = [kinds("src", kinds.POSITIONAL_OR_KEYWORD)]
    params += [kinds(name, kinds.POSITIONAL_OR_KEYWORD, default=fields[name].default) for name in cls.POSITIONAL]
    params += [kinds(name, kinds.KEYWORD_ONLY, default=field.default) for name, field in fields.items()
               if name not in cls.POSITIONAL]
    params.append(kinds("options", kinds.KEYWORD_ONLY, default=None))
    return inspect.Signature(params, return_annotation="Checkpoint")


open.__signature__ = _open_signature()  # type: ignore[attr-defined]


def source_plan(src: str, options: OpenOptions) -> SourcePlan | None:
    """The plan of ``src``'s sources (ckptfs.sources.plan.SourcePlan) when ``options`` need one (a URL,
    mirrors, a remote timeout), else None: a plain local open never imports the remote layer. The one place
    both ``open_with`` and a mount of a repository folder decide it."""
    if not options.needs_source_plan(src):
        return None
    from ckptfs.sources.plan import SourcePlan

    return SourcePlan(src, options)


def open_with(src: PathOrUrl, options: OpenOptions, plan: SourcePlan | None = None) -> Checkpoint:
    """Open ``src`` (a path, bytes or os.PathLike, or a URL) as ``options`` say. ``plan``: the ``source_plan``
    of ``src`` and ``options`` made before (``ckptfs prefetch`` opened the file with it to start its warm-up):
    the open reuses what that learnt (each file's probe, ``RemoteOptions.probes``) instead of asking again."""
    from ckptfs.formats.multi import read_checkpoint

    src = src if isinstance(src, str) else os.fsdecode(os.fspath(src))
    cache = None
    if options.shared_tiers:
        from ckptfs.cache.build import build_tiers
        cache = build_tiers(options)
    if plan is None:
        plan = source_plan(src, options)
    parsed = read_checkpoint(src, plan.header_opener() if plan is not None else DEFAULT_OPENER)
    wrapper = None
    if options.manifest is not None:
        wrapper = feature("checked_reads")(options.manifest, parsed)
    if plan is not None:
        wrapper = plan.wrapper(wrapper)
    return Checkpoint(parsed, src, options, cache=cache, source_wrapper=wrapper,
                      source_opener=plan.opener if plan is not None else None,
                      read_scope=plan.read_scope if plan is not None else None)


@contextlib.contextmanager
def opened(src: Checkpoint | PathOrUrl) -> Iterator[Checkpoint]:
    """``src`` as a Checkpoint: an open one as it is, a path or URL opened with the defaults and closed on
    leaving (``ckptfs.load``, ``load_batch`` and ``hf_folder`` take either)."""
    if isinstance(src, Checkpoint):
        yield src
        return
    ck = open(src)
    try:
        yield ck
    finally:
        ck.close()


def _release(sources: SourcePool, cache: TieredCache) -> None:
    """What closing a checkpoint releases (a function of its parts, not of it: a finalizer must not hold it)."""
    sources.close()
    cache.close()


class Reopened:
    """The checkpoints unpickled tensors reopened in a process (a DataLoader worker unpickles many), by
    source: a runtime's part, shared by the tensors of one checkpoint there."""

    def __init__(self) -> None:
        self.by_source: dict[str, list[Checkpoint]] = {}
        self.lock = threading.Lock()

    def in_child(self) -> Reopened:
        """In a forked child: the same checkpoints (their sources renew themselves), under a fresh lock."""
        self.lock = threading.Lock()
        return self


#: The default runtime's reopened checkpoints (an unpickled tensor names no runtime).
REOPENED = Part("checkpoints reopened by unpickled tensors", Reopened, Reopened.in_child)


def _reopen_tensor(src: str, options: OpenOptions, index: int, content_id: str | None = None) -> Tensor:
    """Unpickle a Tensor: reopen its checkpoint with the very same options, once per process (DataLoader
    workers unpickle many).

    The pickle carries the checkpoint's content identity: a checkpoint replaced since (an HF snapshot
    updated under a running DataLoader) is an error, never another tensor served silently under the old
    index. A checkpoint this process reopened earlier is reopened again if its identity no longer matches.
    """
    reopened = default_runtime().get(REOPENED)
    with reopened.lock:
        known = reopened.by_source.setdefault(src, [])
        ck = next((c for c in known if c.options == options and not c.closed), None)
        if ck is None or (content_id is not None and ck.content_id != content_id):
            if ck is not None:
                known.remove(ck)
            ck = open_with(src, options)
            known.append(ck)
    if content_id is not None and ck.content_id != content_id:
        raise CheckpointError(src, None, "the checkpoint changed since this tensor was pickled "
                                         "(its files were replaced or rewritten): reopen it")
    return ck.tensors[index]
