"""Checked reads: a ByteSource that compares the manifest chunks a read covers, on first access.

``ckptfs.open(src, manifest=FILE)`` and ``ckptfs mount --manifest FILE`` wrap each file's source in a
``CheckedSource``. A read covering part of a tensor's stored bytes is widened to the whole ``chunk_size``
chunks it touches that are not yet known good; their crc32s are compared with the manifest's
``chunks_crc32`` and the requested bytes are cut from the same buffer, so a checked read costs one pass
over the chunks it covers and a remote read stays lazy (a 1 MiB chunk, not the whole tensor). A chunk
found good is remembered for as long as the file keeps its identity (size, mtime, ctime, inode: the
source's ``identity``), so later reads of it cost nothing extra.

A file's header (the bytes before its first tensor: GGUF metadata and tensor infos, the safetensors JSON) is
checked when the file is opened: its sha256 must be the manifest's ``header_sha256``, else the open (and
the mount) fails with one line naming the file. A file the mount passes through or a view reads (a model
folder's ``config.json``, tokenizer files, chat template: listed in the manifest without tensors) is all
header: its whole sha256 is checked when it is opened, so a tampered ``config.json`` is never served, nor
built into ``gguf/``. A manifest written before it listed those files checks only the weights, and says so
once. What the header says was parsed already by then, and ``metadata.json``, a tensor's shape and the
mount's own copy of the file are served from it, so a header checked on first read would come too late. A
manifest written before ``header_sha256`` existed checks no header, and says so once
(``warn_without_header_hashes``). Padding between tensors is passed through unchecked; the tensors the
header names must match the manifest's (``ManifestCheck``).

A change the mtime hides is caught: when the source sees its file's ctime change (``ByteSource.changes``:
a ``chmod``, a ``chown``, or an in-place rewrite followed by ``touch -r``), everything found good of that
file is forgotten, so each chunk (and the header) is verified again before it is served; a read during
which the ctime changed is read and checked again. A ``chmod`` mid-stream costs one more check of the
chunks read after it; a rewrite is an ``IntegrityError``.

A mismatch raises ``IntegrityError`` (a ``CheckpointError``) naming the tensor, the chunk and both crc32s:
the mount answers EIO with that one log line, and a mirror layer (``Mirror(Checked(primary),
Checked(mirror), ...)``) takes it as a failed read and asks the next source, whose bytes are checked the
same way.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from ckptfs.core.descriptors import ParsedCheckpoint
from ckptfs.core.errors import CheckpointError, IntegrityError
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.sources.base import ByteSource
from ckptfs.integrity.crc import crc32
from ckptfs.core.runtime import runtime
from ckptfs.integrity.manifest import (MANIFEST_WARNINGS, Manifest, TensorEntry, file_names, header_end, header_sha256,
                                       load_manifest, warn_without_header_hashes)

log = logging.getLogger(__name__)

#: Reads of one request when the file's ctime keeps changing while it is read, before it is an error.
RECHECKS = 3


class ManifestCheck:
    """A manifest matched to one checkpoint: which manifest entries each of its files holds, and the chunks
    already found good (shared by every wrapper of a file with the same identity)."""

    def __init__(self, manifest: Manifest, parsed: ParsedCheckpoint, where: str = "manifest"):
        self.manifest = manifest
        self.where = where
        names = _manifest_names(list(parsed.files), manifest)
        others = _other_files(parsed, manifest, where)
        self._file_entry = {path: manifest.file(name) for path, name in {**names, **others}.items()}
        _check_same_tensors(manifest, parsed, names, where, set(others.values()))
        self._tensors: dict[str, list[TensorEntry]] = {path: [] for path in [*parsed.files, *others]}
        by_name = {name: path for path, name in names.items()}
        for t in manifest.tensors:
            if t.stored_nbytes:
                self._tensors[by_name[t.file]].append(t)
        self._index = {path: _Index(sorted(ts, key=lambda t: t.offset)) for path, ts in self._tensors.items()}
        self._verified: dict[tuple, list[bytearray]] = {}
        # each file's first tensor offset (none: a file without tensors is all header)
        self._first: dict[str, list[int]] = {path: [] for path in self._tensors}
        for info in parsed.tensors:
            first = self._first[info.source]
            if not first or info.offset < first[0]:
                first[:] = [info.offset]
        self._headers: dict[tuple, _HeaderCheck] = {}  # (path, identity) -> its header's check
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
        header = self._headers.get(key)
        if header is None and entry.header_sha256 is not None:
            end = header_end(self._first[path], source.size)
            header = self._headers.setdefault(key, _HeaderCheck(end, entry.header_sha256, self.where,
                                                                whole=not self._first[path]))
        verified = self._verified.get(key)
        if verified is None:
            verified = self._verified.setdefault(key, [bytearray(len(t.chunks_crc32)) for t in self._index[path].entries])
        checked = CheckedSource(source, self._index[path], verified, self.manifest.chunk_size, header)
        if header is not None and not header.ok:
            header.check(source)
        return checked

    def __call__(self, source: ByteSource) -> ByteSource:
        """The ``source_wrapper`` hook of ``Checkpoint``."""
        return self.wrap(source)


def checked_wrapper(manifest: Manifest | str, parsed: ParsedCheckpoint) -> ManifestCheck:
    """A ``source_wrapper`` for ``Checkpoint``: a manifest (or the path of one) matched to ``parsed``."""
    if isinstance(manifest, Manifest):
        return ManifestCheck(manifest, parsed)
    path = str(manifest)
    return ManifestCheck(load_manifest(path), parsed, path)


class _HeaderCheck:
    """A file's header (bytes 0..``end``) and the sha256 the manifest gives it; ``ok`` once the bytes there
    were found to match (shared by every wrapper of the file; cleared when its ctime changes). ``whole``: a
    file without tensors (a folder's config or tokenizer file), whose header is all of it."""

    def __init__(self, end: int, expected: str, where: str, whole: bool):
        self.end = end
        self.expected = expected
        self.where = where
        self.whole = whole
        self.ok = False

    def check(self, source: ByteSource) -> None:
        """IntegrityError unless bytes 0..end of ``source`` hash to the manifest's sha256."""
        got = header_sha256(source, self.end)
        if got != self.expected:
            what = "its bytes" if self.whole else "its header"
            detail = f"0..{self.end}" if self.whole else f"bytes 0..{self.end}: metadata and tensor infos"
            whose = "file" if self.whole else "checkpoint"
            verb = "differ" if self.whole else "differs"
            raise IntegrityError(source.name, None, f"{what} ({detail}) {verb} from the manifest "
                                                    f"{self.where} (sha256 {got[:16]}..., manifest "
                                                    f"{self.expected[:16]}...): not the {whose} the manifest describes")
        self.ok = True


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

    def __init__(self, inner: ByteSource, index: _Index, verified: list[bytearray], chunk_size: int,
                 header: _HeaderCheck | None = None):
        self.inner = inner
        self.name = inner.name
        self.size = inner.size
        self.identity = inner.identity
        self.mtime_ns = inner.mtime_ns  # the mount's file times are the file's, checked or not
        self._index = index
        self._verified = verified
        self._chunk = chunk_size
        self._header = header
        self._seen = inner.changes  # the inner source's count of ctime changes when what is known good was

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

    def pread(self, offset: int, size: int, *, scope: ReadScope = NOTHING_SAID) -> bytes:
        if size <= 0:
            return b""
        for _ in range(RECHECKS):
            seen = self.inner.changes
            if seen != self._seen:
                self._forget(seen)
            data = self._checked_read(offset, size, scope)
            if self.inner.changes == seen:
                return data
        raise IntegrityError(self.name, offset, "its status keeps changing while it is read (ctime): not served")

    def _forget(self, seen: int) -> None:
        """The file's ctime changed (a chmod, or a rewrite that put its mtime back): nothing read before is
        known good any more; every chunk and the header are verified again before they are served."""
        log.info("%s: its status changed since it was opened (ctime): its bytes are checked against the "
                 "manifest again", self.name)
        self._seen = seen
        for done in self._verified:
            done[:] = bytes(len(done))
        if self._header is not None:
            self._header.ok = False

    def _checked_read(self, offset: int, size: int, scope: ReadScope) -> bytes:
        header = self._header
        if header is not None and not header.ok and offset < header.end:
            header.check(self.inner)
        todo = self._unchecked(offset, offset + size)
        if not todo:
            return self.inner.pread(offset, size, scope=scope)
        lo = min(offset, min(c[2] for c in todo))
        hi = max(offset + size, max(c[3] for c in todo))
        data = self.inner.pread(lo, hi - lo, scope=scope)
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

    def advise(self, offset: int, size: int, sequential: bool = False, *, scope: ReadScope = NOTHING_SAID) -> None:
        self.inner.advise(offset, size, sequential, scope=scope)

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


def _other_files(parsed: ParsedCheckpoint, manifest: Manifest, where: str) -> dict[str, str]:
    """The files the mount passes through (a folder's config, tokenizer, chat template) that the manifest
    lists, each -> its name there. Those it does not list are served unchecked, said once."""
    others = [path for path in parsed.passthrough.values() if path not in parsed.files]
    names = file_names([*parsed.files, *others])
    listed = {f.name for f in manifest.files}
    unlisted = [names[path] for path in others if names[path] not in listed]
    if unlisted and runtime().get(MANIFEST_WARNINGS).first(("unlisted", where)):
        shown = unlisted[0] if len(unlisted) == 1 else f"{unlisted[0]} and {len(unlisted) - 1} more"
        log.warning("manifest %s does not list %s (written before manifests covered a folder's other files, or "
                    "added since): served unchecked; write it again with `ckptfs manifest` to check them",
                    where, shown)
    return {path: names[path] for path in others if names[path] in listed}


def _check_same_tensors(manifest: Manifest, parsed: ParsedCheckpoint, names: dict[str, str], where: str,
                        others: AbstractSet[str] = frozenset()) -> None:
    """Refuse a manifest of another checkpoint: same files, and the same tensors at the same places
    (``others``: the names of the folder's other files the manifest lists, checked whole)."""

    def fail(reason: str) -> CheckpointError:
        return CheckpointError(where, None, f"the manifest does not describe this checkpoint: {reason}")

    listed = {f.name for f in manifest.files} - others
    for name in names.values():
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
