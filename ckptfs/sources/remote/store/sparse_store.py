"""The ``--cache-dir`` store of fetched remote bytes: one sparse file per remote file, an index beside it.

``DIR/remote/<2 hex>/<32 hex>.data`` holds the remote file's bytes at their own offsets (chunks never
fetched are holes), ``.idx`` beside it what is present: a 64-byte header (magic and format version, the
digest of the content identity the name comes from, the chunk count once known, the sealed flag, the
sealed file's check stamp, a crc32)
then one 24-byte record per chunk: its MAC (``entry.chunk_mac`` under the folder's key, ``auth.py``), its
length (0: absent) and when it was last used (minutes, the eviction clock).

Why it is built this way:

- **A chunk is a ``pwritev`` at its offset**, no temporary file, MAC'd entry and rename per chunk: a
  warm-up writes a checkpoint as a downloader writes one file. A warm-up's chunks, which no reader waits
  for, are written past the page cache (``direct_write``: the page-cache copy of fresh pages was the
  largest CPU cost of a ``ckptfs prefetch``).
- **A crash never marks absent bytes present.** A run of chunks is written to the data file and put on the
  device (``sync_file_range``, waited for: the data pages, without the journal commit an ``fdatasync`` of a
  filling sparse file costs), and only then are the chunks' records written; eviction clears a record (and
  syncs the index) before it punches the chunk's hole. A power loss can lose records, never order a record
  before its bytes; should the file system lose a chunk's block allocation anyway, its record's MAC fails on
  read (dropped, a miss, fetched again), as it does for bytes damaged any other way.
- **Sealed.** When a file's last absent chunk lands, the index is synced and its header marked sealed:
  the file is complete and never written again; it is evicted only whole (``unlink``: processes that have it
  open keep reading their copy). A chunk found bad later (its MAC) is dropped alone: the file is unsealed
  (record cleared first) and sealed again once the chunk is fetched.
- **Checked once per boot.** The C read path serves a sealed file's bytes once checked against their MACs
  (``sealed_copy``). The sealing process stamps the header (``entry.sealed_stamp``: the data file's inode,
  size, mtime, ctime and the boot id under the folder's key), as does a process whose check passed; a
  matching stamp means no check, a check otherwise runs ahead of the readers (a gate the C reader polls).
- **Eviction by what the disk holds** (``st_blocks``, holes free): a process that wrote ``max_bytes / 64``
  since its last check walks the folder (every namespace counts, the decoded groups' entries too) and,
  while the folder is over ``--cache-dir-size`` or its file system has less than ``--cache-dir-min-free``
  percent free, drops the least recently used of: a chunk of an unsealed file (its hole punched) or a
  whole sealed file, down to 90 % of the bound. The decoded groups' entries are pruned by their own store
  (``disk.py``); one ``DIR/.lock`` keeps the prunes apart.
- **One fetch per chunk per machine.** A fetcher takes a byte-range lease on the chunk's range of the data
  file (``range_lease.py``: an open-file-description lock, so it holds between processes and vanishes
  with a killed holder); others wait for the chunk's record, or fetch it once the lease ended without it.
- **Format version.** The folder ``remote/`` and the index magic carry the version; chunks of the older
  store (``bytes/``, one entry file per run) are ignored, with one log line, and pruned as any entry.
- **Names.** A file is found by its content identity, which only the origin can tell for a URL; a *name
  record* beside the files (``names.py``: ``<32 hex>.name``, MAC'd, written whole) keeps what a URL stood
  for — the identity's parts (URL, size, validator, the tail digest of a weak one, the LFS oid), the
  revision, and when its first bytes were fetched — and, for a repository folder, its listing. A file's
  record is written only once some of its bytes are stored (``pin``: with the ``put_chunks`` that stores
  them, after their records), so a record never comes before its bytes. With it a checkpoint whose bytes
  are here mounts while its origin is unreachable, or with ``--offline`` without asking it at all
  (``ckptfs.sources.remote.stored``). Records are small and outlive eviction; a record whose file was
  evicted names bytes that are absent (reads of them fail offline).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ckptfs.cache import auth, entry
from ckptfs.cache.folder import FolderBound, folder_lock, open_private, scandir, unlink
from ckptfs.cache.keys import CacheKey
from ckptfs.sources.remote.store import range_lease
from ckptfs.sources.remote.store.direct_write import ALIGN, BouncePool, DirectWriter, views_after
from ckptfs.sources.remote.store.names import NameRecords
from ckptfs.util.runs import runs as _runs
from ckptfs.util.sizes import format_size

log = logging.getLogger(__name__)

CHUNK = 256 * 1024           # the store's chunk (``chunks.CHUNK``, which is this)
NAMESPACE = "remote"
OLD_NAMESPACE = "bytes"      # the previous format's folder of fetched chunks
MAGIC = b"CKPTFSR3"          # format version 3 of fetched-byte storage
DEFAULT_MIN_FREE = 5.0       # --cache-dir-min-free, percent of the file system
BELOW_FLOOR = "its file system is at the --cache-dir-min-free floor"  # ``writes_paused``'s reason
LOW_WATER = 0.9
TOUCH_AFTER_MIN = 1          # a hit refreshes its chunk's clock when it is older than this (minutes)
LEASE_POLL_S = (0.002, 0.05)  # a waiter looks again after this long, doubling from the first to the second

_HEADER = struct.Struct("<8s16sIIQB16s3x")  # magic, key digest, chunk size, chunks (0: not known), size, sealed,
#                                            the sealed file's check stamp (zeros: none; ``entry.sealed_stamp``)
HEADER_SIZE = 64                           # _HEADER (60 bytes) + its crc32
_RECORD = struct.Struct("<16sII")          # MAC, length (0: absent), last use (minutes since the epoch)
RECORD = _RECORD.size
_USED_AT = 20                              # the last-use field's offset in a record
_LENGTH_WORD = 4                           # the length field's index among a record's 32-bit words
_SCAN_RECORDS = 4096                       # records read at once when looking for an absent chunk (96 KiB)

FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_libc = ctypes.CDLL(None, use_errno=True)  # the process's own C library
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free ``[offset, offset + length)`` of the file (reads as zeros; its size is kept)."""
    if _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


