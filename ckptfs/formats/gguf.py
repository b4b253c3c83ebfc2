"""GGUF header -> tensor descriptors and lazily decoded metadata.

Layout (ggml ``docs/gguf.md``): magic ``GGUF``, u32 version, u64 tensor count, u64 key/value count, the
key/value pairs, the tensor infos, zero padding to ``general.alignment``, then the data section. Big-endian
files keep the magic and store every other field big-endian; they are recognised, as ggml and gguf-py do,
by a version whose low 16 bits read as zero in little-endian.

Only v2 and v3 are read (v1 used 32-bit counts and is no longer produced or read by ggml). What is refused
and what is served around follows docs/interfaces.md, "Damage: refuse or serve"; each decision is
recorded in docs/formats.md.
"""

from __future__ import annotations

import struct
from functools import partial

from ckptfs.core.descriptors import ParsedCheckpoint, TensorInfo
from ckptfs.core.errors import CheckpointError
from ckptfs.quant import codec_for, geometry
from ckptfs.formats._common import INT64_MAX, join_reasons, only_checkpoint_errors, raw_extent, truncation_reason
from ckptfs.formats._prefix import FilePrefix
from ckptfs.sources import DEFAULT_OPENER, Opener
from ckptfs.formats.gguf_values import UNSIGNED_TYPES, ValueEntry, ValueWalker, decode_value, describe, type_name
from ckptfs.formats.lazy import LazyMetadata

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"

#: ggml accepts at most 4 dimensions (GGML_MAX_DIMS); we accept up to twice that so that a future writer is
#: not refused for no reason, while a hostile count still cannot make us allocate.
MAX_DIMS = 8

#: ggml ``enum ggml_type`` ids -> names (ggml.h, 2026-07). Ids 4, 5, 31-33 and 36-38 were removed and are
#: invalid in files; they, and any id not listed, are served raw-only as ``GGML_TYPE_<id>``.
GGML_TYPE_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16",
    34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4", 41: "Q1_0", 42: "Q2_0",
}

_HEADER_SIZE = 24                      # magic, version, tensor count, kv count
_MIN_KV = 8 + 4 + 1                    # empty key, type, smallest value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8       # empty name, n_dims = 0, type, offset


@only_checkpoint_errors
def read_gguf(path: str, opener: Opener = DEFAULT_OPENER) -> ParsedCheckpoint:
    """Parse the GGUF file at ``path``; CheckpointError if its header cannot be trusted."""
    with FilePrefix(path, opener=opener) as prefix:
        return _Parser(prefix).parse()


class _RawInfo:
    """One tensor info as stored, before the data section start is known."""

    __slots__ = ("name", "dims", "type_id", "relative_offset", "info_offset")

    def __init__(self, name: str, dims: tuple[int, ...], type_id: int, relative_offset: int, info_offset: int) -> None:
        self.name = name
        self.dims = dims
        self.type_id = type_id
        self.relative_offset = relative_offset
        self.info_offset = info_offset


