"""model.gguf of a split GGUF set: the whole set as one GGUF file, built from the shards' headers.

The merged header is what llama.cpp's ``gguf-split --merge`` writes: the first shard's key/value pairs,
byte for byte, without the ``split.*`` keys; then every shard's tensor infos in shard order, with each data
offset moved to where that tensor lands in the merged data section (each tensor aligned to
``general.alignment``, zero padding between); then the data, read from the shards per request. Nothing is
decoded: the file is a re-addressing of stored bytes, so any GGUF loader opens it as a single file.

Served only for a complete, little-endian set (a missing shard would make a GGUF that silently lacks
tensors; a big-endian set would need every value re-encoded).
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

import numpy as np

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.core.descriptors import TensorInfo
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.formats._prefix import FilePrefix
from ckptfs.formats.gguf import ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGML_TYPE_NAMES, MAGIC
from ckptfs.formats.gguf_values import ValueWalker
from ckptfs.engine.views import HeaderBodyView
from ckptfs.sources import ByteSource

SPLIT_PREFIX = "split."
MERGED_FILE = "model.gguf"
_TYPE_IDS = {name: type_id for type_id, name in GGML_TYPE_NAMES.items()}


def _type_id(storage_type: str) -> int:
    if storage_type in _TYPE_IDS:
        return _TYPE_IDS[storage_type]
    return int(storage_type.removeprefix("GGML_TYPE_"))  # unknown ids are kept as the file wrote them


def why_not_merged(ck: Checkpoint) -> str | None:
    """Why this checkpoint gets no model.gguf (None when it gets one)."""
    if ck.format != "gguf" or len(ck.files) < 2:
        return "not a split GGUF set"
    count = ck.metadata.get("split.count")
    if count != len(ck.files):
        return f"the set has {len(ck.files)} of its {count} shards"
    if any(t.byte_order != "<" for t in (tensor.info for tensor in ck.tensors)):
        return "big-endian split sets are not merged"
    return None


def _raw_pairs(path: str, source: ByteSource) -> list[tuple[str, bytes]]:
    """(key, the key/value pair's bytes as stored) for every metadata entry of a little-endian GGUF, read
    through the checkpoint's own source of it (its pool opens a relative name from where it was given, and a
    remote one with its options and mirrors)."""
    with FilePrefix(path, source) as prefix:
        walker = ValueWalker(prefix, "<")
        count = walker.u64(16, "metadata count")
        pos, pairs = 24, []
        for i in range(count):
            key_start, key_end = walker.string(pos, f"key of metadata entry {i}")
            key = str(prefix.data[key_start:key_end], "utf-8", "surrogateescape")
            vtype = walker.u32(key_end, f"value type of {key!r}")
            end = walker.value(vtype, key_end + 4, f"value of {key!r}").end
            pairs.append((key, bytes(prefix.data[pos:end])))
            pos = end
        return pairs


def _tensor_info_bytes(info: TensorInfo, offset: int) -> bytes:
    name = info.name.encode("utf-8", "surrogateescape")
    dims = info.gguf_dims if info.gguf_dims is not None else tuple(reversed(info.shape))
    return (struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
            + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", _type_id(info.storage_type), offset))


@dataclass(frozen=True)
class _Piece:
    start: int          # offset in the merged file
    info: TensorInfo


class MergedGgufView(HeaderBodyView):
    """The merged GGUF file of a complete split set."""

    def __init__(self, ck: Checkpoint):
        reason = why_not_merged(ck)
        if reason is not None:
            raise ValueError(f"no merged GGUF: {reason}")
        self._sources = ck.sources
        pairs = [(k, raw) for k, raw in _raw_pairs(ck.files[0], ck.sources.get(ck.files[0])) if not k.startswith(SPLIT_PREFIX)]
        alignment = ck.metadata.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
        infos = [t.info for t in ck.tensors]
        relative, pos = [], 0
        for info in infos:
            relative.append(pos)
            pos += info.stored_nbytes
            pos += -pos % alignment
        header = bytearray(MAGIC + struct.pack("<IQQ", 3, len(infos), len(pairs)))
        for _, raw in pairs:
            header += raw
        for info, rel in zip(infos, relative):
            header += _tensor_info_bytes(info, rel)
        header += bytes(-len(header) % alignment)
        self.header = bytes(header)
        self.pieces = [_Piece(len(self.header) + rel, info) for info, rel in zip(infos, relative)]
        self._starts = [p.start for p in self.pieces]
        self.size = len(self.header) + pos

    def plain_segments(self) -> list[tuple[int, int, object, int]]:
        """The header, then each tensor's stored bytes in its shard, zeros between them (``View``)."""
        segments: list[tuple[int, int, object, int]] = [(0, len(self.header), self.header, 0)]
        pos = len(self.header)
        for piece in self.pieces:
            if piece.start > pos:
                segments.append((pos, piece.start - pos, None, 0))
            if piece.info.stored_nbytes:
                segments.append((piece.start, piece.info.stored_nbytes, self._sources.get(piece.info.source),
                                 piece.info.offset))
            pos = piece.start + piece.info.stored_nbytes
        if self.size > pos:
            segments.append((pos, self.size - pos, None, 0))
        return segments

    def body_into(self, d0: int, target: np.ndarray, keep: bool = True, scope: ReadScope = NOTHING_SAID) -> None:
        """Bytes [d0, d0 + len(target)) after the header: each tensor's stored bytes, zeros between them."""
        hlen = len(self.header)
        pos, end = d0 + hlen, d0 + len(target) + hlen
        i = max(0, bisect.bisect_right(self._starts, pos) - 1)
        while pos < end:
            piece = self.pieces[i] if i < len(self.pieces) else None
            if piece is None or pos < piece.start:  # padding before the next tensor (or after the last)
                stop = min(end, piece.start if piece is not None else end)
                target[pos - hlen - d0: stop - hlen - d0] = 0
                pos = stop
                continue
            info = piece.info
            data_end = piece.start + info.stored_nbytes
            if pos < data_end:
                stop = min(end, data_end)
                self._sources.get(info.source).pread_into(info.offset + pos - piece.start,
                                                          target[pos - hlen - d0: stop - hlen - d0].data, scope=scope)
                pos = stop
            i += 1

