"""The one entry format of the lower cache tiers: a 64-byte header, then the payload.

A disk file and a Redis value hold the same bytes, so one encoder and one checker serve both. The header
names what the payload must be, and a reader believes nothing it cannot check:

    offset  size  field
    0       8     magic  b"CKPTFSE2"
    8       8     dtype  numpy dtype string ("<f4", "|u1"), NUL-padded ASCII
    16      8     payload length in bytes (little-endian uint64)
    24      16    blake2b-128 of the cache key: an entry stored under another key (a hash collision, a
                  value copied to another name) is refused, never served
    40      4     crc32 of the payload (zlib's polynomial: ``ckptfs.util.crc``)
    44      4     crc32 of bytes 0..44 (a torn or garbage header is caught before its length is believed)
    48      16    MAC: the first 16 bytes of HMAC-SHA256(tier key, bytes 0..40 + payload); zero in a tier
                  without a key (a Redis trusted as-is, ``auth.py``)

The payload starts at byte 64, so a mapped entry's values are aligned for every numpy dtype.

crc32s catch damage, not intent: anyone can recompute them, so a tier with a key (every disk folder, a Redis
given ``--cache-key-file``) checks the MAC instead of the payload crc32, and an entry whose MAC fails is
``ForgedEntry`` (overwritten by someone without the key, or written under another key) when its crc32s
still agree, ``BadEntry`` (damage) when they do not. HMAC-SHA256 over BLAKE2b because it is the faster of
the two on CPUs with SHA extensions (docs/caches.md).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import mmap
import struct
import zlib
from typing import TYPE_CHECKING, Any


from ckptfs.util.crc import crc32

if TYPE_CHECKING:  # (imported where values are decoded: a remote fetch into the store does not need numpy)
    import numpy as np

MAGIC = b"CKPTFSE2"
HEADER_SIZE = 64
MAC_SIZE = 16
_HEAD = struct.Struct("<8s8sQ16sI")  # the fields the header crc covers (44 bytes)
_MACED = 40                          # header bytes the MAC covers (magic, dtype, length, key digest)
_MAC_AT = _HEAD.size + 4             # 48


class BadEntry(ValueError):
    """A stored entry that must not be served (why: the message)."""


class ForgedEntry(BadEntry):
    """An entry whose checksums agree but whose MAC does not: written without this tier's key."""


def key_digest(key: str) -> bytes:
    """16 bytes naming ``key``: a file name on disk, a Redis key, and the header's key check."""
    return hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=16).digest()


def payload_crc(payload: bytes | memoryview, value: int = 0) -> int:
    """The payload's crc32 (``value``: of the bytes before it, for a payload checksummed piece by piece)."""
    return crc32(payload, value) & 0xFFFFFFFF


@functools.lru_cache(maxsize=64)
def _dtype_field(dtype: np.dtype | str) -> bytes:
    import numpy as np

    return str(np.dtype(dtype).str).encode("ascii")


def _fields(key: str, dtype: np.dtype | str, length: int) -> bytes:
    """Header bytes 0..40, the part the MAC covers."""
    return _HEAD.pack(MAGIC, _dtype_field(dtype), length, key_digest(key), 0)[:_MACED]


def new_mac(mac_key: bytes, key: str, dtype: np.dtype | str, length: int) -> Any:
    """A MAC being computed for an entry of ``length`` payload bytes: ``update`` it with the payload, then
    pass it to ``make_header`` (an entry can be written step by step, never held whole)."""
    return hmac.new(mac_key, _fields(key, dtype, length), hashlib.sha256)


def make_header(key: str, dtype: np.dtype | str, length: int, crc: int, mac: Any = None) -> bytes:
    """The header; ``mac``: ``new_mac``'s object fed the whole payload (None: a tier without a key)."""
    head = _fields(key, dtype, length) + struct.pack("<I", crc)
    tag = bytes(MAC_SIZE) if mac is None else mac.digest()[:MAC_SIZE]
    return head + struct.pack("<I", zlib.crc32(head) & 0xFFFFFFFF) + tag


def encode(key: str, value: np.ndarray, mac_key: bytes | None = None) -> tuple[bytes, memoryview]:
    """(header, payload) for a 1-D contiguous array; the payload is a view of ``value``, not a copy."""
    import numpy as np

    payload = np.ascontiguousarray(value).data.cast("B")
    return header_for(key, value.dtype, [payload], mac_key), payload