SYNC_FILE_RANGE_WAIT_BEFORE, SYNC_FILE_RANGE_WRITE, SYNC_FILE_RANGE_WAIT_AFTER = 1, 2, 4
_libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def write_out(fd: int, offset: int, length: int) -> None:
    """Put ``[offset, offset + length)`` of the file on the device and wait for it (``sync_file_range``: the
    data pages only, no journal commit, which is what makes ``fdatasync`` of a filling sparse file cost more
    than the write)."""
    flags = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER
    if _libc.sync_file_range(fd, offset, length, flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _minutes() -> int:
    return int(time.time() // 60)


CHECK_STEP = 4                # chunks a sealed file's check takes at once (the gate moves by 1 MiB)
CHECK_THREADS = max(1, min(4, os.cpu_count() or 1))


class SealedCopy:
    """A sealed data file open read-only for the process's C reads, and its check gate: the bytes from the
    start that passed their MAC check (``c_int64``, at a fixed address the C reader polls; -1: failed)."""

    def __init__(self, fd: int, size: int, mtime_ns: int) -> None:
        self.fd, self.size, self.mtime_ns = fd, size, mtime_ns
        self.gate = ctypes.c_int64(0)


class BadIndex(ValueError):
    """An index file that is not this store's index of this file."""


def _header(digest: bytes, chunks: int, size: int, sealed: bool, stamp: bytes = bytes(entry.MAC_SIZE)) -> bytes:
    head = _HEADER.pack(MAGIC, digest, CHUNK, chunks, size, int(sealed), stamp if sealed else bytes(entry.MAC_SIZE))
    return head + struct.pack("<I", zlib.crc32(head) & 0xFFFFFFFF)


def parse_header(data: bytes, digest: bytes) -> tuple[int, int, bool]:
    """(chunks, size, sealed) of an index header written for ``digest``; BadIndex otherwise."""
    if len(data) < HEADER_SIZE:
        raise BadIndex(f"short index header ({len(data)} bytes)")
    magic, found, chunk, chunks, size, sealed, _ = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BadIndex("bad magic")
    if zlib.crc32(data[:_HEADER.size]) & 0xFFFFFFFF != struct.unpack_from("<I", data, _HEADER.size)[0]:
        raise BadIndex("header checksum mismatch")
    if found != digest or chunk != CHUNK:
        raise BadIndex("index of another file")
    return chunks, size, bool(sealed)


def header_stamp(data: bytes) -> bytes:
    """The check stamp in an index header (``parse_header`` checked it first)."""
    stamp: bytes = _HEADER.unpack_from(data)[6]
    return stamp


@functools.lru_cache(maxsize=1)
def boot_id() -> bytes:
    """This boot's id (Linux), part of a sealed file's check stamp: a reboot means a check again."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as fh:
            return fh.read().strip()
    except OSError:
        return b""


class StoredFile:
    """One remote file's data and index, open in this process (one open file description each: the
    leases of this process are taken on ``data``)."""

    def __init__(self, data_path: str, index_path: str, digest: bytes) -> None:
        self.digest = digest
        self.data_path, self.index_path = data_path, index_path
        self.index = open_private(index_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        try:
            self.data = open_private(data_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        except OSError:
            os.close(self.index)
            raise
        self.lock = threading.Lock()
        # one writer of the data at a time in this process: the kernel takes the file's inode lock for each
        # buffered write anyway, and fetch threads waiting on it there spin on the CPU (writing 240 MiB in 4 MiB
        # pieces from 32 threads: twice the system time of one writer), where a waiter on this lock sleeps
        self.writing = threading.Lock()
        self._direct: DirectWriter | None = None  # a warm-up's writes past the page cache (made on first use)
        self.leases = 0  # leases this process holds on ``data`` (it is not closed while any are held)
        self._first_absent = 0  # ``complete``'s hint: every chunk before it was present when last looked at
        self.stamp = bytes(entry.MAC_SIZE)  # the header's check stamp (``entry.sealed_stamp``) when sealed
        try:
            self.chunks, self.size, self.sealed = self._read_header()
        except BaseException:
            self.close()
            raise

    def _read_header(self) -> tuple[int, int, bool]:
        range_lease.lock(self.index, 0, HEADER_SIZE)  # creators of one file agree on its header
        try:
            data = os.pread(self.index, HEADER_SIZE, 0)
            if not data:
                os.pwrite(self.index, _header(self.digest, 0, 0, False), 0)
                return 0, 0, False
            found = parse_header(data, self.digest)
            self.stamp = header_stamp(data)
            return found
        finally:
            range_lease.unlock(self.index, 0, HEADER_SIZE)

    def write_header(self) -> None:
        os.pwrite(self.index, _header(self.digest, self.chunks, self.size, self.sealed, self.stamp), 0)

    def reread_sealed(self) -> bool:
        """Whether the index's header says sealed now (``sealed`` and, when sealed, ``chunks`` and ``size``
        updated): another process may have sealed the file since, or unsealed it (a chunk dropped)."""
        try:
            data = os.pread(self.index, HEADER_SIZE, 0)
            chunks, size, sealed = parse_header(data, self.digest)
        except (OSError, BadIndex):
            return self.sealed
        if sealed:
            self.chunks, self.size = chunks, size
        self.sealed, self.stamp = sealed, header_stamp(data)
        return sealed

    def records(self, first: int = 0, count: int | None = None) -> list[tuple[bytes, int, int]]:
        """The records of chunks ``first .. first + count`` (all those written when ``count`` is None);
        chunks past the index's end are absent."""
        if count is None:
            count = max(0, (os.fstat(self.index).st_size - HEADER_SIZE) // RECORD - first)
        return list(_RECORD.iter_unpack(self._raw_records(first, count)))

    def _raw_records(self, first: int, count: int) -> bytes:
        """The index's bytes for the records of chunks ``first .. first + count``, zeros past its end (absent)."""
        raw = os.pread(self.index, count * RECORD, HEADER_SIZE + first * RECORD)
        return raw + bytes(count * RECORD - len(raw))

    def present(self, indexes: Iterable[int] | None = None) -> set[int]:
        """Of ``indexes`` (sorted; None: every chunk), those whose records say present: one read of the
        records from the first to the last asked, not of the whole index (a 42 GB file's is 4 MB)."""
        if indexes is None:
            return {i for i, (_, length, _) in enumerate(self.records()) if length}
        indexes = sorted(indexes)
        if not indexes:
            return set()
        first = indexes[0]
        records = self.records(first, indexes[-1] + 1 - first)
        return {i for i in indexes if records[i - first][1]}

    def complete(self) -> bool:
        """Whether every chunk's record says present (the chunk count known). A warm-up asks after each piece
        it stores, so the records are not read whole each time (quadratic: 2 CPU-seconds over a 4.4 GiB
        file's 1,100 pieces, 160 over a 40 GiB one's): only from the first chunk found absent before, in blocks,
        the lengths scanned in C. Once none from there on is absent, every record is read once more, since an
        eviction may have cleared one before it meanwhile; only that full look says complete. The hint is
        shared by the threads storing pieces unlocked: a stale one costs a longer look, never a wrong answer."""
        if not self.chunks:
            return False
        start = self._first_absent
        while start < self.chunks:
            lengths = self._lengths(start, min(self.chunks - start, _SCAN_RECORDS))
            if 0 in lengths:
                self._first_absent = start + lengths.index(0)
                return False
            start += len(lengths)
        lengths = self._lengths(0, self.chunks)
        if 0 in lengths:
            self._first_absent = lengths.index(0)
            return False
        return True

    def _lengths(self, first: int, count: int) -> list[int]:
        """The length fields of the records of chunks ``first .. first + count`` (0: absent, as is a chunk past
        the index's end)."""
        return memoryview(self._raw_records(first, count)).cast("I")[_LENGTH_WORD::RECORD // 4].tolist()  # (0 reads 0 in either byte order)

    def has(self, index: int) -> bool:
        return bool(self.records(index, 1)[0][1])

    def gone(self) -> bool:
        """Whether another process deleted (evicted) this file, its index or its data, since it was opened."""
        try:
            return os.fstat(self.index).st_nlink == 0 or os.fstat(self.data).st_nlink == 0
        except OSError:
            return True

    def write(self, views: list[memoryview], offset: int, direct: BouncePool | None) -> int:
        """``views`` one after the other at ``offset`` (the caller holds ``writing``): with ``direct`` (the
        store's buffers), the whole chunks past the page cache (``direct_write``), else buffered."""
        whole = len(views) - (views[-1].nbytes % ALIGN != 0)  # (the file's last chunk may end anywhere)
        if direct is None or offset % ALIGN or not whole:
            return _write_all(self.data, views, offset)
        if self._direct is None:
            self._direct = DirectWriter(self.data, direct)
        done = self._direct.write(views[:whole], offset, functools.partial(_write_all, self.data))
        return done + (_write_all(self.data, views[whole:], offset + done) if whole < len(views) else 0)

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
        os.close(self.data)
        os.close(self.index)


class SparseStore(FolderBound):
    """The store (see the module docstring); one per process and folder (``chunks.disk_store``), safe to
    share between threads. The folder is created and checked here: ``auth.CacheRefused`` (one line) for one
    this user must not trust, OSError for one that cannot be made."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int, key_file: str | os.PathLike[str] | None = None,
                 min_free: float = DEFAULT_MIN_FREE) -> None:
        self._mac_key = auth.folder_key(root, key_file)
        super().__init__(root, max_bytes, ("hits", "misses", "hit_bytes", "stored", "stored_bytes", "corrupt",
                                           "forged", "errors", "sealed", "lease_waits", "evicted_chunks",
                                           "evicted_files"), log)
        self.dir = self.root / NAMESPACE
        self._dir = os.fspath(self.dir) + os.sep
        self.min_free = float(min_free)
        self._files: dict[str, StoredFile] = {}
        self._bounce = BouncePool()  # the buffers of the direct writes (``direct_write``), shared by the files
        self._retired: list[StoredFile] = []  # files evicted by another process while open here
        #: content id -> its sealed copy under or past its check (``sealed_copy``), or "bad"
        self._copies: dict[str, SealedCopy | str] = {}
        self._kept: list[SealedCopy] = []  # copies that failed their check: C reads may still hold them
        self._copy_lock = threading.Lock()
        self.names = NameRecords(self.dir, self._mac_key)
        self._pinned: dict[str, list[tuple[str, dict[str, Any]]]] = {}  # content id -> records awaiting bytes
        self._note_old_format()

    def _note_old_format(self) -> None:
        old = self.root / OLD_NAMESPACE
        if any(True for sub in scandir(old) for item in scandir(sub.path) if item.name.endswith(".e")):
            log.warning("cache dir %s: fetched chunks stored in the older format (%s/) are ignored and will be "
                        "pruned (ckptfs cache clear removes them now)", self.root, OLD_NAMESPACE)

    # -- files ---------------------------------------------------------------------------------------

    def paths_for(self, content_id: str) -> tuple[str, str]:
        """(data file, index file) of the remote file ``content_id``."""
        digest = entry.key_digest(content_id).hex()
        stem = f"{self._dir}{digest[:2]}{os.sep}{digest}"
        return stem + ".data", stem + ".idx"

    def _file(self, content_id: str, create: bool) -> StoredFile | None:
        """This process's open ``StoredFile`` of ``content_id`` (opened, and with ``create`` created, as
        needed; reopened when another process evicted it); None when absent and not ``create``."""
        with self._lock:
            f = self._files.get(content_id)
        if f is not None and not f.gone():
            return f
        data_path, index_path = self.paths_for(content_id)
        if not create and not os.access(index_path, os.F_OK):
            return None
        digest = entry.key_digest(content_id)
        try:
            fresh = StoredFile(data_path, index_path, digest)
        except BadIndex as exc:
            self._warn_once("corrupt", "cache dir %s: index %s (%s): deleted (further ones are counted, not "
                            "logged)", self.root, os.path.basename(index_path), exc)
            self._count(corrupt=1)
            unlink(index_path)
            unlink(data_path)
            return None
        with self._lock:
            old = self._files.get(content_id)
            if old is not None and old is not f:  # another thread reopened it first
                fresh.close()
                return old
            self._files[content_id] = fresh
        if f is not None:  # kept open: other threads may be reading it, and closing would drop its leases
            self._retired.append(f)
        return fresh

    # -- reads ---------------------------------------------------------------------------------------

    def get(self, content_id: str, index: int) -> bytes | None:
        try:
            f = self._file(content_id, create=False)
            if f is None:
                self._count(misses=1)
                return None
            (mac, length, used), = f.records(index, 1)
            if not length:
                self._count(misses=1)
                return None
            data = os.pread(f.data, length, index * CHUNK) if length <= CHUNK else b""
            if len(data) != length or entry.chunk_mac(self._mac_key, f.digest, index, data) != mac:
                self._drop_chunk(f, index, "corrupt" if len(data) != length else "forged", content_id)
                return None
            now = _minutes()
            if now - used >= TOUCH_AFTER_MIN:
                os.pwrite(f.index, struct.pack("<I", now), HEADER_SIZE + index * RECORD + _USED_AT)
        except OSError as exc:
            self._trouble("read", exc)
            self._count(misses=1)
            return None
        self._count(hits=1, hit_bytes=length)
        return data

    def _drop_chunk(self, f: StoredFile, index: int, kind: str, content_id: str) -> None:
        """A chunk whose bytes or record fail their MAC: its record cleared (a miss: fetched again, or an error
        for that range alone offline), the rest of the file kept. A sealed file is unsealed (record first, so
        a crash in between leaves a sealed file with a chunk absent, which its check drops again), and this
        process's C reads of it stop (its gate: -1)."""
        self._warn_once(kind, "cache dir %s: %s chunk %d of %s: dropped, fetching it again (further %s chunks "
                        "are counted, not logged)", self.root, kind, index, os.path.basename(f.data_path), kind)
        self._count(misses=1, **{kind: 1})
        with self._copy_lock:
            copy = self._copies.get(content_id)
        if isinstance(copy, SealedCopy):
            copy.gate.value = -1
        with f.lock, contextlib.suppress(OSError):
            os.pwrite(f.index, bytes(RECORD), HEADER_SIZE + index * RECORD)
            f._first_absent = min(f._first_absent, index)
            if f.reread_sealed():
                os.fsync(f.index)
                f.sealed, f.stamp = False, bytes(entry.MAC_SIZE)
                f.write_header()

    def stored_chunks(self, content_id: str, indexes: Sequence[int]) -> set[int]:
        f = self._file(content_id, create=False)
        if f is None:
            return set()
        return f.present(indexes)

    def contains(self, key: CacheKey) -> bool:
        """Whether chunk ``key`` (a ``chunks.chunk_key``) is stored."""
        return bool(self.stored_chunks(key.content_id, (key.start,)))

    def sealed_copy(self, content_id: str, size: int) -> tuple[int, int, int, int] | None:
        """``(descriptor, size, mtime_ns, gate)`` of ``content_id``'s sealed data file, read-only; None for a
        file not sealed, of another size, or one that failed its check. The C read path serves it as a plain
        local file range (``ckptfs.fuse.direct``); a sealed file is never written again, so the size and mtime
        pinned here hold (a chunk dropped later unseals it, and its rewrite changes the mtime).

        The first call starts this process's one check of the file (``_check_sealed``: every chunk's MAC, on
        threads of its own, from the start of the file) and returns the copy at once: ``gate`` is the address
        of an int64 that says how many bytes from the start the check has passed, which a reader serves up to
        and waits on (a stream opened right after ``ckptfs prefetch`` runs just behind the check instead of in
        Python); -1 once the check failed. Each call counts as a use of the file for eviction."""
        with self._copy_lock:
            copy = self._copies.get(content_id)
            if copy is None:
                copy = self._open_copy(content_id, size)
                if copy is None:
                    return None
        if not isinstance(copy, SealedCopy) or copy.gate.value < 0 or copy.size != size:
            return None
        f = self._file(content_id, create=False)
        if f is not None and f.sealed:
            now = _minutes()
            (_, _, used), = f.records(0, 1)
            if now - used >= TOUCH_AFTER_MIN:
                with contextlib.suppress(OSError):
                    os.pwrite(f.index, struct.pack("<I", now), HEADER_SIZE + _USED_AT)
        return copy.fd, copy.size, copy.mtime_ns, ctypes.addressof(copy.gate)

    def _open_copy(self, content_id: str, size: int) -> SealedCopy | str | None:
        """``sealed_copy``'s first call for ``content_id`` (under ``_copy_lock``): the sealed file opened and
        its check started, kept in ``_copies``; "bad" (kept: Python serves it, checking each chunk) for a data
        file whose size is not the sealed one; None (not kept: asked again later) for one not sealed."""
        f = self._file(content_id, create=False)
        if f is None or not (f.sealed or f.reread_sealed()) or f.size != size:
            return None
        fd = os.open(f.data_path, os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(fd)
        if st.st_size != f.size:
            os.close(fd)
            self._warn_once("sealed", "cache dir %s: sealed file %s holds %d bytes, sealed at %d: read chunk by "
                            "chunk", self.root, os.path.basename(f.data_path), st.st_size, f.size)
            self._copies[content_id] = "bad"
            return "bad"
        copy = self._copies[content_id] = SealedCopy(fd, f.size, st.st_mtime_ns)
        if f.stamp == self._stamp(f, st):  # sealed, or checked, with the file as it is now, in this boot
            copy.gate.value = copy.size
            return copy
        threading.Thread(target=self._check_sealed, args=(content_id, f, copy), name="ckptfs-store-check",
                         daemon=True).start()
        return copy

    def _stamp(self, f: StoredFile, st: os.stat_result) -> bytes:
        return entry.sealed_stamp(self._mac_key, f.digest, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                  boot_id())

    def _check_sealed(self, content_id: str, f: StoredFile, copy: SealedCopy) -> None:
        """``sealed_copy``'s check: every chunk of the sealed file read and its MAC compared, in steps taken in
        order by ``CHECK_THREADS`` threads (the MAC, like the read, runs without the GIL), the gate moved past
        every step done with all those before it. The first chunk that fails is dropped (fetched again), the
        gate set to -1, and the copy forgotten: an open after the file is complete again checks it afresh."""
        try:
            records = f.records(0, f.chunks)
        except OSError:
            records = []
        steps = -(-len(records) // CHECK_STEP) if records else -1
        done = bytearray(steps)
        lock = threading.Lock()
        state = {"next": 0, "passed": 0, "bad": -1}

        def check() -> None:
            while True:
                with lock:
                    step = state["next"]
                    if state["bad"] >= 0 or step >= steps:
                        return
                    state["next"] = step + 1
                for i in range(step * CHECK_STEP, min(len(records), (step + 1) * CHECK_STEP)):
                    if not self._chunk_checks(f, copy.fd, i, records[i]):
                        with lock:
                            state["bad"] = i if state["bad"] < 0 else min(i, state["bad"])
                        return
                with lock:
                    done[step] = 1
                    passed = state["passed"]
                    while passed < steps and done[passed]:
                        passed += 1
                    state["passed"] = passed
                    copy.gate.value = min(passed * CHECK_STEP * CHUNK, copy.size)

        helpers = [threading.Thread(target=check, name="ckptfs-store-check", daemon=True)
                   for _ in range(CHECK_THREADS - 1)]
        for helper in helpers:
            helper.start()
        check()
        for helper in helpers:
            helper.join()
        if state["bad"] < 0 and state["passed"] == steps:
            self._stamp_checked(f, copy)
            return
        if state["bad"] >= 0:  # (the gate stays short of it meanwhile)
            self._drop_chunk(f, state["bad"], "forged", content_id)
        copy.gate.value = -1
        with self._copy_lock:
            if self._copies.get(content_id) is copy:
                del self._copies[content_id]
            self._kept.append(copy)  # registered handles may still hold its descriptor and gate

    def _stamp_checked(self, f: StoredFile, copy: SealedCopy) -> None:
        """Stamp a file that passed its check (``entry.sealed_stamp``) so that the processes after this one in
        this boot skip the check, unless it changed meanwhile."""
        with f.lock, contextlib.suppress(OSError):
            st = os.fstat(copy.fd)
            if f.reread_sealed() and (st.st_size, st.st_mtime_ns) == (copy.size, copy.mtime_ns):
                f.stamp = self._stamp(f, st)
                f.write_header()

    def _chunk_checks(self, f: StoredFile, fd: int, index: int, record: tuple[bytes, int, int]) -> bool:
        """Whether chunk ``index`` of ``f`` read from ``fd`` matches its ``record`` (present, its length a
        chunk's at most, its MAC)."""
        mac, length, _ = record
        if not 0 < length <= CHUNK:
            return False
        try:
            data = os.pread(fd, length, index * CHUNK)
        except OSError:
            return False
        return len(data) == length and entry.chunk_mac(self._mac_key, f.digest, index, data) == mac

    def sealed_path(self, content_id: str) -> str | None:
        """The data file of ``content_id`` when it is sealed (complete, never written again), else None."""
        f = self._file(content_id, create=False)
        return f.data_path if f is not None and (f.sealed or f.reread_sealed()) else None

    # -- writes --------------------------------------------------------------------------------------

    def landing(self, nbytes: int) -> contextlib.AbstractContextManager[memoryview]:
        """See ``chunk_store.ChunkStore``: one of the direct writes' buffers (``direct_write.BouncePool``)."""
        return self._bounce.landing(nbytes)

    def let_go_of_landings(self) -> None:
        """See ``chunk_store.ChunkStore``."""
        self._bounce.let_go()

    def put_chunks(self, content_id: str, first: int, parts: Sequence[bytes] | Sequence[memoryview],
                   chunks: int | None, direct: bool = False) -> bool:
        """See ``chunk_store.ChunkStore``. The data is on the device before the records that make it present
        (see the module docstring); the leases of these chunks are given up whatever happens. ``direct``:
        bytes no reader waits for (a warm-up's), written past the page cache (``direct_write``)."""
        views = [memoryview(part).cast("B") for part in parts]
        f = None
        try:
            if time.monotonic() < self._paused_until:
                return False
            f = self._file(content_id, create=True)
            if f is None:
                return False
            with f.lock:
                if chunks and not f.chunks:
                    f.chunks = chunks
                    f.write_header()
            if f.sealed and f.reread_sealed():  # (another process may have dropped a chunk of it)
                return True
            records = f.records(first, len(views))
            absent = [k for k, (_, length, _) in enumerate(records) if not length]
            written = 0
            if not absent:
                return True
            if not self._room_for(sum(views[k].nbytes for k in absent), f):
                return False
            try:
                with f.writing:
                    for k0, k1 in _runs(absent):
                        written += f.write(views[k0:k1], (first + k0) * CHUNK, self._bounce if direct else None)
                for k0, k1 in _runs(absent):
                    write_out(f.data, (first + k0) * CHUNK, sum(view.nbytes for view in views[k0:k1]))
            except OSError:
                for k0, k1 in _runs(absent):  # what a full disk took of them is not left unaccounted
                    with contextlib.suppress(OSError):
                        punch_hole(f.data, (first + k0) * CHUNK, (k1 - k0) * CHUNK)
                raise
            now = _minutes()
            for k0, k1 in _runs(absent):
                os.pwrite(f.index, b"".join(
                    _RECORD.pack(entry.chunk_mac(self._mac_key, f.digest, first + k, views[k]), views[k].nbytes, now)
                    for k in range(k0, k1)), HEADER_SIZE + (first + k0) * RECORD)
            self._count(stored=len(absent), stored_bytes=written)
            self._write_pinned(content_id)
            self._maybe_seal(f)
        except OSError as exc:
            self._trouble("write", exc)
            return False
        finally:  # (also when nothing was written: a paused store's waiters must not wait for these chunks)
            with contextlib.suppress(OSError):
                self.release(content_id, range(first, first + len(views)), f)
        self._after_write(written)
        return True

    def _maybe_seal(self, f: StoredFile) -> None:
        """Seal ``f`` when its every chunk is present: index synced first, then the header says so."""
        if not f.chunks or f.sealed or not f.complete():
            return
        with f.lock:
            if f.sealed:
                return
            os.fsync(f.index)
            f.size = (f.chunks - 1) * CHUNK + f.records(f.chunks - 1, 1)[0][1]
            f.sealed = True
            f.stamp = self._stamp(f, os.fstat(f.data))  # every chunk's MAC was made from the bytes written
            f.write_header()
        self._count(sealed=1)

    # -- name records (``names.py``) ------------------------------------------------------------------

    def pin(self, content_id: str, name: str, record: dict[str, Any]) -> None:
        """Make ``record`` (what the remote name ``name`` stands for: the parts of ``content_id``, when it was
        fetched) the name's record once bytes of ``content_id`` are stored: now when some are, else with the
        first ``put_chunks`` that stores some. A record naming ``content_id`` already is kept as it is (its
        ``fetched_at`` is the first fetch's)."""
        f = self._file(content_id, create=False)
        if f is not None and (f.sealed or f.present()):
            self._write_name(content_id, name, record)
            return
        with self._lock:
            self._pinned.setdefault(content_id, []).append((name, record))

    def _write_pinned(self, content_id: str) -> None:
        with self._lock:
            pinned = self._pinned.pop(content_id, ())
        for name, record in pinned:
            self._write_name(content_id, name, record)

    def _write_name(self, content_id: str, name: str, record: dict[str, Any]) -> None:
        found = self.names.read(name)
        if found is not None and found.get("content_id") == content_id:
            return
        self.remember(name, {**record, "content_id": content_id})

    def recall(self, name: str) -> dict[str, Any] | None:
        """The record of the remote name ``name`` (a file's or a folder's), or None."""
        return self.names.read(name)

    def remember(self, name: str, record: dict[str, Any]) -> None:
        """Keep ``record`` as the record of ``name`` now: one with no bytes of its own (a folder's listing)."""
        try:
            self.names.write(name, record)
        except OSError as exc:  # it costs an offline open of this name, not the bytes: writing goes on
            self._warn_once("name", "cache dir %s: a name record cannot be written (%s): an offline open of %s "
                            "will not find its bytes", self.root, exc.strerror or exc, name)

    # -- leases (one fetch per chunk per machine) ------------------------------------------------------

    def lease(self, content_id: str, indexes: Sequence[int]) -> list[bool]:
        f = self._file(content_id, create=True)
        if f is None:
            return [True] * len(indexes)  # nothing to coordinate on: fetch
        present = f.present(indexes)
        won = []
        for i in indexes:
            if i in present or not range_lease.try_lock(f.data, i * CHUNK, CHUNK):
                won.append(False)
                continue
            if f.has(i):  # stored between the look and the lock: take it, not a fetch
                range_lease.unlock(f.data, i * CHUNK, CHUNK)
                won.append(False)
                continue
            with f.lock:
                f.leases += 1
            won.append(True)
        return won

    def release(self, content_id: str, indexes: Sequence[int], f: StoredFile | None = None) -> None:
        f = f or self._file(content_id, create=False)
        if f is None:
            return
        for run in _runs(list(indexes)):
            with contextlib.suppress(OSError):
                range_lease.unlock(f.data, run[0] * CHUNK, (run[1] - run[0]) * CHUNK)
        with f.lock:
            f.leases = max(0, f.leases - len(indexes))

    def wait(self, content_id: str, indexes: Sequence[int], timeout: float) -> list[bytes | None]:
        out: list[bytes | None] = [None] * len(indexes)
        f = self._file(content_id, create=False)
        if f is None:
            return out
        self._count(lease_waits=len(indexes))
        pending = dict(enumerate(indexes))
        until, pause = time.monotonic() + timeout, LEASE_POLL_S[0]
        while pending:
            present = f.present(sorted(pending.values()))
            for k, i in list(pending.items()):
                if i in present:
                    out[k] = self.get(content_id, i)
                    del pending[k]
                elif not range_lease.held_elsewhere(f.data, i * CHUNK, CHUNK):
                    if f.has(i):  # stored and released since the look above
                        out[k] = self.get(content_id, i)
                    del pending[k]  # the lease ended without the chunk: the caller fetches it
            if not pending or time.monotonic() >= until:
                break
            time.sleep(min(pause, max(0.0, until - time.monotonic())))
            pause = min(pause * 2, LEASE_POLL_S[1])
        return out

    # -- the size bound ------------------------------------------------------------------------------

    # the bound's schedule (a check every ``max_bytes / 64`` written, on a thread of its own, held back while a
    # process is about to fork) is the folder's, shared with the decoded groups' store (``folder.FolderBound``)
    def _prune_due(self) -> None:
        self.prune(wait=False)

    def _room_for(self, nbytes: int, f: StoredFile) -> bool:
        """Whether ``nbytes`` more of ``f`` can be written leaving the file system its ``--cache-dir-min-free``
        floor: a ``statvfs`` before every write (cheap). Short of it, the least recently used of the other
        files are evicted for the difference at once (evicting ``f``'s own chunks to store others of it would
        only churn); still short, nothing is written and writing pauses as on a full disk (the reads are
        served from the fetched bytes; a warm-up stops on it: ``writes_paused``). A floor of 0 leaves a full
        disk to the write itself (ENOSPC: ``_trouble``)."""
        if self.min_free <= 0:
            return True
        short = self._short_of_floor(nbytes)
        if short <= 0:
            return True
        with contextlib.suppress(Exception):  # (a failed prune leaves the store as it was: short)
            self.prune(wait=True, need=short, keep=f.data_path[:-len(".data")])
        short = self._short_of_floor(nbytes)
        if short <= 0:
            return True
        pause = self._pause("full", BELOW_FLOOR)
        self._warn_once("floor", "cache dir %s: %s more would leave less than --cache-dir-min-free %g%% of its "
                        "file system free: not storing for %.0f s, serving from the origin", self.root,
                        format_size(nbytes), self.min_free, pause)
        return False

    def _short_of_floor(self, nbytes: int) -> int:
        """How many bytes the file system would lack of its floor after writing ``nbytes`` (<= 0: none)."""
        try:
            free, floor = free_and_floor(self.root, self.min_free)
        except OSError:
            return 0  # (the write says what is wrong with the folder)
        return nbytes - (free - floor)

    def excess(self) -> int:
        """Bytes to free now: past 90 % of the bound when over it, and what the free-space floor lacks."""
        total = folder_bytes(self.root)
        with self._lock:
            self._folder_bytes = total
        over = total - int(self.max_bytes * LOW_WATER) if total > self.max_bytes else 0
        try:
            free, floor = free_and_floor(self.root, self.min_free)
            short = floor - free
        except OSError:
            short = 0
        return max(over, short, 0)

    def prune(self, wait: bool = True, need: int | None = None, keep: str | None = None) -> dict[str, int]:
        """Evict least-recently-used chunks of unsealed files and whole sealed files until ``need`` bytes
        (default: ``excess()``) are freed, none of the file whose path stem is ``keep``. Returns {"chunks",
        "files", "bytes"} evicted."""
        removed = {"chunks": 0, "files": 0, "bytes": 0}
        with folder_lock(self.root, wait) as locked:
            if not locked:
                return removed
            need = self.excess() if need is None else need
            if need <= 0:
                return removed
            candidates = sorted(c for c in self._candidates() if c[2] != keep)
            left = collections.Counter(stem for _, kind, stem, _, _ in candidates if kind == "chunk")
            for _, kind, stem, index, size in candidates:
                if removed["bytes"] >= need:
                    break
                if kind == "file":
                    _remove(stem)
                    removed["files"] += 1
                elif not self._evict_chunk(stem, index):
                    continue
                else:
                    removed["chunks"] += 1
                    left[stem] -= 1
                    if not left[stem]:
                        self._remove_empty(stem)
                removed["bytes"] += size
        self._count(evicted_chunks=removed["chunks"], evicted_files=removed["files"])
        return removed

    def _candidates(self) -> Iterator[tuple[Any, ...]]:
        """(last use, "file"|"chunk", path stem, chunk, bytes freed) of every sealed file and every present
        chunk of an unsealed one."""
        for sub in scandir(self.dir):
            for item in scandir(sub.path):
                if not item.name.endswith(".idx"):
                    continue
                stem = item.path[:-4]
                try:
                    with open(item.path, "rb") as fh:
                        raw = fh.read()
                    _, _, sealed = parse_header(raw, bytes.fromhex(os.path.basename(stem)))
                    blocks = os.stat(stem + ".data").st_blocks * 512
                except (OSError, ValueError):
                    continue
                records = list(_RECORD.iter_unpack(raw[HEADER_SIZE: HEADER_SIZE + (len(raw) - HEADER_SIZE)
                                                       // RECORD * RECORD]))
                if sealed:
                    yield (max((used for _, _, used in records), default=0), "file", stem, -1,
                           blocks + len(raw))
                    continue
                for i, (_, length, used) in enumerate(records):
                    if length:
                        yield used, "chunk", stem, i, length

    def _remove_empty(self, stem: str) -> None:
        """An unsealed file whose every chunk was evicted: its data and index removed too, unless a fetcher
        holds a lease in it (it is being filled)."""
        try:
            data = os.open(stem + ".data", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not range_lease.held_elsewhere(data, 0, 0):  # (length 0: to the end of the file and beyond)
                _remove(stem)
        except OSError:
            pass
        finally:
            os.close(data)

    def _evict_chunk(self, stem: str, index: int) -> bool:
        """Punch chunk ``index`` of an unsealed file: its record cleared and synced first; skipped while a
        fetcher holds its lease (it is being written)."""
        try:
            data = os.open(stem + ".data", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            if not range_lease.try_lock(data, index * CHUNK, CHUNK):
                return False
            try:
                fd = os.open(stem + ".idx", os.O_RDWR | os.O_CLOEXEC)
                try:
                    _, _, sealed = parse_header(os.pread(fd, HEADER_SIZE, 0),
                                                     bytes.fromhex(os.path.basename(stem)))
                    if sealed:
                        return False  # sealed meanwhile: only whole
                    os.pwrite(fd, bytes(RECORD), HEADER_SIZE + index * RECORD)
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
                punch_hole(data, index * CHUNK, CHUNK)
                return True
            finally:
                range_lease.unlock(data, index * CHUNK, CHUNK)
        except (OSError, ValueError):
            return False
        finally:
            os.close(data)

    def usage(self) -> dict[str, int]:
        """{"files": remote files stored, "bytes": what their data and indexes take on disk}."""
        found = {"files": 0, "bytes": 0}
        for sub in scandir(self.dir):
            for item in scandir(sub.path):
                with contextlib.suppress(OSError):
                    found["bytes"] += item.stat(follow_symlinks=False).st_blocks * 512
                    found["files"] += item.name.endswith(".data")
        return found

    def clear(self) -> dict[str, int]:
        """Delete every stored file (``ckptfs cache clear``)."""
        removed = {"files": 0, "bytes": 0}
        with folder_lock(self.root, True):
            for sub in scandir(self.dir):
                for item in scandir(sub.path):
                    with contextlib.suppress(OSError):
                        size = item.stat(follow_symlinks=False).st_blocks * 512
                        os.unlink(item.path)
                        removed["files"] += item.name.endswith(".data")
                        removed["bytes"] += size
        return removed

    # -- trouble and counters ------------------------------------------------------------------------

    def forget_files(self) -> None:
        """In a forked child: open the store's files afresh (the parent's descriptions hold its leases)."""
        self._files = {}
        self._copies = {}  # (a check under way in the parent has no thread here)
        self._lock = threading.Lock()
        self._copy_lock = threading.Lock()


def free_and_floor(root: str | os.PathLike[str], min_free: float) -> tuple[int, int]:
    """(bytes free, the ``--cache-dir-min-free`` floor in bytes) of the file system of ``root``: what can be
    written before it is down to ``min_free`` percent free is the difference (negative: below it already)."""
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize, int(st.f_blocks * st.f_frsize * min_free / 100)


def folder_bytes(root: Path) -> int:
    """What the cache folder takes on disk: ``st_blocks`` of every file under it (holes are free)."""
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total



def _remove(stem: str) -> None:
    """A stored file's index, then its data: nothing claims the bytes once the index is gone."""
    unlink(stem + ".idx")
    unlink(stem + ".data")


def _write_all(fd: int, views: list[memoryview], offset: int) -> int:
    """``views`` one after the other at ``offset`` by ``pwritev`` (again for what a short write left)."""
    total = sum(view.nbytes for view in views)
    done = 0
    while done < total:
        done += os.pwritev(fd, views_after(views, done)[:1024], offset + done)
    return total

