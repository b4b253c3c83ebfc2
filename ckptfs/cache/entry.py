"""The one entry format of the lower cache tiers: a 64-byte header, then the payload.

A disk file and a Redis value hold the same bytes, so one encoder and one checker serve both. The header
names what the payload must be, and a reader believes nothing it cannot check:

    offset  size  field
    0       8     magic  b"CKPTFSE1"
    8       8     dtype  numpy dtype string ("<f4", "|u1"), NUL-padded ASCII
    16      8     payload length in bytes (little-endian uint64)
    24      16    blake2b-128 of the cache key: an entry stored under another key (a hash collision, a
                  value copied or overwritten by someone else) is refused, never served
    40      4     crc32 of the payload (zlib; ~3 GB/s here, cheaper than any decode it saves)
    44      4     crc32 of bytes 0..44 (a torn or garbage header is caught before its length is believed)
    48      16    zero

The payload starts at byte 64, so a mapped entry's values are aligned for every numpy dtype.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

import numpy as np

MAGIC = b"CKPTFSE1"
HEADER_SIZE = 64
_HEAD = struct.Struct("<8s8sQ16sI")  # the fields the header crc covers (44 bytes)


class BadEntry(ValueError):
    """A stored entry that must not be served (why: the message)."""


def key_digest(key: str) -> bytes:
    """16 bytes naming ``key``: a file name on disk, a Redis key, and the header's key check."""
    return hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=16).digest()


def payload_crc(payload) -> int:
    return zlib.crc32(payload) & 0xFFFFFFFF


def make_header(key: str, dtype: np.dtype | str, length: int, crc: int) -> bytes:
    dtype_str = np.dtype(dtype).str.encode("ascii")
    head = _HEAD.pack(MAGIC, dtype_str, length, key_digest(key), crc)
    return head + struct.pack("<I", zlib.crc32(head) & 0xFFFFFFFF) + bytes(HEADER_SIZE - _HEAD.size - 4)


def encode(key: str, value: np.ndarray) -> tuple[bytes, memoryview]:
    """(header, payload) for a 1-D contiguous array; the payload is a view of ``value``, not a copy."""
    payload = memoryview(np.ascontiguousarray(value)).cast("B")
    return make_header(key, value.dtype, payload.nbytes, payload_crc(payload)), payload


def parse_header(key: str, header) -> tuple[np.dtype, int, int]:
    """(dtype, payload length, payload crc) of a header written for ``key``; BadEntry if it is not one."""
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


def decode(key: str, data, offset: int = 0) -> np.ndarray:
    """The read-only 1-D array stored in ``data`` (bytes, memoryview or mmap) for ``key``, without copying;
    BadEntry when anything in it does not check out."""
    view = memoryview(data)[offset:]
    dtype, length, crc = parse_header(key, view[:HEADER_SIZE])
    if len(view) != HEADER_SIZE + length:
        raise BadEntry(f"payload is {len(view) - HEADER_SIZE} bytes, header says {length}")
    payload = view[HEADER_SIZE:]
    if payload_crc(payload) != crc:
        raise BadEntry("payload checksum mismatch")
    values = np.frombuffer(payload, dtype)
    if values.flags.writeable:
        values.setflags(write=False)
    return values
