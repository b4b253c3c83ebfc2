"""Checked reads: a ByteSource that compares the manifest chunks a read covers, on first access.

``ckptfs.open(src, manifest=FILE)`` and ``ckptfs mount --manifest FILE`` wrap each file's source in a
``CheckedSource``. A read covering part of a tensor's stored bytes is widened to the whole ``chunk_size``
chunks it touches that are not yet known good; their crc32s are compared with the manifest's
``chunks_crc32`` and the requested bytes are cut from the same buffer, so a checked read costs one pass
over the chunks it covers and a remote read stays lazy (a 1 MiB chunk, not the whole tensor). A chunk
found good is remembered for as long as the file keeps its identity (size, mtime, ctime, inode: the
source's ``identity``), so later reads of it cost nothing extra.

A file's header (the bytes before its first tensor: GGUF metadata and tensor infos, the safetensors JSON) is
checked once, when the file is opened: its sha256 must be the manifest's ``header_sha256``, else the open (and
the mount) fails with one line naming the file. What the header says was parsed already by then, and
``metadata.json``, a tensor's shape and the mount's own copy of the file are served from it, so a header
checked on first read would come too late. A manifest written before ``header_sha256`` existed checks no
header, and says so once (``warn_without_header_hashes``). Padding between tensors is passed through
unchecked; the tensors the header names must match the manifest's (``ManifestCheck``).

A mismatch raises ``IntegrityError`` (a ``CheckpointError``) naming the tensor, the chunk and both crc32s:
the mount answers EIO with that one log line, and a mirror layer (``Mirror(Checked(primary),
Checked(mirror), ...)``) takes it as a failed read and asks the next source, whose bytes are checked the
same way.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from ckptfs.core.descriptors import ParsedCheckpoint
from ckptfs.core.errors import CheckpointError, IntegrityError
from ckptfs.sources.base import ByteSource
from ckptfs.integrity.crc import crc32
from ckptfs.integrity.manifest import (Manifest, TensorEntry, file_names, header_end, header_sha256, load_manifest,
                                       warn_without_header_hashes)


class ManifestCheck:
    """A manifest matched to one checkpoint: which manifest entries each of its files holds, and the chunks
    already found good (shared by every wrapper of a file with the same identity)."""

    def __init__(self, manifest: Manifest, parsed: ParsedCheckpoint, where: str = "manifest"):
        self.manifest = manifest
        self.where = where
        names = _manifest_names(list(parsed.files), manifest)
        self._file_entry = {path: manifest.file(name) for path, name in names.items()}
        _check_same_tensors(manifest, parsed, names, where)
        self._tensors: dict[str, list[TensorEntry]] = {path: [] for path in parsed.files}
        by_name = {name: path for path, name in names.items()}
        for t in manifest.tensors:
            if t.stored_nbytes:
                self._tensors[by_name[t.file]].append(t)
        self._index = {path: _Index(sorted(ts, key=lambda t: t.offset)) for path, ts in self._tensors.items()}
        self._verified: dict[tuple, list[bytearray]] = {}
        self._first: dict[str, list[int]] = {path: [] for path in parsed.files}  # each file's first tensor offset
        for info in parsed.tensors:
            first = self._first[info.source]
            if not first or info.offset < first[0]:
                first[:] = [info.offset]
        self._headers_ok: set[tuple] = set()  # (path, identity) of the files whose header matched
        warn_without_header_hashes(manifest, where)

    def wrap(self, source: ByteSource, path: str | None = None) -> ByteSource:
        """``source`` checked against the manifest entries of checkpoint file ``path`` (default: the source's
        name; a mirror passes the name of the file it stands in for). Sources of other files pass through."""
        path = source.name if path is None else path
        entry = self._file_entry.get(path)
        if entry is None:
            return source
        if source.size != entry.size:
            raise CheckpointError(source.name, None, f"size {source.size} bytes, the manifest {self.where} says "
                                                     f"{entry.size}: not the file the manifest describes")
        key = (path, source.identity)
        if entry.header_sha256 is not None and key not in self._headers_ok:
            self._check_header(source, path, entry.header_sha256)
            self._headers_ok.add(key)
        verified = self._verified.get(key)
        if verified is None:
            verified = self._verified.setdefault(key, [bytearray(len(t.chunks_crc32)) for t in self._index[path].entries])
        return CheckedSource(source, self._index[path], verified, self.manifest.chunk_size)

    def _check_header(self, source: ByteSource, path: str, expected: str) -> None:
        """IntegrityError unless the header of ``source`` (checkpoint file ``path``) hashes to ``expected``."""
        end = header_end(self._first[path], source.size)
        got = header_sha256(source, end)
        if got != expected:
            raise IntegrityError(source.name, None, f"its header (bytes 0..{end}: metadata and tensor infos) differs "
                                                    f"from the manifest {self.where} (sha256 {got[:16]}..., manifest "
                                                    f"{expected[:16]}...): not the checkpoint the manifest describes")

    def __call__(self, source: ByteSource) -> ByteSource:
        """The ``source_wrapper`` hook of ``Checkpoint``."""
        return self.wrap(source)


def checked_wrapper(manifest: Manifest | str, parsed: ParsedCheckpoint) -> ManifestCheck:
    """A ``source_wrapper`` for ``Checkpoint``: a manifest (or the path of one) matched to ``parsed``."""
    if isinstance(manifest, Manifest):
        return ManifestCheck(manifest, parsed)
    path = str(manifest)
    return ManifestCheck(load_manifest(path), parsed, path)


class _Index:
    """A file's tensor entries sorted by offset, with the furthest end reached so far, so that the entries
    overlapping a byte range are found by bisection even where tensors share bytes."""

    def __init__(self, entries: Sequence[TensorEntry]):
        self.entries = list(entries)
        self.starts = [t.offset for t in self.entries]
        self.reach: list[int] = []
        furthest = 0
        for t in self.entries:
            furthest = max(furthest, t.end)
            self.reach.append(furthest)

    def overlapping(self, lo: int, hi: int) -> list[int]:
        found = []
        j = bisect_left(self.starts, hi) - 1
        while j >= 0 and self.reach[j] > lo:
            if self.entries[j].end > lo:
                found.append(j)
            j -= 1
        return found


class CheckedSource(ByteSource):
    """A ByteSource whose reads of tensor bytes are checked against manifest chunk crc32s (module docstring)."""

    def __init__(self, inner: ByteSource, index: _Index, verified: list[bytearray], chunk_size: int):
        self.inner = inner
        self.name = inner.name
        self.size = inner.size
        self.identity = inner.identity
        self.mtime_ns = inner.mtime_ns  # the mount's file times are the file's, checked or not
        self._index = index
        self._verified = verified
        self._chunk = chunk_size

    @property
    def fetches_ahead(self) -> bool:
        return self.inner.fetches_ahead

    @property
    def wrapped(self) -> ByteSource:
        """The source whose bytes are checked (``WrapsSource``)."""
        return self.inner

    def _unchecked(self, lo: int, hi: int) -> list[tuple[int, int, int, int]]:
        """(entry index, chunk number, start, end) of every chunk overlapping [lo, hi) not yet found good."""
        todo = []
        cs = self._chunk
        for j in self._index.overlapping(lo, hi):
            t = self._index.entries[j]
            done = self._verified[j]
            first = (max(lo, t.offset) - t.offset) // cs
            last = (min(hi, t.end) - 1 - t.offset) // cs
            for k in range(first, last + 1):
                if not done[k]:
                    start = t.offset + k * cs
                    todo.append((j, k, start, min(start + cs, t.end)))
        return todo

    def pread(self, offset: int, size: int) -> bytes:
        if size <= 0:
            return b""
        todo = self._unchecked(offset, offset + size)
        if not todo:
            return self.inner.pread(offset, size)
        lo = min(offset, min(c[2] for c in todo))
        hi = max(offset + size, max(c[3] for c in todo))
        data = self.inner.pread(lo, hi - lo)
        view = memoryview(data)
        for j, k, start, end in todo:
            t = self._index.entries[j]
            got = crc32(view[start - lo:end - lo])
            if got != t.chunks_crc32[k]:
                raise IntegrityError(self.name, start, f"tensor {t.name!r}: stored bytes {start}..{end} (chunk {k} of "
                                                       f"{len(t.chunks_crc32)}) differ from the manifest (crc32 "
                                                       f"{got:08x}, manifest {t.chunks_crc32[k]:08x})")
            self._verified[j][k] = 1
        if lo == offset and hi == offset + size:
            return data
        return bytes(view[offset - lo:offset - lo + size])

    def checked_chunks(self) -> int:
        return sum(sum(v) for v in self._verified)

    # -- the rest of the protocol is the inner source's
    def content_id(self) -> str:
        return self.inner.content_id()

    def advise(self, offset: int, size: int, sequential: bool = False) -> None:
        self.inner.advise(offset, size, sequential)

    @property
    def is_open(self) -> bool:
        return self.inner.is_open

    def ensure_open(self) -> None:
        self.inner.ensure_open()

    def close_if_idle(self) -> bool:
        return self.inner.close_if_idle()

    def stats(self) -> dict:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()


def _manifest_names(paths: list[str], manifest: Manifest) -> dict[str, str]:
    """Each checkpoint file -> its manifest file name; a one-file checkpoint matches a one-file manifest
    whatever the file is called now (checkpoints get renamed)."""
    names = file_names(paths)
    if len(paths) == 1 and len(manifest.files) == 1:
        return {paths[0]: manifest.files[0].name}
    return names


def _check_same_tensors(manifest: Manifest, parsed: ParsedCheckpoint, names: dict[str, str], where: str) -> None:
    """Refuse a manifest of another checkpoint: same files, and the same tensors at the same places."""

    def fail(reason: str) -> CheckpointError:
        return CheckpointError(where, None, f"the manifest does not describe this checkpoint: {reason}")

    listed = {f.name for f in manifest.files}
    for path, name in names.items():
        if name not in listed:
            raise fail(f"it has no file {name!r}")
    if len(listed) != len(names):
        extra = sorted(listed - set(names.values()))
        raise fail(f"the checkpoint has no file {extra[0]!r}")
    mine = sorted((names[i.source], i.offset, i.stored_nbytes, i.name) for i in parsed.tensors)
    theirs = sorted((t.file, t.offset, t.stored_nbytes, t.name) for t in manifest.tensors)
    if mine != theirs:
        a, b = set(mine), set(theirs)
        only_mine = sorted(a - b)
        if only_mine:
            file, offset, nbytes, name = only_mine[0]
            raise fail(f"tensor {name!r} at {file} bytes {offset}..{offset + nbytes} is not in it")
        file, offset, nbytes, name = sorted(b - a)[0] if b - a else theirs[0]
        raise fail(f"it lists tensor {name!r} at {file} bytes {offset}..{offset + nbytes}, the checkpoint does not")
