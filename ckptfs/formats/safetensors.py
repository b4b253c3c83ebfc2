"""safetensors header -> tensor descriptors and the ``__metadata__`` map.

Layout: u64 little-endian header length N, N bytes of UTF-8 JSON, then the data buffer; each tensor entry
gives ``dtype``, ``shape`` and ``data_offsets`` [begin, end) relative to byte 8 + N.

The header rules are those of the reference implementation, safetensors 0.8.0, established by feeding it
hand-made files (tests/formats/test_safetensors_reader.py keeps that comparison alive): a file 0.8.0 refuses, we
refuse; a file it accepts, we accept - including its leniencies (leading whitespace, duplicate tensor
names where the last entry wins, misaligned offsets, unknown extra fields, ``"__metadata__": null``).
We differ on purpose in two places (docs/interfaces.md, damage rules): data missing at the end of the file (0.8.0
refuses the whole file, ckptfs serves the tensors whose bytes are present and marks the others damaged), and
a dtype name 0.8.0 does not know (it refuses the file; ckptfs lists that tensor raw-only with the reason in
``damaged``, its size taken from ``data_offsets``): newer safetensors versions add dtypes, and one tensor of a
new type must not hide the others. A dtype that is not a string is still refused (a broken header).
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ckptfs.core.descriptors import ParsedCheckpoint, TensorInfo, TensorTable
from ckptfs.core.errors import CheckpointError
from ckptfs.quant import codec_for
from ckptfs.formats._common import only_checkpoint_errors, truncation_reason
from ckptfs.formats._prefix import FilePrefix
from ckptfs.sources import DEFAULT_OPENER, Opener

#: dtype name -> bits per element (safetensors ``Dtype``, 0.8.0). Names are case-sensitive.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

#: The reference refuses headers longer than this (safetensors ``MAX_HEADER_SIZE``).
MAX_HEADER_SIZE = 100_000_000
#: Deepest JSON nesting (objects and arrays, the header object included) that the reference parses: its
#: serde_json parser stops at a depth of 128; measured against 0.8.0, 127 levels pass and 128 fail.
MAX_JSON_DEPTH = 127
METADATA_KEY = "__metadata__"
_USIZE_LIMIT = 1 << 64
_FIELDS = ("dtype", "shape", "data_offsets")
#: A JSON escape of a UTF-16 surrogate; only then can a parsed string hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class _Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class _Pairs(list[Any]):
    """A JSON object as its (key, value) pairs, so that duplicate keys stay visible."""


@only_checkpoint_errors
def read_safetensors(path: str, opener: Opener = DEFAULT_OPENER) -> ParsedCheckpoint:
    """Parse the safetensors file at ``path``; CheckpointError if its header breaks the format's rules."""
    with FilePrefix(path, opener=opener) as prefix:
        header_length, text = _read_header(prefix)
        file_size = prefix.size
    return _Header(path, header_length, file_size).build(text)


def _read_header(prefix: FilePrefix) -> tuple[int, str]:
    path, size = prefix.path, prefix.size
    if size < 8:
        raise CheckpointError(path, 0, f"header too small: the 8-byte header length needs bytes 0..8, "
                                       f"file has {size}")
    prefix.need(8)
    (length,) = struct.unpack_from("<Q", prefix.data, 0)
    if length > MAX_HEADER_SIZE:
        raise CheckpointError(path, 0, f"header length {length} exceeds the safetensors limit of "
                                       f"{MAX_HEADER_SIZE} bytes")
    if 8 + length > size:
        raise CheckpointError(path, 0, f"header cut short: header length {length} needs bytes 8..{8 + length}, "
                                       f"file has {size}")
    prefix.need(8 + length)
    raw = bytes(prefix.data[8:8 + length])
    try:
        return length, raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(path, 8 + exc.start, "header is not valid UTF-8") from None


