"""GGUF key/value values: walking them at open (validate + measure) and decoding them on demand.

Opening must be fast even with a 262,144-entry string vocabulary, so the walk only checks that every length
and count fits in the bytes that remain and finds where each value ends; the values themselves are decoded
later by :func:`decode_value` from an immutable copy of the header bytes. Every count is checked against the
bytes remaining *before* any loop or allocation, so a hostile count of 2^60 fails at once.

Value type ids and sizes are from the GGUF specification (ggml ``docs/gguf.md``, ``gguf_type``).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptfs.core.errors import CheckpointError
from ckptfs.formats._prefix import FilePrefix

try:
    from ckptfs.formats import _strings
except ImportError:  # not built (no compiler at install time, or a source checkout): the Python loop
    _strings = None  # type: ignore[assignment]  # not built: the Python path serves

#: ``CKPTFS_NO_NATIVE=1`` (read at import, as for the dequantization kernels): the Python loop only.
NO_NATIVE = os.environ.get("CKPTFS_NO_NATIVE", "") not in ("", "0")

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)

TYPE_NAMES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY",
              "UINT64", "INT64", "FLOAT64")

#: struct format character of each fixed-size value type (BOOL is read as a byte: ggml treats non-zero as true).
FIXED_FORMATS = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i", FLOAT32: "f",
                 BOOL: "B", UINT64: "Q", INT64: "q", FLOAT64: "d"}
FIXED_SIZES = {t: struct.calcsize(c) for t, c in FIXED_FORMATS.items()}
UNSIGNED_TYPES = frozenset((UINT8, UINT16, UINT32, UINT64))

#: Arrays may contain arrays (the spec allows it, ggml refuses it, gguf-py reads it); deeper than this is
#: refused so that a hostile file cannot drive recursion.
MAX_ARRAY_DEPTH = 8

_MIN_STRING = 8            # u64 length, empty string
_MIN_ARRAY = 4 + 8         # u32 element type, u64 count, no elements


@dataclass(frozen=True)
class ValueEntry:
    """Where one value lives in the header bytes. ``start`` is the first byte after the type field."""

    vtype: int
    start: int
    end: int
    elem_type: int | None = None   # arrays: type of the elements
    count: int = 0                 # arrays: number of elements


def type_name(vtype: int) -> str:
    return TYPE_NAMES[vtype] if 0 <= vtype < len(TYPE_NAMES) else f"type {vtype}"


def describe(entry: ValueEntry) -> str:
    """``UINT32``, ``STRING``, ``ARRAY[FLOAT32]``, ``ARRAY[ARRAY]`` (inner arrays may differ in type)."""
    if entry.vtype == ARRAY:
        return f"ARRAY[{type_name(entry.elem_type) if entry.elem_type is not None else 'ARRAY'}]"
    return type_name(entry.vtype)


class ValueWalker:
    """Validates and measures values in a :class:`FilePrefix`, in one byte order ('<' or '>')."""

    def __init__(self, prefix: FilePrefix, order: str) -> None:
        self.prefix = prefix
        self.path = prefix.path
        self.order = order
        self._u32 = struct.Struct(order + "I")
        self._u64 = struct.Struct(order + "Q")

    def fail(self, offset: int, reason: str) -> CheckpointError:
        return CheckpointError(self.path, offset, reason)

    def ensure(self, offset: int, nbytes: int, what: str) -> None:
        """Make ``[offset, offset + nbytes)`` loaded, or refuse: the header is cut short there."""
        end = offset + nbytes
        if not self.prefix.has(end):
            raise self.fail(offset, f"header cut short: {what} needs bytes {offset}..{end}, "
                                    f"file has {self.prefix.size}")
        self.prefix.need(end)

    def u32(self, offset: int, what: str) -> int:
        self.ensure(offset, 4, what)
        return int(self._u32.unpack_from(self.prefix.data, offset)[0])

    def u64(self, offset: int, what: str) -> int:
        self.ensure(offset, 8, what)
        return int(self._u64.unpack_from(self.prefix.data, offset)[0])

    def string(self, offset: int, what: str) -> tuple[int, int]:
        """The byte span of the string at ``offset`` (after its length), checked against the file."""
        length = self.u64(offset, what + " length")
        start = offset + 8
        if length > self.prefix.size - start:
            raise self.fail(offset, f"{what} length {length} exceeds the {self.prefix.size - start} bytes left "
                                    f"in the file")
        self.ensure(start, length, what)
        return start, start + length

    def value(self, vtype: int, offset: int, what: str) -> ValueEntry:
        """Measure one value of type ``vtype`` starting at ``offset``."""
        size = FIXED_SIZES.get(vtype)
        if size is not None:
            self.ensure(offset, size, what)
            return ValueEntry(vtype, offset, offset + size)
        if vtype == STRING:
            _, end = self.string(offset, what)
            return ValueEntry(vtype, offset, end)
        if vtype == ARRAY:
            elem_type, count, end = self.array(offset, 1, what)
            return ValueEntry(vtype, offset, end, elem_type, count)
        raise self.fail(offset - 4, f"{what}: unknown value type {vtype}")

    def array(self, offset: int, depth: int, what: str) -> tuple[int, int, int]:
        """(element type, count, end) of the array whose element-type field is at ``offset``."""
        elem_type = self.u32(offset, what + " element type")
        count = self.u64(offset + 4, what + " element count")
        first = offset + 12
        remaining = self.prefix.size - first
        size = FIXED_SIZES.get(elem_type)
        min_size = size if size is not None else {STRING: _MIN_STRING, ARRAY: _MIN_ARRAY}.get(elem_type)
        if min_size is None:
            raise self.fail(offset, f"{what}: unknown array element type {elem_type}")
        if count * min_size > remaining:
            raise self.fail(offset + 4, f"{what}: array of {count} {type_name(elem_type)} needs at least "
                                        f"{count * min_size} bytes, {remaining} left in the file")
        if size is not None:
            end = first + count * size
            self.ensure(first, count * size, what)
        elif elem_type == STRING:
            end = self.skip_strings(first, count, what)
        else:
            if depth >= MAX_ARRAY_DEPTH:
                raise self.fail(offset, f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels")
            end = first
            for i in range(count):
                _, _, end = self.array(end, depth + 1, f"{what}[{i}]")
        return elem_type, count, end

    def skip_strings(self, offset: int, count: int, what: str) -> int:
        """End of ``count`` back-to-back strings at ``offset``: only their lengths are read.

        This is the hot loop of opening a file with a big vocabulary (Gemma 3: 262,144 tokens), so the walk
        over the loaded bytes is C when the optional extension is built (``_strings``: docs/performance.md),
        else a loop whose body is a single unpack and add per string. A walk stops at a length field
        beyond the loaded bytes (then more is loaded, or the file is too short); a string body that ends
        beyond the file is caught the same way by the next length, and for the last string by the final
        check.
        """
        size = self.prefix.size
        pos, left = offset, count
        while left:
            data = self.prefix.data
            pos, done = self._walk_strings(data, pos, left)
            left -= done
            if not left:
                break
            # the walk stopped before string ``count - left``: its length field lies beyond the file, or it
            # was loaded (the C walk refuses a string that ends past any file) and the string runs past the end
            if pos + 8 > size or pos + 8 <= len(data):
                self._raise_bad_string(offset, count, what)
            self.prefix.need(pos + 8)
        if pos > size:
            self._raise_bad_string(offset, count, what)
        return pos

    def _walk_strings(self, data: bytes | bytearray | memoryview, pos: int, count: int) -> tuple[int, int]:
        """(where the walk stopped, strings skipped) over at most ``count`` strings of the loaded ``data``."""
        if _strings is not None and not NO_NATIVE:
            return _strings.skip(data, pos, count, self.order == ">")
        unpack = self._u64.unpack_from
        done = 0
        try:
            for done in range(count):  # noqa: B007 - ``done`` counts the strings read before a failure
                pos += 8 + unpack(data, pos)[0]
        except (struct.error, OverflowError):
            return pos, done
        return pos, count

    def _raise_bad_string(self, offset: int, count: int, what: str) -> None:
        """Find and report the exact string that runs past the end of the file (error path only)."""
        pos = offset
        for i in range(count):
            _, pos = self.string(pos, f"{what}[{i}]")
        raise self.fail(offset, f"{what}: strings run past the end of the file")


def decode_value(data: bytes, order: str, entry: ValueEntry) -> Any:
    """The Python value of ``entry`` (numbers, bool, str; arrays as numpy arrays or lists)."""
    if entry.vtype == ARRAY:
        value, _ = _decode_array(data, order, entry.start)
        return value
    return _decode_scalar(data, order, entry.vtype, entry.start)


def _decode_scalar(data: bytes, order: str, vtype: int, offset: int) -> Any:
    if vtype == STRING:
        (length,) = struct.unpack_from(order + "Q", data, offset)
        return str(data[offset + 8:offset + 8 + length], "utf-8", "surrogateescape")
    (value,) = struct.unpack_from(order + FIXED_FORMATS[vtype], data, offset)
    return value != 0 if vtype == BOOL else value


def _decode_array(data: bytes, order: str, offset: int) -> tuple[Any, int]:
    """(value, end) of the array whose element-type field is at ``offset``."""
    elem_type, count = struct.unpack_from(order + "IQ", data, offset)
    pos = offset + 12
    if elem_type in FIXED_FORMATS:
        size = FIXED_SIZES[elem_type]
        if elem_type == BOOL:
            values = np.frombuffer(data, np.uint8, count, pos) != 0
        else:
            stored = np.dtype(order + FIXED_FORMATS[elem_type])
            values = np.frombuffer(data, stored, count, pos).astype(stored.newbyteorder("<"))
        return values, pos + count * size
    if elem_type == STRING:
        unpack = struct.Struct(order + "Q").unpack_from
        strings: list[str] = []
        append = strings.append
        for _ in range(count):
            length = unpack(data, pos)[0]
            pos += 8
            append(str(data[pos:pos + length], "utf-8", "surrogateescape"))
            pos += length
        return strings, pos
    items = []
    for _ in range(count):
        item, pos = _decode_array(data, order, pos)
        items.append(item)
    return items, pos