class _Parser:
    def __init__(self, prefix: FilePrefix) -> None:
        self.prefix = prefix
        self.path = prefix.path
        self.size = prefix.size

    def fail(self, offset: int | None, reason: str) -> CheckpointError:
        return CheckpointError(self.path, offset, reason)

    def parse(self) -> ParsedCheckpoint:
        order, version = self._read_preamble()
        walker = ValueWalker(self.prefix, order)
        tensor_count = walker.u64(8, "tensor count")
        kv_count = walker.u64(16, "metadata count")
        self._check_count(kv_count, _MIN_KV, _HEADER_SIZE, 16, "metadata entries")
        self._check_count(tensor_count, _MIN_TENSOR_INFO, _HEADER_SIZE, 8, "tensors")

        entries, metadata_end = self._read_metadata(walker, kv_count)
        self._check_count(tensor_count, _MIN_TENSOR_INFO, metadata_end, 8, "tensors")
        infos, pos = self._read_tensor_infos(walker, tensor_count, metadata_end)

        snapshot = self.prefix.snapshot(metadata_end)
        metadata = LazyMetadata(entries, partial(decode_value, snapshot, order), describe)
        alignment = self._alignment(entries, metadata)
        data_start = pos + (-pos % alignment)
        tensors = self._describe_tensors(infos, data_start, order)
        notes = []
        if order == ">":
            notes.append("big-endian GGUF: tensors are byte-swapped before decoding where the storage type "
                         "allows it; the others are served raw only")
        return ParsedCheckpoint(format="gguf", version=version, files=(self.path,), tensors=tensors,
                                metadata=metadata, notes=notes)

    def _read_preamble(self) -> tuple[str, int]:
        """Check the magic and version; return the byte order ('<' or '>') and the version."""
        self.prefix.need(min(self.size, _HEADER_SIZE))
        data = self.prefix.data
        if data[:4] != MAGIC:
            raise self.fail(0, f"bad magic: not a GGUF file (starts with {bytes(data[:8])!r})")
        if self.size < 8:
            raise self.fail(4, f"header cut short: the version needs bytes 4..8, file has {self.size}")
        (version,) = struct.unpack_from("<I", data, 4)
        order = "<"
        if version & 0xFFFF == 0:
            order = ">"
            (version,) = struct.unpack_from(">I", data, 4)
        if version == 1:
            raise self.fail(4, "GGUF version 1 is the obsolete v1 format (32-bit counts and lengths) that "
                               "ggml no longer reads; convert the model again with a current llama.cpp")
        if version not in SUPPORTED_VERSIONS:
            raise self.fail(4, f"unsupported GGUF version {version} (ckptfs reads versions 2 and 3)")
        return order, version

    def _check_count(self, count: int, min_size: int, start: int, field_offset: int, what: str) -> None:
        """Refuse a count that could not fit in the rest of the file even if every item were minimal."""
        remaining = max(0, self.size - start)
        if count * min_size > remaining:
            raise self.fail(field_offset, f"{count} {what} cannot fit in the {remaining} bytes left in the file "
                                          f"(each takes at least {min_size})")

    def _read_metadata(self, walker: ValueWalker, count: int) -> tuple[dict[str, ValueEntry], int]:
        entries: dict[str, ValueEntry] = {}
        pos = _HEADER_SIZE
        for i in range(count):
            key_start, key_end = walker.string(pos, f"key of metadata entry {i}")
            key = str(self.prefix.data[key_start:key_end], "utf-8", "surrogateescape")
            if key in entries:
                raise self.fail(pos, f"duplicate metadata key {key!r}")
            vtype = walker.u32(key_end, f"value type of {key!r}")
            entry = walker.value(vtype, key_end + 4, f"value of {key!r}")
            entries[key] = entry
            pos = entry.end
        return entries, pos

    def _read_tensor_infos(self, walker: ValueWalker, count: int, pos: int) -> tuple[list[_RawInfo], int]:
        infos = []
        order = walker.order
        tail = struct.Struct(order + "IQ")
        for i in range(count):
            info_offset = pos
            name_start, name_end = walker.string(pos, f"name of tensor {i}")
            name = str(self.prefix.data[name_start:name_end], "utf-8", "surrogateescape")
            n_dims = walker.u32(name_end, f"dimension count of tensor {name!r}")
            if n_dims > MAX_DIMS:
                raise self.fail(name_end, f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS} accepted)")
            dims_start = name_end + 4
            walker.ensure(dims_start, 8 * n_dims + tail.size, f"dimensions, type and offset of tensor {name!r}")
            data = self.prefix.data
            dims = struct.unpack_from(f"{order}{n_dims}Q", data, dims_start)
            type_id, relative_offset = tail.unpack_from(data, dims_start + 8 * n_dims)
            infos.append(_RawInfo(name, dims, type_id, relative_offset, info_offset))
            pos = dims_start + 8 * n_dims + tail.size
        return infos, pos

    def _alignment(self, entries: dict[str, ValueEntry], metadata: LazyMetadata[ValueEntry]) -> int:
        entry = entries.get(ALIGNMENT_KEY)
        if entry is None:
            return DEFAULT_ALIGNMENT
        if entry.vtype not in UNSIGNED_TYPES:
            raise self.fail(entry.start, f"{ALIGNMENT_KEY} has type {type_name(entry.vtype)}; "
                                         "it must be an unsigned integer")
        alignment = metadata[ALIGNMENT_KEY]
        if alignment == 0 or alignment & (alignment - 1):
            raise self.fail(entry.start, f"{ALIGNMENT_KEY} is {alignment}; it must be a non-zero power of two")
        return int(alignment)

    def _describe_tensors(self, infos: list[_RawInfo], data_start: int, order: str) -> list[TensorInfo]:
        sorted_offsets = sorted(data_start + info.relative_offset for info in infos)
        return [self._describe(info, data_start, order, sorted_offsets) for info in infos]

    def _describe(self, info: _RawInfo, data_start: int, order: str, sorted_offsets: list[int]) -> TensorInfo:
        n_elements = self._element_count(info)
        type_name_ = GGML_TYPE_NAMES.get(info.type_id)
        codec = codec_for(type_name_) if type_name_ is not None else None
        known = geometry(type_name_) if type_name_ is not None else None
        offset = data_start + info.relative_offset
        if known is not None:  # the exact extent from the type's block layout, with or without a codec
            assert type_name_ is not None  # known comes from the type's name
            stored = self._stored_nbytes(info, n_elements, type_name_, *known)
            truncated = truncation_reason(offset, offset + stored, self.size)
        else:
            stored = raw_extent(offset, sorted_offsets, self.size)
            truncated = f"starts past the end of the file (byte {offset}, file has {self.size})" \
                if offset > self.size else None
        if codec is not None:
            damaged = truncated
            if order == ">" and codec.swap is None:
                damaged = join_reasons(f"big-endian {type_name_} cannot be decoded: served raw only", damaged)
            block_elements, block_bytes = codec.block_elements, codec.block_bytes
        else:
            if type_name_ is None:
                reason = f"unknown storage type {info.type_id}: served raw only"
            else:
                reason = f"no codec for storage type {type_name_}: served raw only"
            damaged = join_reasons(reason, truncated)
            block_elements = block_bytes = 0
        return TensorInfo(
            name=info.name,
            storage_type=type_name_ if type_name_ is not None else f"GGML_TYPE_{info.type_id}",
            shape=tuple(reversed(info.dims)),
            source=self.path,
            offset=offset,
            stored_nbytes=stored,
            block_elements=block_elements,
            block_bytes=block_bytes,
            byte_order=order,
            gguf_dims=tuple(info.dims),
            damaged=damaged,
        )

    def _element_count(self, info: _RawInfo) -> int:
        """Product of the dims, refused where ggml's int64 arithmetic would overflow."""
        count = 1
        for dim in info.dims:
            if dim > INT64_MAX:
                raise self.fail(info.info_offset, f"tensor {info.name!r}: dimension {dim} overflows int64")
            count *= dim
            if count > INT64_MAX:
                raise self.fail(info.info_offset, f"tensor {info.name!r}: shape {list(info.dims)} has more "
                                                  "elements than int64 can count")
        return count

    def _stored_nbytes(self, info: _RawInfo, n_elements: int, type_name: str, block_elements: int,
                       block_bytes: int) -> int:
        first = info.dims[0] if info.dims else 1
        if first % block_elements:
            raise self.fail(info.info_offset, f"tensor {info.name!r}: first dimension {first} is not a multiple "
                                              f"of the {type_name} block size {block_elements}")
        stored = n_elements // block_elements * block_bytes
        if stored > INT64_MAX:
            raise self.fail(info.info_offset, f"tensor {info.name!r}: {stored} bytes overflows int64")
        return stored
