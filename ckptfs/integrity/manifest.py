"""Manifests ("ckptfs-manifest/1"): the hashes of a checkpoint's stored bytes, built in one pass, loaded checked.

A manifest records, per file, its size, its sha256 (the value the Hugging Face Hub shows as the LFS oid) and
the sha256 of its header (``header_sha256``: the bytes before the file's first tensor, which hold the
metadata and where each tensor is; optional, since manifests written before it lack it) and, per tensor, where its stored bytes are and their crc32, sha256 and the crc32 of each ``chunk_size`` slice
counted from the tensor's start, so that a checked read needs only the chunks it covers.

Building reads each byte once. Per file, a reader hands each buffer to the whole-file sha256 and to the
tensors it holds (their sha256 and chunk crc32s; the tensor's crc32 is combined from its chunks, not
computed again), each an ordered stream on the read-ahead scheduler's decode pool; several files are read
at once on its read pool (``ckptfs.workers.scheduler``: the process's one set of worker threads). hashlib
and zlib release the GIL on large buffers, so the streams use separate cores.

File names are relative to the checkpoint's root, the longest common folder of its files (a single file:
its base name), so a manifest stays valid when the model folder moves.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ckptfs.core.errors import CheckpointError
from ckptfs.integrity.crc import crc32, crc32_combine
from ckptfs.core.runtime import Part, runtime
from ckptfs.workers.scheduler import WORKERS, Ordered
from ckptfs.util.once import OncePerCause
from ckptfs.util.redact import strip_url

log = logging.getLogger(__name__)

FORMAT = "ckptfs-manifest/1"
CHUNK_SIZE = 1 << 20
#: Bytes read at a time: large enough that per-call costs vanish, small enough to keep memory flat.
READ_SIZE = 8 << 20
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

Progress = Callable[[int], None]


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    sha256: str
    #: The sha256 of the file's header (``header_end``); None in a manifest written before the field existed.
    header_sha256: str | None = None


def header_end(offsets: Iterable[int], size: int) -> int:
    """Where a file's header ends: at its first tensor's stored bytes (GGUF: the data start after the header,
    metadata, tensor infos and alignment padding; safetensors: 8 + the JSON header's length), or at the end
    of a file that holds no tensor."""
    return min(min(offsets, default=size), size)


def header_sha256(source, end: int) -> str:
    """The sha256 of bytes [0, end) of ``source`` (anything with ``pread``), read in one request (a remote
    source has them cached from the header read at open)."""
    return hashlib.sha256(source.pread(0, end) if end else b"").hexdigest()


@dataclass(frozen=True)
class TensorEntry:
    name: str
    file: str
    offset: int
    stored_nbytes: int
    crc32: int
    sha256: str
    chunks_crc32: tuple[int, ...]
    #: Of a checkpoint hashed with ``short=True`` (verify, diff): how many of its stored bytes the file
    #: holds when it ends before the tensor does (a truncated copy; the hashes cover those bytes only);
    #: None when all are there. Never written to a manifest.
    present: int | None = None

    @property
    def end(self) -> int:
        return self.offset + self.stored_nbytes


@dataclass(frozen=True)
class Manifest:
    files: tuple[FileEntry, ...]
    tensors: tuple[TensorEntry, ...]
    chunk_size: int = CHUNK_SIZE

    def file(self, name: str) -> FileEntry | None:
        return next((f for f in self.files if f.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "chunk_size": self.chunk_size,
            "files": [_file_json(f) for f in self.files],
            "tensors": [{"name": t.name, "file": t.file, "offset": t.offset, "stored_nbytes": t.stored_nbytes,
                         "crc32": t.crc32, "sha256": t.sha256, "chunks_crc32": list(t.chunks_crc32)}
                        for t in self.tensors],
        }

    def lacks_header_hashes(self) -> list[str]:
        """The files listed without ``header_sha256`` (a manifest written before the field existed)."""
        return [f.name for f in self.files if f.header_sha256 is None]

    def dumps(self) -> str:
        """JSON text with one file or tensor per line (diffable, and quick to write for 100k chunks)."""
        data = self.to_json()
        lines = ["{", f'  "format": {json.dumps(FORMAT)},', f'  "chunk_size": {self.chunk_size},']
        for key in ("files", "tensors"):
            items = [json.dumps(item, ensure_ascii=False) for item in data[key]]
            body = ",\n    ".join(items)
            lines.append(f'  "{key}": [\n    {body}\n  ]' if items else f'  "{key}": []')
            lines[-1] += "," if key == "files" else ""
        lines.append("}")
        return "\n".join(lines) + "\n"


def _file_json(f: FileEntry) -> dict[str, Any]:
    item: dict[str, Any] = {"name": f.name, "size": f.size, "sha256": f.sha256}
    if f.header_sha256 is not None:
        item["header_sha256"] = f.header_sha256
    return item


#: A runtime's manifest warnings already said (one per manifest, kind and process): lacking header hashes
#: here, leaving a folder's other files unchecked (``checked.py``).
MANIFEST_WARNINGS = Part("manifest warnings said", OncePerCause, OncePerCause.in_child)


def warn_without_header_hashes(manifest: Manifest, where: str) -> None:
    """Say once (per manifest and process) that ``manifest`` predates ``header_sha256``: the headers of its
    files (metadata, tensor places) are not compared, so a changed header goes unnoticed until ``verify``."""
    lacking = manifest.lacks_header_hashes()
    if lacking and runtime().get(MANIFEST_WARNINGS).first(("no header hashes", where)):
        log.warning("manifest %s has no header_sha256 for %s (written by an older ckptfs): headers are not "
                    "checked; write it again with `ckptfs manifest` to check them", where,
                    lacking[0] if len(lacking) == 1 else f"{len(lacking)} files")


# ------------------------------------------------------------------------------------------------ names

def root_of(paths: Sequence[str]) -> str:
    """The common folder prefix (ending in "/", or empty) of a checkpoint's file paths or URLs."""
    if not paths:
        return ""
    prefix = os.path.commonprefix([p[: p.rfind("/") + 1] for p in paths])  # noqa: RUF071 - cut at a "/" below
    return prefix[: prefix.rfind("/") + 1]


def file_names(paths: Sequence[str]) -> dict[str, str]:
    """Each path -> its name in a manifest: the path relative to the checkpoint's root (a URL without its user
    info and query: a manifest is shared, and a presigned URL's signature is a credential)."""
    stripped = {p: strip_url(p) for p in paths}
    root = root_of(list(stripped.values()))
    return {p: name[len(root):] for p, name in stripped.items()}


# ---------------------------------------------------------------------------------------------- building

class _TensorHasher:
    """The running hashes of one tensor's stored bytes, fed in order, in pieces of any size.

    The sha256 and the crc32s are fed separately (``feed_sha``, ``feed_crc``) so that they can run in
    different threads; each of the two must see the pieces in order.
    """

    __slots__ = ("name", "start", "end", "nbytes", "chunk_size", "sha", "crc", "chunk_crc", "chunk_fill", "chunks")

    def __init__(self, name: str, start: int, end: int, chunk_size: int, nbytes: int | None = None):
        self.name, self.start, self.end, self.chunk_size = name, start, end, chunk_size
        self.nbytes = end - start if nbytes is None else nbytes  # more than end - start: the file is short
        self.sha = hashlib.sha256()
        self.crc = 0
        self.chunk_crc = 0
        self.chunk_fill = 0
        self.chunks: list[int] = []

    def feed_sha(self, piece: memoryview) -> None:
        self.sha.update(piece)

    def feed_crc(self, piece: memoryview) -> None:
        pos, n = 0, len(piece)
        while pos < n:
            take = min(self.chunk_size - self.chunk_fill, n - pos)
            self.chunk_crc = crc32(piece[pos:pos + take], self.chunk_crc)
            self.chunk_fill += take
            pos += take
            if self.chunk_fill == self.chunk_size:
                self._close_chunk()

    def _close_chunk(self) -> None:
        self.crc = crc32_combine(self.crc, self.chunk_crc, self.chunk_fill) if self.chunks else self.chunk_crc
        self.chunks.append(self.chunk_crc)
        self.chunk_crc = 0
        self.chunk_fill = 0

    def entry(self, file: str) -> TensorEntry:
        if self.chunk_fill:
            self._close_chunk()
        present = self.end - self.start
        return TensorEntry(self.name, file, self.start, self.nbytes, self.crc, self.sha.hexdigest(),
                           tuple(self.chunks), present if present < self.nbytes else None)


@dataclass
class FileJob:
    """One file to hash: its source (anything with ``size`` and ``pread``) and the tensors stored in it;
    ``other``: a file the mount passes through (a folder's config or tokenizer file), not a weights file."""

    path: str
    name: str
    source: Any
    tensors: list[tuple[str, int, int]]  # (tensor name, offset, stored bytes), in manifest order
    other: bool = False


#: Buffers read ahead of the hashing threads (bounds memory to about this many READ_SIZE buffers).
IN_FLIGHT = 4


def _feed_file(file_sha, head_sha, buffer: memoryview, head: memoryview) -> None:
    """The file's stream: its sha256, and its header's over the part of the buffer the header covers."""
    file_sha.update(buffer)
    if len(head):
        head_sha.update(head)


def _feed_sha(pieces: list[tuple[_TensorHasher, memoryview]]) -> None:
    for hasher, piece in pieces:
        hasher.feed_sha(piece)


def _feed_crc(pieces: list[tuple[_TensorHasher, memoryview]]) -> None:
    for hasher, piece in pieces:
        hasher.feed_crc(piece)


def _hash_file(job: FileJob, chunk_size: int, progress: Progress | None,
               short: bool = False) -> tuple[FileEntry, list[TensorEntry]]:
    """One pass over a file (``short``: tensors past its end are hashed over the bytes there are and marked
    ``present``, instead of an error). The reading thread hands each buffer to three ordered streams on the
    scheduler's decode pool (the file's sha256, the tensors' sha256s, the tensors' crc32s: ``Ordered``), so
    the work (two sha256 passes and a crc32 pass) spreads over the cores there are while every hash still
    sees its bytes in order. At most IN_FLIGHT buffers are alive per file (32 MiB)."""
    size = job.source.size
    for name, offset, nbytes in job.tensors:
        if offset + nbytes > size and not short:
            raise CheckpointError(job.path, offset, f"tensor {name!r}: stored bytes {offset}..{offset + nbytes} "
                                                    f"lie past the end of the file ({size} bytes)")
    hashers = [_TensorHasher(name, offset, max(offset, min(offset + nbytes, size)), chunk_size, nbytes)
               for name, offset, nbytes in job.tensors]
    # the header's own sha256 (of a file without tensors the header is the whole file: its sha256 is the file's)
    head_end = header_end((offset for _, offset, _ in job.tensors), size) if job.tensors else 0
    head_sha = hashlib.sha256()
    pending = sorted((h for h in hashers if h.end > h.start), key=lambda h: h.start, reverse=True)
    active: list[_TensorHasher] = []
    file_sha = hashlib.sha256()
    streams = [Ordered(runtime().get(WORKERS), "decode") for _ in range(3)]
    try:
        for pos in range(0, size, READ_SIZE):
            buffer = memoryview(job.source.pread(pos, min(READ_SIZE, size - pos)))
            end = pos + len(buffer)
            while pending and pending[-1].start < end:
                active.append(pending.pop())
            pieces = [(h, buffer[max(h.start, pos) - pos:min(h.end, end) - pos]) for h in active]
            active = [h for h in active if h.end > end]
            for stream in streams:
                stream.wait(most=IN_FLIGHT - 1)
            head = buffer[:max(0, head_end - pos)]
            streams[0].put(functools.partial(_feed_file, file_sha, head_sha, buffer, head))
            streams[1].put(functools.partial(_feed_sha, pieces))
            streams[2].put(functools.partial(_feed_crc, pieces))
            if progress is not None:
                progress(len(buffer))
    finally:  # every stream done with the buffers before they are dropped (or an error raised)
        for stream in streams:
            stream.wait()
    file_hex = file_sha.hexdigest()
    return (FileEntry(job.name, size, file_hex, head_sha.hexdigest() if job.tensors else file_hex),
            [h.entry(job.name) for h in hashers])


def hash_files(jobs: Sequence[FileJob], *, chunk_size: int = CHUNK_SIZE, progress: Progress | None = None,
               workers: int | None = None, short: bool = False) -> Manifest:
    """Hash every file of ``jobs`` (several at once) into a Manifest; tensors in the jobs' order. ``short``:
    a tensor past the end of its file is marked (TensorEntry.present), not an error (for verify and diff,
    which report a truncated copy as a mismatch; a manifest is never written from one)."""
    if progress is not None:
        lock = threading.Lock()
        report = progress

        def progress(n: int) -> None:
            with lock:
                report(n)

    if workers is None:  # each file keeps about two cores busy (two sha256 passes in their own threads)
        workers = max(1, (os.cpu_count() or 2) // 2)
    workers = max(1, min(workers, len(jobs)))
    results = _each(jobs, lambda job: _hash_file(job, chunk_size, progress, short), workers)
    return Manifest(files=tuple(f for f, _ in results), tensors=tuple(t for _, ts in results for t in ts),
                    chunk_size=chunk_size)


def _each(jobs: Sequence[FileJob], hash_one: Callable[[FileJob], tuple[FileEntry, list[TensorEntry]]],
          workers: int) -> list[tuple[FileEntry, list[TensorEntry]]]:
    """``hash_one`` of every job, in order, ``workers`` at once on the scheduler's read pool (a file's reader
    waits on its source and on its hashes; one worker, or a refused job: on the calling thread). Every job
    started has ended when an error is raised (the first one's)."""
    results: list[tuple[FileEntry, list[TensorEntry]] | None] = [None] * len(jobs)
    running: list[tuple[int, Future[tuple[FileEntry, list[TensorEntry]]]]] = []
    error: BaseException | None = None
    workers_pool = runtime().get(WORKERS)
    for i, job in enumerate(jobs):
        future = workers_pool.call("read", functools.partial(hash_one, job), 0) if workers > 1 else None
        if future is None:  # one at a time asked, or the pool refused: here
            try:
                results[i] = hash_one(job)
            except BaseException as exc:  # noqa: BLE001 - raised once the started jobs have ended
                error = exc
                break
        else:
            running.append((i, future))
        while len(running) >= workers:
            k, first = running.pop(0)
            try:
                results[k] = first.result()
            except BaseException as exc:  # noqa: BLE001 - as above
                error = error or exc
        if error is not None:
            break
    for k, future in running:
        try:
            results[k] = future.result()
        except BaseException as exc:  # noqa: BLE001 - as above
            error = error or exc
    if error is not None:
        raise error
    return [r for r in results if r is not None]


def jobs_for(checkpoint) -> list[FileJob]:
    """One FileJob per file of an opened Checkpoint, its tensors in file order (duplicates kept), then one per
    other file its mount serves or a view reads (a model folder's ``config.json``, tokenizer files, chat
    template, index: every file passed through), hashed whole: a manifest covers every byte a mount shows."""
    others = [path for path in checkpoint.passthrough.values() if path not in checkpoint.files]
    names = file_names([*checkpoint.files, *others])
    by_file: dict[str, list[tuple[str, int, int]]] = {path: [] for path in checkpoint.files}
    order = {path: k for k, path in enumerate(checkpoint.files)}
    for info in sorted(checkpoint.parsed.tensors, key=lambda i: (order[i.source], i.offset)):
        by_file[info.source].append((info.name, info.offset, info.stored_nbytes))
    return ([FileJob(path, names[path], checkpoint.sources.get(path), by_file[path]) for path in checkpoint.files] +
            [FileJob(path, names[path], checkpoint.sources.get(path), [], other=True) for path in others])


def build_manifest(checkpoint, *, progress: Progress | None = None, workers: int | None = None,
                   chunk_size: int = CHUNK_SIZE, short: bool = False) -> Manifest:
    """The manifest of an opened Checkpoint: every byte of every file read once (``short``: see hash_files)."""
    return hash_files(jobs_for(checkpoint), chunk_size=chunk_size, progress=progress, workers=workers,
                      short=short)


def total_bytes(checkpoint) -> int:
    return sum(job.source.size for job in jobs_for(checkpoint))


# ----------------------------------------------------------------------------------------------- loading

def load_manifest(path: str) -> Manifest:
    """Read and check a manifest file; CheckpointError with one line naming the file and the first problem."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise CheckpointError(path, None, f"cannot read the manifest: {exc.strerror}") from None
    try:
        data = decode_json(text)
    except _HostileJSON as exc:
        raise CheckpointError(path, None, f"not a valid ckptfs manifest: {exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        detail = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        raise CheckpointError(path, None, f"not a ckptfs manifest: not JSON ({detail})") from None
    return parse_manifest(data, path)


#: Digits a number in a manifest may have: every field is below 2^64 (20 digits). Longer ones are not
#: converted at all (Python's int() of a 5000-digit string is refused, and a long one costs quadratic time).
MAX_DIGITS = 20


class _HostileJSON(ValueError):
    """JSON that parses but that no manifest writer produces: a repeated key, NaN/Infinity, a huge number."""


@dataclass(frozen=True)
class _HugeNumber:
    """A number too long to be a manifest field, kept as its length so the field check can name it."""

    digits: int

    def __str__(self) -> str:
        return f"a {self.digits}-digit number"

    __repr__ = __str__


def _big_int(text: str) -> int | _HugeNumber:
    digits = len(text.lstrip("-"))
    return int(text) if digits <= MAX_DIGITS else _HugeNumber(digits)


def _no_constant(name: str):
    raise _HostileJSON(f"{name} is not a JSON number (no manifest field may hold it)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _HostileJSON(f"key {_short(key)} appears twice in one object (which one counts is undefined)")
        obj[key] = value
    return obj


def decode_json(text: bytes | str) -> Any:
    """``json.loads`` for manifests: a repeated key or NaN/Infinity is _HostileJSON, and a number with more
    than MAX_DIGITS digits is a _HugeNumber (which the field checks refuse by name) instead of a ValueError
    that names neither the file nor the field."""
    return json.loads(text, parse_int=_big_int, parse_constant=_no_constant,
                      object_pairs_hook=_unique_keys)


def is_manifest(path: str) -> bool:
    """True when ``path`` is a file of JSON that says it is a manifest (for ``diff A B``, where either side
    may be one): its ``format`` is a "ckptfs-manifest/..." string, or, where the JSON is broken or hostile,
    its first bytes name that format, so that load_manifest says what is wrong with it. A checkpoint
    (binary) or a shard index (JSON of another shape) is not."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
            if not head.lstrip().startswith(b"{"):
                return False
            f.seek(0)
            text = f.read()
    except OSError:
        return False
    try:
        data = decode_json(text)
    except (ValueError, RecursionError):
        return _FORMAT_MARK in head
    return isinstance(data, dict) and isinstance(data.get("format"), str) and \
        data["format"].startswith(FORMAT.partition("/")[0] + "/")


_FORMAT_MARK = b'"format": "' + FORMAT.partition("/")[0].encode() + b"/"


def parse_manifest(data: Any, where: str) -> Manifest:
    """A Manifest from decoded JSON, every field checked (types, ranges, one chunk crc per chunk)."""
    check = _Checker(where)
    if not isinstance(data, dict):
        raise check.fail(f"must be a JSON object, not {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise check.fail(f"format is {data.get('format')!r}, expected {FORMAT!r}")
    chunk_size = check.uint(data.get("chunk_size"), "chunk_size")
    if chunk_size == 0:
        raise check.fail("chunk_size must be positive")
    files = tuple(_file_entry(check, i, item) for i, item in enumerate(check.array(data.get("files"), "files")))
    sizes = {}
    for f in files:
        if f.name in sizes:
            raise check.fail(f"file {f.name!r} is listed twice")
        sizes[f.name] = f.size
    tensors = tuple(_tensor_entry(check, i, item, sizes, chunk_size)
                    for i, item in enumerate(check.array(data.get("tensors"), "tensors")))
    return Manifest(files, tensors, chunk_size)


class _Checker:
    def __init__(self, where: str):
        self.where = where

    def fail(self, reason: str) -> CheckpointError:
        return CheckpointError(self.where, None, f"not a valid ckptfs manifest: {reason}")

    def uint(self, value: Any, what: str, limit: int = 1 << 64) -> int:
        if type(value) is not int or not 0 <= value < limit:
            raise self.fail(f"{what} must be a non-negative integer{' below 2^32' if limit == 1 << 32 else ''}, "
                            f"got {_short(value)}")
        return value

    def string(self, value: Any, what: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(f"{what} must be a non-empty string, got {_short(value)}")
        return value

    def sha256(self, value: Any, what: str) -> str:
        if not isinstance(value, str) or not _SHA256_HEX.fullmatch(value):
            raise self.fail(f"{what} must be 64 lower-case hex digits, got {_short(value)}")
        return value

    def array(self, value: Any, what: str) -> list:
        if not isinstance(value, list):
            raise self.fail(f"{what} must be a list, got {_short(value)}")
        return value

    def obj(self, value: Any, what: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(f"{what} must be an object, got {_short(value)}")
        return value


def _file_entry(check: _Checker, i: int, item: Any) -> FileEntry:
    item = check.obj(item, f"files[{i}]")
    name = check.string(item.get("name"), f"files[{i}].name")
    header = item.get("header_sha256")
    return FileEntry(name, check.uint(item.get("size"), f"files[{i}].size"),
                     check.sha256(item.get("sha256"), f"files[{i}].sha256"),
                     None if header is None and "header_sha256" not in item
                     else check.sha256(header, f"files[{i}].header_sha256"))


def _tensor_entry(check: _Checker, i: int, item: Any, sizes: dict[str, int], chunk_size: int) -> TensorEntry:
    item = check.obj(item, f"tensors[{i}]")
    name = item.get("name")
    if not isinstance(name, str):
        raise check.fail(f"tensors[{i}].name must be a string, got {_short(name)}")
    label = f"tensors[{i}] ({name!r})"
    file = check.string(item.get("file"), f"{label}.file")
    if file not in sizes:
        raise check.fail(f"{label}: file {file!r} is not in files")
    offset = check.uint(item.get("offset"), f"{label}.offset")
    nbytes = check.uint(item.get("stored_nbytes"), f"{label}.stored_nbytes")
    if offset + nbytes > sizes[file]:
        raise check.fail(f"{label}: bytes {offset}..{offset + nbytes} lie past the end of {file!r} "
                         f"({sizes[file]} bytes)")
    crc = check.uint(item.get("crc32"), f"{label}.crc32", 1 << 32)
    sha = check.sha256(item.get("sha256"), f"{label}.sha256")
    chunks = check.array(item.get("chunks_crc32"), f"{label}.chunks_crc32")
    expected = math.ceil(nbytes / chunk_size)
    if len(chunks) != expected:
        raise check.fail(f"{label}: chunks_crc32 has {len(chunks)} entries, {expected} expected for {nbytes} bytes")
    for k, c in enumerate(chunks):
        check.uint(c, f"{label}.chunks_crc32[{k}]", 1 << 32)
    return TensorEntry(name, file, offset, nbytes, crc, sha, tuple(chunks))


def _short(value: Any) -> str:
    if isinstance(value, _HugeNumber):
        return str(value)
    text = json.dumps(value, default=str) if not isinstance(value, (bytes, bytearray)) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def tensors_by_file(entries: Iterable[TensorEntry]) -> dict[str, list[TensorEntry]]:
    grouped: dict[str, list[TensorEntry]] = {}
    for t in entries:
        grouped.setdefault(t.file, []).append(t)
    return grouped
