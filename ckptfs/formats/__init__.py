"""Checkpoint formats: recognise a file by its content and read its header into descriptors.

Detection looks at bytes, never at the file name: checkpoints are routinely renamed (``model.bin``,
``blob/sha256-...`` in caches), and a wrong extension must not send a file to the wrong parser. Both
readers return a :class:`~ckptfs.core.descriptors.ParsedCheckpoint` for one file; multi-file checkpoints are
assembled from these elsewhere.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

from ckptfs.core.descriptors import ParsedCheckpoint
from ckptfs.core.errors import CheckpointError
from ckptfs.formats._common import only_checkpoint_errors
from ckptfs.formats._prefix import FilePrefix
from ckptfs.sources import DEFAULT_OPENER, Opener
from ckptfs.sources.base import ByteSource
from ckptfs.formats.gguf import MAGIC as GGUF_MAGIC
from ckptfs.formats.gguf import read_gguf
from ckptfs.formats.safetensors import MAX_HEADER_SIZE, read_safetensors

__all__ = ["detect", "read_file", "read_gguf", "read_safetensors", "READERS"]

READERS: dict[str, Callable[[str, Opener], ParsedCheckpoint]] = {"gguf": read_gguf, "safetensors": read_safetensors}

_JSON_WHITESPACE = b" \t\n\r"
_SCAN_CHUNK = 4096

#: Recognisable non-checkpoint starts, so the error can say what the file probably is.
_HINTS: tuple[tuple[bytes, str], ...] = (
    (b"PK\x03\x04", "a zip archive (a PyTorch .pt/.bin checkpoint?)"),
    (b"\x80\x02", "a Python pickle (a PyTorch .bin checkpoint?)"),
    (b"\x80\x03", "a Python pickle (a PyTorch .bin checkpoint?)"),
    (b"\x80\x04", "a Python pickle (a PyTorch .bin checkpoint?)"),
    (b"\x80\x05", "a Python pickle (a PyTorch .bin checkpoint?)"),
    (b"lmgg", "a legacy GGML file, from before GGUF: convert it with llama.cpp"),
    (b"fmgg", "a legacy GGMF file, from before GGUF: convert it with llama.cpp"),
    (b"tjgg", "a legacy GGJT file, from before GGUF: convert it with llama.cpp"),
    (b"{", "JSON text (a sharded checkpoint's index file?)"),
)


@only_checkpoint_errors
def detect(path: str, opener: Opener = DEFAULT_OPENER, source: ByteSource | None = None) -> str:
    """``"gguf"`` or ``"safetensors"``, judged by content; CheckpointError for anything else. ``source``:
    ``path`` already open (read, not closed).

    GGUF: the magic ``GGUF``. safetensors: an 8-byte little-endian header length between 2 and the format's
    100 MB cap, followed by JSON whose first non-whitespace byte is ``{``. A length larger than the file is
    still recognised (the reader then reports the cut-short header precisely); a length beyond the cap
    before a ``{`` is a safetensors file whose header the format forbids, and the error says so.
    """
    with FilePrefix(path, source=source, opener=opener) as prefix:
        head = prefix.read_at(0, 64)
        if head[:4] == GGUF_MAGIC:
            return "gguf"
        if len(head) >= 9 and _looks_like_safetensors(prefix, head):
            return "safetensors"
        over_cap = _over_cap_safetensors(head)
        if over_cap is not None:
            raise CheckpointError(path, 0, f"safetensors header length {over_cap} exceeds the safetensors limit of "
                                           f"{MAX_HEADER_SIZE} bytes")
    if not head:
        raise CheckpointError(path, 0, "empty file: not a GGUF or safetensors file")
    hint = next((f" ({what})" for magic, what in _HINTS if head.startswith(magic)), "")
    raise CheckpointError(path, 0, f"not a GGUF or safetensors file: starts with {head[:8]!r}{hint}")


def _over_cap_safetensors(head: bytes) -> int | None:
    """The header length when ``head`` is a safetensors start (a JSON object after the length field) whose
    length is beyond the format's cap, else None."""
    if len(head) < 9:
        return None
    length: int = struct.unpack_from("<Q", head, 0)[0]
    if length <= MAX_HEADER_SIZE or not head[8:].lstrip(_JSON_WHITESPACE).startswith(b"{"):
        return None
    return length


def _looks_like_safetensors(prefix: FilePrefix, head: bytes) -> bool:
    (length,) = struct.unpack_from("<Q", head, 0)
    if not 2 <= length <= MAX_HEADER_SIZE:
        return False
    end = min(8 + length, prefix.size)
    chunk, offset = head[8:end], 8
    while True:
        stripped = chunk.lstrip(_JSON_WHITESPACE)
        if stripped:
            return stripped[:1] == b"{"
        offset += len(chunk)
        if offset >= end:
            return False
        chunk = prefix.read_at(offset, min(_SCAN_CHUNK, end - offset))
        if not chunk:
            return False


@only_checkpoint_errors
def read_file(path: str, opener: Opener = DEFAULT_OPENER) -> ParsedCheckpoint:
    """Detect the format of one file and read its header (the file opened through ``opener``)."""
    return READERS[detect(path, opener)](os.fspath(path), opener)
