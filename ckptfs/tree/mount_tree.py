"""The files a mount shows: paths -> Views, built from a Checkpoint by *providers*. Knows nothing of FUSE.

A provider is a function ``provider(checkpoint) -> iterable of Entry``: one kind of file, such as the three
files of every tensor, ``metadata.json``, a model folder's pass-through files, or a virtual folder (``hf/``)
that an opt-in feature adds. :class:`MountTree` composes them; a new kind of file is one provider. Paths may
hold ``/``: folders are created implicitly, so a provider can add a whole folder.

Default content: for every tensor ``STEM.raw`` and ``STEM.meta.json``, and ``STEM.npy`` when the tensor can be
decoded (unknown storage types are raw-only; a virtual tensor — a GPTQ/AWQ view — has no ``.raw``; a view
standing in a stored tensor's name — FP8's ``X.weight`` — serves that stem's ``.npy`` and ``.meta.json``,
the stored tensor its ``.raw``); then
``metadata.json``; then a model folder's other files, passed through; then the checkpoint's own files (the
file named, or every shard) under their own names. Tensor files and ``metadata.json`` win a name clash with a
pass-through or checkpoint file, which then gets ``~2``, ``~3``... before its extension, so nothing the
checkpoint or its folder holds is dropped. For every later provider the earlier entry wins and the clashing one is left out with a log line.
Views are created on first lookup; JSON is built on first access.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import stat
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import ClassVar

import numpy as np

from ckptfs.checkpoint.api import Checkpoint, decode_plan
from ckptfs.formats.lazy import LazyMetadata
from ckptfs.util.jsonutil import dumps_bytes
from ckptfs.util.redact import strip_url
from ckptfs.util.names import assign_stems, capped_name, file_name, numbered_name
from ckptfs.tree.ownership import Ownership, Stamps, as_folder, check_pinned, of_file, of_folder
from ckptfs.engine.views import BytesView, FileView, NpyView, RawView, View, npy_header

log = logging.getLogger(__name__)

METADATA_FILE = "metadata.json"
#: A file's size is a signed 64-bit off_t.
MAX_FILE_BYTES = (1 << 63) - 1


@dataclass(frozen=True)
class Entry:
    """One file of a mount: where it is, what kind it is (a metrics label: npy, raw, json, file, hf), how to
    make its view (called once, on first lookup), and for a file passed through unchanged, the path of the
    file it is (``origin``: its owner and mode are the entry's, and it is pinned to that file as mounted).
    A file made from the checkpoint's files names the other files it is made from too (``made_from``: a
    folder's config and tokenizer files): it is readable only by those who may read every one of them."""

    path: str
    kind: str
    make_view: Callable[[], View]
    origin: str | None = None
    made_from: tuple[str, ...] = ()


Provider = Callable[[Checkpoint], Iterable[Entry]]


def _npy_fits_in_a_file(shape: tuple[int, ...], dtype, nbytes: int) -> bool:
    """False for a tensor that decodes to more than a file can hold (a hostile header: say 2^62 Q4_0 elements
    are 2^64 bytes of float32). Its .npy is left out: listed, its size would wrap around to the header's."""
    if nbytes < 1 << 62:
        return True
    return len(npy_header(shape, dtype)) + nbytes <= MAX_FILE_BYTES


def tensor_stems(ck: Checkpoint, stemmer: Callable[[list[str]], list[str]] = assign_stems) -> list[str]:
    """The file stem of every tensor of ``ck``, in order (``stemmer``: names.assign_stems, escaped, numbered,
    capped; or a layout's). A view that stands in a stored tensor's name (an FP8 ``X.weight``) has that
    tensor's stem: it serves the stem's ``.npy`` and ``.meta.json``, the stored tensor its ``.raw``."""
    names = ck.tensors.names()
    replaced = ck.tensors.replaced()
    own = [i for i in range(len(names)) if i not in replaced]
    stems = [""] * len(names)
    for i, stem in zip(own, stemmer([names[i] for i in own])):
        stems[i] = stem
    for view, stored in replaced.items():
        stems[view] = stems[stored]
    return stems


class TensorFiles:
    """What the tensor-files provider returns: ``STEM.npy`` (decodable tensors), ``STEM.raw`` (stored tensors)
    and ``STEM.meta.json`` of every tensor, as one stem per tensor rather than an entry per file.

    A 94,000-tensor checkpoint has 282,000 such files; the tree keeps a stem -> tensor index table and
    resolves ``STEM + suffix`` on lookup, and names the files only when a folder is listed. Iterating gives
    the same files as :class:`Entry` values, for anything that wants them one by one.
    """

    SUFFIXES = ((".npy", "npy"), (".raw", "raw"), (".meta.json", "json"))
    SUFFIX_OF: ClassVar[dict[str, str]] = {kind: suffix for suffix, kind in SUFFIXES}

    def __init__(self, ck: Checkpoint, stems: Sequence[str] | None = None):
        self.ck = ck
        self.stems = list(stems) if stems is not None else tensor_stems(ck)
        self.replacing = ck.tensors.replaced()     # view index -> the stored index whose name it stands in
        self._view_of = {stored: view for view, stored in self.replacing.items()}
        self._dtypes: dict[tuple[str, int, str], np.dtype | None] = {}  # served dtype by storage layout
        self._next_stored: dict[int, int] | None = None  # tensor index -> the index stored after it

    def resolve(self, index: int, kind: str) -> int:
        """The tensor serving file ``kind`` of stem ``index``: the view standing in a stored tensor's name
        serves its ``.npy`` and ``.meta.json``."""
        view = self._view_of.get(index)
        return index if view is None or kind == "raw" else view

    def kinds(self, index: int) -> tuple[str, ...]:
        """The kinds of file tensor ``index`` has, in listing order (a view standing in a stored tensor's
        name has none of its own: they are listed under the stored tensor's stem)."""
        if index in self.replacing:
            return ()
        view = self._view_of.get(index)
        if view is not None:
            return ("npy",) * ("npy" in self._kinds(view)) + ("raw", "json")
        return self._kinds(index)

    def _kinds(self, index: int) -> tuple[str, ...]:
        tensor = self.ck.tensors.made(index)
        if tensor is not None:
            npy = (tensor.dtype is not None and tensor.nbytes is not None
                   and _npy_fits_in_a_file(tensor.shape, tensor.dtype, tensor.nbytes))  # decodable
            raw = not tensor.virtual
        else:  # from the descriptor's columns: listing 94k tensors makes no Tensor (nor TensorInfo) objects
            storage_type, block_elements, byte_order, shape = self.ck.tensors.layout(index)
            key = (storage_type, block_elements, byte_order)
            if key not in self._dtypes:
                self._dtypes[key] = decode_plan(self.ck.tensors.info(index), self.ck.dtype_mode)[1]
            dtype = self._dtypes[key]
            npy = dtype is not None and _npy_fits_in_a_file(shape, dtype, math.prod(shape) * dtype.itemsize)
            raw = True
        return ("npy",) * npy + ("raw",) * raw + ("json",)

    def view(self, index: int, kind: str) -> View:
        index = self.resolve(index, kind)
        tensor = self.ck.tensors[index]
        view: View
        if kind == "npy":
            view = NpyView(tensor.data)
        elif kind == "raw":
            view = RawView(tensor.info, self.ck.sources)
        else:
            return BytesView(lambda: dumps_bytes(tensor.meta))
        view.following = functools.partial(self.following, index, kind)
        view.slot = (self.ck.content_id, kind, index)  # which file it is, for read-ahead to recognize it
        return view

    def following(self, index: int, kind: str) -> View | None:
        """The same kind of file of the tensor stored right after tensor ``index`` in its file: what a reader
        streaming a checkpoint's tensors in file order (a loader, ``cp -r``) opens next, so read-ahead can
        start on it before it is opened. None at a file's last tensor, or when that tensor has no such file."""
        if self._next_stored is None:
            positions = self.ck.tensors.positions()
            order = sorted(range(len(positions)), key=positions.__getitem__)
            self._next_stored = {a: b for a, b in pairwise(order)
                                 if positions[a][0] == positions[b][0] and positions[b][1] > positions[a][1]}
        following = self._next_stored.get(index)
        if following is None or kind not in self.kinds(following):
            return None
        return self.view(following, kind)

    def __iter__(self) -> Iterator[Entry]:
        suffix = self.SUFFIX_OF
        for index, stem in enumerate(self.stems):
            for kind in self.kinds(index):
                yield Entry(stem + suffix[kind], kind, functools.partial(self.view, index, kind))


def tensor_files(ck: Checkpoint, stems: Sequence[str] | None = None) -> TensorFiles:
    """Every tensor's files; ``stems`` may place them elsewhere (a tree layout passes stems with folders)."""
    return TensorFiles(ck, stems)


def metadata_file(ck: Checkpoint) -> Iterable[Entry]:
    def build() -> View:
        metadata = ck.metadata
        # lazy mappings: don't keep decoded copies
        value_of = metadata.peek if isinstance(metadata, LazyMetadata) else metadata.__getitem__
        return BytesView(lambda: dumps_bytes({key: value_of(key) for key in metadata}))

    yield Entry(METADATA_FILE, "json", build)


def passthrough_files(ck: Checkpoint) -> Iterable[Entry]:
    """A model folder's other files under their own names (the tree numbers a clashing one)."""
    for name, path in sorted(ck.passthrough.items()):
        yield Entry(name, "file", functools.partial(FileView, path, ck.sources), path)


def checkpoint_files(ck: Checkpoint) -> Iterable[Entry]:
    """The checkpoint's own files (the file named, a split set's shards, a model folder's shards) under their
    own names, byte for byte, so that a tool that loads files rather than tensors (llama.cpp, ``from_pretrained``,
    vLLM) loads them through the mount, a remote one fetched per range as read. Read through the checkpoint's
    own pool: the sources its tensors are served from, pinned at open, never a second reader."""
    for path in ck.files:
        yield Entry(own_name(path, ck.format), "file", functools.partial(FileView, path, ck.sources), path)


def own_name(path: str, file_format: str = "gguf") -> str:
    """The name a checkpoint file has in a mount: the last part of its path, or of a URL's path (no query, no
    fragment: a presigned URL's signature is not a name; an ``http(s)`` name percent-decoded, then escaped
    and capped as a tensor name is — bytes that are not UTF-8 stay ``%XX``; an ``hf://`` name, raw, the same;
    any name past 255 bytes is cut with a hash: names.file_name, names.capped_name)."""
    if "://" not in path:
        return os.path.basename(path.rstrip("/")) or f"model.{file_format}"
    scheme, _, rest = strip_url(path).partition("://")
    name = rest.rstrip("/").rsplit("/", 1)[-1] if "/" in rest.rstrip("/") else ""
    decoded = scheme.lower() in ("http", "https")
    if decoded:
        name = urllib.parse.unquote_to_bytes(name).decode("utf-8", "surrogateescape")
    if not name or name in (".", ".."):
        return f"model.{file_format}"
    return file_name(name) if decoded or scheme.lower() == "hf" else capped_name(name)


def _numbered_path(path: str, n: int) -> str:
    folder, slash, name = path.rpartition("/")
    return folder + slash + numbered_name(name, n)


DEFAULT_PROVIDERS: tuple[Provider, ...] = (tensor_files, metadata_file, passthrough_files, checkpoint_files)
#: Providers of files a checkpoint or its folder really holds: on a clash they are numbered, never left out.
RENUMBERED = (passthrough_files, checkpoint_files)


class MountTree:
    """Folders of views over one checkpoint, composed from providers (see the module docstring).

    ``extra`` providers come after the defaults (opt-in folders such as ``hf/``); ``providers`` replaces the
    defaults altogether. ``stamps``: the local files' stamps taken when the mount was made (a repository's
    checkpoint is opened later, and must be the files stamped then); by default they are taken now, and the
    checkpoint's files must be the ones its sources opened (``tree.ownership``).
    """

    def __init__(self, checkpoint: Checkpoint, providers: Sequence[Provider] | None = None,
                 extra: Sequence[Provider] = (), stamps: Stamps | None = None):
        self.checkpoint = checkpoint
        self._stamps = stamps if stamps is not None else Stamps()
        self._stamps.take([*checkpoint.files, *checkpoint.passthrough.values()])  # the pins
        for path in checkpoint.files:
            check_pinned(path, checkpoint.sources.get(path).identity, self._stamps.get(path))
        #: path -> (kind, make_view, origin, the files it is made from when it has no origin)
        self._entries: dict[str, tuple[str, Callable[[], View], str | None, tuple[str, ...]]] = {}
        self._dirs: dict[str, list[str]] = {"": []}
        self._tensor_files: TensorFiles | None = None
        self._stem_index: dict[str, int] = {}        # tensor file stem (with folders) -> tensor index
        self._members: dict[str, list[int]] = {}     # folder -> the tensors whose files it holds
        self._tensor_file_count: int | None = None
        for provider in (list(providers) if providers is not None else list(DEFAULT_PROVIDERS)) + list(extra):
            files = provider(checkpoint)
            if isinstance(files, TensorFiles) and self._tensor_files is None:
                self._add_tensor_files(files)
                continue
            renumber = provider in RENUMBERED
            for entry in files:
                self._add(entry, renumber)
        self.mtime_ns = max((s.mtime_ns for s in checkpoint.sources.sources()), default=0)
        self._views: dict[str, View] = {}
        self._lock = threading.Lock()
        self._tensor_sources: list[str] | None = None  # the file of each stored tensor, when first asked

    def _root_owner(self) -> Ownership | None:
        """The root's owner and mode: a folder's own (a folder mount); else r-x for the readers of the
        checkpoint's files (a single-file mount); walled in by the folders above it; None when remote."""
        src = self.checkpoint.src if isinstance(self.checkpoint.src, str) else None
        folder = self._stamps.now(src) if src is not None else None
        if folder is not None and stat.S_ISDIR(folder.mode):
            return self._stamps.walled(of_folder(folder), src)
        readers = self._stamps.readers(self.checkpoint.files)
        if readers is None:
            return None
        return as_folder(readers) if src is None else self._stamps.walled(as_folder(readers), src)

    def _add_tensor_files(self, files: TensorFiles) -> None:
        """Tensor files come first and always keep their names: only their stems are recorded."""
        self._tensor_files = files
        for index, stem in enumerate(files.stems):
            if index in files.replacing:  # its files are under the stored tensor's stem
                continue
            self._stem_index[stem] = index
            folder = stem.rpartition("/")[0]
            if folder:
                self._make_dirs(folder)
            self._members.setdefault(folder, []).append(index)

    def _tensor_file(self, path: str) -> tuple[int, str] | None:
        """(tensor index, kind) when ``path`` is one of the tensors' files."""
        if self._tensor_files is None:
            return None
        for suffix, kind in TensorFiles.SUFFIXES:
            if path.endswith(suffix):
                index = self._stem_index.get(path[:-len(suffix)])
                if index is not None and kind in self._tensor_files.kinds(index):
                    return self._tensor_files.resolve(index, kind), kind
                return None
        return None

    def _taken(self, path: str) -> bool:
        return path in self._entries or path in self._dirs or self._tensor_file(path) is not None

    def _add(self, entry: Entry, renumber: bool) -> None:
        path = entry.path
        if renumber and self._taken(path):
            n = 1
            while self._taken(path):
                n += 1
                path = _numbered_path(entry.path, n)
        parent, _, name = path.rpartition("/")
        if self._taken(path) or not name or not self._make_dirs(parent):
            log.warning("left out %s: the name is taken", path)
            return
        made_from = () if entry.origin is not None else tuple(dict.fromkeys([*self.checkpoint.files, *entry.made_from]))
        self._entries[path] = (entry.kind, entry.make_view, entry.origin, made_from)
        self._dirs[parent].append(name)

    def _make_dirs(self, folder: str) -> bool:
        """Create ``folder`` and its parents; False if a file already has one of their names."""
        if folder in self._dirs:
            return True
        if folder in self._entries or self._tensor_file(folder) is not None:
            return False
        parent, _, name = folder.rpartition("/")
        if not name or not self._make_dirs(parent):
            return False
        self._dirs[folder] = []
        self._dirs[parent].append(name)
        return True

    def names(self) -> list[str]:
        """The names in the mount's root folder."""
        return self.listdir("") or []

    def listdir(self, folder: str) -> list[str] | None:
        """The names in ``folder`` ("" is the root), or None if it is not a folder. Tensor files first, in
        tensor order; then sub-folders and other files in the order they were added."""
        return None if folder not in self._dirs else list(self.iter_listdir(folder))

    def iter_listdir(self, folder: str) -> Iterator[str]:
        """The names of ``listdir`` one at a time (a listing of 282,000 names need not exist as a list)."""
        members = self._members.get(folder)
        if members:
            files = self._tensor_files
            assert files is not None  # members are tensor files
            suffix = TensorFiles.SUFFIX_OF
            for index in members:
                leaf = files.stems[index].rpartition("/")[2]
                for kind in files.kinds(index):
                    yield leaf + suffix[kind]
        yield from self._dirs.get(folder, ())

    def is_dir(self, path: str) -> bool:
        return path in self._dirs

    def kind(self, path: str) -> str | None:
        entry = self._entries.get(path)
        if entry is not None:
            return entry[0]
        found = self._tensor_file(path)
        return found[1] if found is not None else None

    def __contains__(self, path: str) -> bool:
        return path in self._entries or self._tensor_file(path) is not None

    def __len__(self) -> int:
        """How many files (not folders) the mount holds."""
        if self._tensor_file_count is None:
            files = self._tensor_files
            self._tensor_file_count = 0 if files is None else sum(len(files.kinds(i)) for i in range(len(files.stems)))
        return len(self._entries) + self._tensor_file_count

    def view(self, path: str) -> View | None:
        """The view serving file ``path`` (relative to the root, ``/``-separated), or None if there is none."""
        view = self._views.get(path)
        if view is not None:
            return view
        entry = self._entries.get(path)
        if entry is None:
            found = self._tensor_file(path)
            if found is None:
                return None
            files = self._tensor_files
            assert files is not None  # found is a tensor file
            make: Callable[[], View] = functools.partial(files.view, *found)
        elif entry[2] is not None:
            make = functools.partial(self._pinned_view, entry[1], entry[2])
        else:
            make = entry[1]
        with self._lock:
            view = self._views.get(path)
            if view is None:
                view = self._views[path] = make()
        return view

    def _pinned_view(self, make: Callable[[], View], origin: str) -> View:
        """The view of a file passed through, once its source is known to be the file stamped at mount."""
        view = make()
        check_pinned(origin, self.checkpoint.sources.get(origin).identity, self._stamps.get(origin))
        return view

    def owner(self, path: str) -> Ownership | None:
        """The owner and permission bits of file or folder ``path`` (``tree.ownership``), or None for the
        mounting user's with 0444/0555 (a remote file, a folder that only sorts names)."""
        if path == "":
            return self._root_owner()
        entry = self._entries.get(path)
        if entry is not None:
            if entry[2] is None:
                return self._stamps.readers(entry[3])
            stamp = self._stamps.now(entry[2])
            return None if stamp is None else of_file(stamp, keep_execute=True)
        found = self._tensor_file(path)
        return None if found is None else self._tensor_owner(found[0])

    def _tensor_owner(self, index: int) -> Ownership | None:
        if self._tensor_sources is None:  # once, from the columns: `ls -l` of 282,000 files makes no TensorInfo
            self._tensor_sources = [source for source, _ in self.checkpoint.tensors.positions()]
        if index >= len(self._tensor_sources):  # a virtual tensor (a view of packed parts): perhaps of several files
            return self._stamps.readers(self.checkpoint.files)
        stamp = self._stamps.now(self._tensor_sources[index])
        return None if stamp is None else of_file(stamp, keep_execute=False)

    # -- what the filesystem asks of the checkpoints behind the tree (a repository tree has several) --------

    @property
    def sources(self):
        """The pool the mount's read-ahead advises through."""
        return self.checkpoint.sources

    @property
    def cache(self):
        """The cache the mount's stats report (its ``capacity`` bounds the read-ahead)."""
        return self.checkpoint.cache

    @property
    def read_scope(self):
        """Makes the scope each FUSE read passes down (``--timeout``: remote checkpoints), or None."""
        return self.checkpoint.read_scope

    def each_checkpoint(self, hook: Callable[[Checkpoint], None]) -> None:
        hook(self.checkpoint)

    def stored_bytes(self) -> int:
        return sum(self.checkpoint.sources.get(f).size for f in self.checkpoint.files)

    def close(self) -> None:
        self.checkpoint.close()

    def stats(self) -> dict:
        """Counters for monitoring and benchmarks: the memory cache (``cache``, as always), every configured
        tier (``tiers``), the decoder's output (``decoded_bytes``), open files."""
        cache = self.checkpoint.cache
        return {"cache": cache.stats().as_dict(), "tiers": cache.tier_stats(),
                "decoded_bytes": cache.decoded_bytes,
                "open_files": self.checkpoint.sources.open_count(), "files": len(self)}