def header_for(key: str, dtype: np.dtype | str, parts: list[Any], mac_key: bytes | None = None) -> bytes:
    """The header of an entry whose payload is ``parts`` (buffers at hand, e.g. the chunks of a run) one
    after the other: checksummed part by part, never joined, so the entry can be written in one call."""
    length = sum(memoryview(part).nbytes for part in parts)
    mac = new_mac(mac_key, key, dtype, length) if mac_key is not None else None
    crc = 0
    for part in parts:
        crc = payload_crc(part, crc)
        if mac is not None:
            mac.update(part)
    return make_header(key, dtype, length, crc, mac)


def parse_header(key: str, header: bytes | memoryview | mmap.mmap) -> tuple[np.dtype, int, int]:
    """(dtype, payload length, payload crc) of a header written for ``key``; BadEntry if it is not one."""
    import numpy as np

    if len(header) < HEADER_SIZE:
        raise BadEntry(f"short header ({len(header)} bytes)")
    header = bytes(header[:HEADER_SIZE])
    if header[:8] != MAGIC:
        raise BadEntry("bad magic")
    (head_crc,) = struct.unpack_from("<I", header, _HEAD.size)
    if zlib.crc32(header[:_HEAD.size]) & 0xFFFFFFFF != head_crc:
        raise BadEntry("header checksum mismatch")
    _, dtype_str, length, digest, crc = _HEAD.unpack_from(header)
    if digest != key_digest(key):
        raise BadEntry("entry belongs to another key")
    try:
        dtype = np.dtype(dtype_str.rstrip(b"\0").decode("ascii"))
    except (TypeError, ValueError, UnicodeDecodeError):
        raise BadEntry(f"bad dtype {dtype_str!r}") from None
    if dtype.hasobject or dtype.itemsize == 0 or length % dtype.itemsize:
        raise BadEntry(f"length {length} is not a whole number of {dtype}")
    return dtype, length, crc


def decode(key: str, data: bytes | memoryview | mmap.mmap, offset: int = 0, mac_key: bytes | None = None) -> np.ndarray:
    """The read-only 1-D array stored in ``data`` (bytes, memoryview or mmap) for ``key``, without copying;
    BadEntry when anything in it does not check out (ForgedEntry: the MAC under ``mac_key``, when given)."""
    import numpy as np

    view = memoryview(data)[offset:]
    dtype, length, crc = parse_header(key, view[:HEADER_SIZE])
    if len(view) != HEADER_SIZE + length:
        raise BadEntry(f"payload is {len(view) - HEADER_SIZE} bytes, header says {length}")
    payload = view[HEADER_SIZE:]
    if mac_key is not None:
        mac = hmac.new(mac_key, bytes(view[:_MACED]), hashlib.sha256)
        mac.update(payload)
        if not hmac.compare_digest(mac.digest()[:MAC_SIZE], bytes(view[_MAC_AT:HEADER_SIZE])):
            if payload_crc(payload) != crc:
                raise BadEntry("payload checksum mismatch")
            raise ForgedEntry("MAC mismatch: not written with this cache's key")
    elif payload_crc(payload) != crc:
        raise BadEntry("payload checksum mismatch")
    values = np.frombuffer(payload, dtype)
    if values.flags.writeable:
        values.setflags(write=False)
    return values


def chunk_mac(mac_key: bytes, file_digest: bytes, index: int, data: bytes | memoryview) -> bytes:
    """The ``MAC_SIZE``-byte MAC of chunk ``index`` (``data``, its bytes) of the stored file named by
    ``file_digest`` (``key_digest`` of its content identity): a sparse store's per-chunk check
    (``sparse_store.py``). The chunk's number and length are covered, so a chunk copied to another place or
    cut short fails it."""
    mac = hmac.new(mac_key, file_digest + struct.pack("<QI", index, memoryview(data).nbytes), hashlib.sha256)
    mac.update(data)
    return mac.digest()[:MAC_SIZE]


def sealed_stamp(mac_key: bytes, file_digest: bytes, st_ino: int, st_size: int, mtime_ns: int, ctime_ns: int,
                 boot_id: bytes) -> bytes:
    """The ``MAC_SIZE``-byte stamp a sealed file of the sparse store gets once its every chunk's MAC is known
    good (written by the process that sealed it, or that checked it): its data file's inode, size, mtime and
    ctime, and the boot, under the folder's key. A process that finds the stamp still matching skips the
    check: any write to the data file moves its ctime (which no ``touch -r`` sets back), and a reboot (a crash
    that may have lost blocks) changes the boot's id."""
    facts = struct.pack("<QQqq", st_ino, st_size, mtime_ns, ctime_ns)
    return hmac.new(mac_key, b"sealed\0" + file_digest + facts + boot_id, hashlib.sha256).digest()[:MAC_SIZE]