class _Header:
    def __init__(self, path: str, header_length: int, file_size: int) -> None:
        self.path = path
        self.data_start = 8 + header_length
        self.file_size = file_size

    def fail(self, reason: str, offset: int = 8) -> CheckpointError:
        return CheckpointError(self.path, offset, reason)

    def build(self, text: str) -> ParsedCheckpoint:
        fast = self._fast_build(text)
        if fast is not None:
            return fast
        pairs = self._parse_json(text)
        if _SURROGATE_ESCAPE.search(text):
            self._refuse_lone_surrogates(pairs)
        metadata, entries = self._split(pairs)
        ordered = sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end))
        buffer_end = self._validate_layout(ordered)
        tensors = [self._describe(name, entry) for name, entry in ordered]
        notes = []
        end_of_data = self.data_start + buffer_end
        if end_of_data < self.file_size:
            notes.append(f"{self.file_size - end_of_data} trailing bytes after the last tensor "
                         f"(bytes {end_of_data}..{self.file_size}) are not part of any tensor")
        return ParsedCheckpoint(format="safetensors", version=None, files=(self.path,), tensors=tensors,
                                metadata=MappingProxyType(metadata), notes=notes)

    def _fast_build(self, text: str) -> ParsedCheckpoint | None:
        """The common case in a few passes over columns: a header with no duplicate keys, no unknown fields,
        no ``-0``, no surrogate escapes, and every rule of the layout kept. It returns the same checkpoint
        the exact path would, as a :class:`TensorTable`; anything unusual returns None and the exact path
        (pairs, one entry at a time) decides and explains. A 94,000-tensor header: parse plus checks in
        about the time of ``json.loads`` alone."""
        if "-0" in text or _SURROGATE_ESCAPE.search(text) or text.count(f'"{METADATA_KEY}"') > 1:
            return None
        try:
            doc = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
        except (ValueError, RecursionError):
            return None
        if type(doc) is not dict:
            return None
        # A key repeated inside an entry is an error of the reference's; dicts would hide it. Each entry has
        # exactly the three fields (checked below), so each field name occurs once per entry in the text
        # unless one is repeated (a quote inside a string is escaped, so the count sees real keys only, plus
        # any name or metadata value equal to a field name: the exact path then decides). A repeated tensor
        # name needs no check: dicts keep the last entry, which is the reference's rule too.
        entries = len(doc) - (METADATA_KEY in doc)
        if any(text.count(f'"{field}"') != entries for field in _FIELDS):
            return None
        metadata = doc.pop(METADATA_KEY, None)
        if metadata is not None and (type(metadata) is not dict
                                     or not all(type(v) is str for v in metadata.values())):
            return None
        rows = []
        for name, entry in doc.items():
            if type(entry) is not dict or len(entry) != 3:
                return None
            dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
            if (type(dtype) is not str or type(shape) is not list or type(offsets) is not list
                    or len(offsets) != 2):
                return None
            begin, end = offsets
            if type(begin) is not int or type(end) is not int or not 0 <= begin <= end < _USIZE_LIMIT:
                return None
            rows.append((begin, end, name, dtype, shape))
        rows.sort(key=_by_offsets)
        position = 0
        for begin, end, _name, dtype, shape in rows:
            if begin != position:
                return None
            position = end
            count = 1
            for dim in shape:  # the reference refuses a running product that overflows, even before a 0
                if type(dim) is not int or dim < 0:
                    return None
                count *= dim
                if count >= _USIZE_LIMIT:
                    return None
            bits = DTYPE_BITS.get(dtype)
            if bits is not None and (count * bits >= _USIZE_LIMIT or count * bits % 8
                                     or count * bits // 8 != end - begin):
                return None
        return self._table(rows, position, metadata or {})

    def _table(self, rows: list[Any], buffer_end: int, metadata: dict[str, str]) -> ParsedCheckpoint:
        start, size = self.data_start, self.file_size
        names = [row[2] for row in rows]
        storage_types = [row[3] for row in rows]
        geometry: dict[str, tuple[int, int]] = {}
        reasons: dict[str, str] = {}
        for dtype in set(storage_types):
            codec = codec_for(dtype) if dtype in DTYPE_BITS else None
            if codec is not None:
                geometry[dtype] = (codec.block_elements, codec.block_bytes)
            else:
                known = dtype in DTYPE_BITS
                reasons[dtype] = f"no codec for dtype {dtype}" if known else f"unknown dtype {dtype!r}"
        damaged: dict[int, str] = {}
        offsets = [start + row[0] for row in rows]
        stored = [row[1] - row[0] for row in rows]
        if start + buffer_end > size or reasons:  # the rare tensors that need a reason, one by one
            for i, (offset, nbytes, dtype) in enumerate(zip(offsets, stored, storage_types)):
                truncated = truncation_reason(offset, offset + nbytes, size) if offset + nbytes > size else None
                why = reasons.get(dtype)
                if why is not None:
                    damaged[i] = f"{why}: served raw only" + (f"; {truncated}" if truncated else "")
                elif truncated:
                    damaged[i] = truncated
        table = TensorTable(self.path, names, storage_types, [tuple(row[4]) for row in rows], offsets, stored,
                            geometry, damaged)
        notes = []
        end_of_data = start + buffer_end
        if end_of_data < size:
            notes.append(f"{size - end_of_data} trailing bytes after the last tensor "
                         f"(bytes {end_of_data}..{size}) are not part of any tensor")
        return ParsedCheckpoint(format="safetensors", version=None, files=(self.path,), tensors=table,
                                metadata=MappingProxyType(metadata), notes=notes)

    def _parse_json(self, text: str) -> _Pairs:
        try:
            value = json.loads(text, object_pairs_hook=_Pairs, parse_constant=_reject_constant,
                               parse_float=_finite_float, parse_int=_json_int)
        except json.JSONDecodeError as exc:
            offset = 8 + len(text[:exc.pos].encode("utf-8"))
            raise self.fail(f"header is not valid JSON: {exc.msg}", offset) from None
        except RecursionError:
            raise self.fail(f"header JSON is nested deeper than {MAX_JSON_DEPTH} levels") from None
        except ValueError as exc:  # a number JSON allows but the reference cannot hold (huge, NaN, inf)
            raise self.fail(f"header is not valid JSON: {exc}") from None
        if not isinstance(value, _Pairs):
            raise self.fail(f"header must be a JSON object, not {_json_kind(value)}")
        return value

    def _refuse_lone_surrogates(self, pairs: _Pairs) -> None:
        """serde_json refuses an escaped UTF-16 surrogate that is not part of a pair; Python keeps it."""
        stack: list[Any] = [pairs]
        while stack:
            node = stack.pop()
            items = node if not isinstance(node, _Pairs) else (part for pair in node for part in pair)
            for item in items:
                if isinstance(item, str):
                    if not item.isascii():
                        try:
                            item.encode("utf-8")
                        except UnicodeEncodeError:
                            raise self.fail(f"header holds an unpaired UTF-16 surrogate escape in {item!r}") \
                                from None
                elif isinstance(item, list):
                    stack.append(item)

    def _split(self, pairs: _Pairs) -> tuple[dict[str, str], dict[str, _Entry]]:
        metadata: dict[str, str] | None = None
        entries: dict[str, _Entry] = {}
        for key, value in pairs:
            if key == METADATA_KEY:
                if metadata is not None:
                    raise self.fail(f"duplicate {METADATA_KEY}")
                metadata = self._metadata(value)
            else:
                entries[key] = self._entry(key, value)  # a repeated name replaces the earlier entry, as in 0.8.0
        return metadata or {}, entries

    def _metadata(self, value: Any) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, _Pairs):
            raise self.fail(f"{METADATA_KEY} must be an object of strings, not {_json_kind(value)}")
        metadata = {}
        for key, item in value:
            if not isinstance(item, str):
                raise self.fail(f"{METADATA_KEY}[{key!r}] must be a string, not {_json_kind(item)}")
            metadata[key] = item
        return metadata

    def _entry(self, name: str, value: Any) -> _Entry:
        if not isinstance(value, _Pairs):
            raise self.fail(f"tensor {name!r}: entry must be an object, not {_json_kind(value)}")
        fields: dict[str, Any] = {}
        for key, item in value:
            if key in _FIELDS:
                if key in fields:
                    raise self.fail(f"tensor {name!r}: duplicate field {key!r}")
                fields[key] = item
            else:
                self._check_depth(item, 3, name)
        missing = [f for f in _FIELDS if f not in fields]
        if missing:
            raise self.fail(f"tensor {name!r}: missing field {missing[0]!r}")
        dtype, shape, offsets = fields["dtype"], fields["shape"], fields["data_offsets"]
        if not isinstance(dtype, str):
            raise self.fail(f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_usize(d) for d in shape):
            raise self.fail(f"tensor {name!r}: shape must be a list of non-negative integers, got {shape!r}")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_usize(o) for o in offsets):
            raise self.fail(f"tensor {name!r}: data_offsets must be two non-negative integers, got {offsets!r}")
        return _Entry(dtype, tuple(shape), offsets[0], offsets[1])

    def _check_depth(self, value: Any, depth: int, name: str) -> None:
        """Refuse JSON nested deeper than the reference parses (only unknown fields can nest)."""
        stack = [(value, depth)]
        while stack:
            node, level = stack.pop()
            if isinstance(node, list):
                if level > MAX_JSON_DEPTH:
                    raise self.fail(f"tensor {name!r}: header JSON is nested deeper than {MAX_JSON_DEPTH} levels")
                children = (v for _, v in node) if isinstance(node, _Pairs) else node
                stack.extend((child, level + 1) for child in children)

    def _validate_layout(self, ordered: list[tuple[str, _Entry]]) -> int:
        """The reference's layout rules; returns the end of the data buffer the header describes."""
        position = 0
        for name, entry in ordered:
            if entry.begin != position or entry.end < entry.begin:
                raise self.fail(f"tensor {name!r}: data_offsets [{entry.begin}, {entry.end}] do not continue the "
                                f"data buffer at {position} (tensors must be contiguous from 0, no gaps or overlaps)")
            position = entry.end
            count = 1
            for dim in entry.shape:
                count *= dim
                if count >= _USIZE_LIMIT:
                    raise self.fail(f"tensor {name!r}: shape {list(entry.shape)} overflows 64 bits")
            if entry.dtype not in DTYPE_BITS:  # a dtype we do not know: its bytes are whatever the offsets say
                continue
            bits = count * DTYPE_BITS[entry.dtype]
            if bits >= _USIZE_LIMIT:
                raise self.fail(f"tensor {name!r}: size of shape {list(entry.shape)} overflows 64 bits")
            if bits % 8:
                raise self.fail(f"tensor {name!r}: {count} {entry.dtype} elements are not a whole number of bytes")
            if bits // 8 != entry.end - entry.begin:
                raise self.fail(f"tensor {name!r}: {entry.dtype} shape {list(entry.shape)} needs {bits // 8} bytes, "
                                f"data_offsets give {entry.end - entry.begin}")
        return position

    def _describe(self, name: str, entry: _Entry) -> TensorInfo:
        offset = self.data_start + entry.begin
        stored = entry.end - entry.begin
        known = entry.dtype in DTYPE_BITS
        codec = codec_for(entry.dtype) if known else None  # never a GGUF type that happens to share the name
        damaged = truncation_reason(offset, offset + stored, self.file_size)
        if codec is None:
            why = f"no codec for dtype {entry.dtype}" if known else f"unknown dtype {entry.dtype!r}"
            damaged = f"{why}: served raw only" + (f"; {damaged}" if damaged else "")
        return TensorInfo(
            name=name,
            storage_type=entry.dtype,
            shape=entry.shape,
            source=self.path,
            offset=offset,
            stored_nbytes=stored,
            block_elements=codec.block_elements if codec else 0,
            block_bytes=codec.block_bytes if codec else 0,
            byte_order="<",
            damaged=damaged,
        )


def _by_offsets(row: tuple[Any, ...]) -> tuple[int, int]:
    return row[0], row[1]


def _is_usize(value: Any) -> bool:
    return type(value) is int and 0 <= value < _USIZE_LIMIT


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_int(text: str) -> int | float:
    """serde_json reads ``-0`` as the float -0.0 (so it is no valid size or offset); Python would say 0."""
    return -0.0 if text == "-0" else int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _json_kind(value: Any) -> str:
    if isinstance(value, _Pairs):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"
