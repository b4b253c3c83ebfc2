"""Tensor names -> safe, distinct, reversible file names (docs/interfaces.md, "Mount layout").

A tensor name is arbitrary bytes in the formats; a file name cannot contain '/' or NUL, must be valid for the
tools users point at a mount, and is at most NAME_MAX (255) bytes. Encoding: '%' -> %25, '/' -> %2F,
NUL -> %00, each byte of invalid UTF-8 (held as a lone surrogate after surrogateescape decoding) -> %XX;
everything else as is. The second and later tensors with the same name get ``~2``, ``~3``... before the
suffix; a name too long once ``.meta.json`` is added is cut to 200 bytes (on a character boundary) plus
``~`` and 16 hex digits of the SHA-256 of the original name. meta.json always keeps the original name.
"""

from __future__ import annotations

import hashlib
import re

NAME_MAX = 255
LONGEST_SUFFIX = ".meta.json"
TENSOR_SUFFIXES = (".npy", ".raw", ".meta.json")
_KEEP_BYTES = 200


def name_bytes(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


#: What encode_name changes; most names hold none of it and are returned as they are (94k names quickly).
_NEEDS_ESCAPE = re.compile("[%/\x00\ud800-\udfff]")


def encode_name(name: str) -> str:
    """The escaped form of a tensor name (no length handling, no de-duplication)."""
    if _NEEDS_ESCAPE.search(name) is None:
        return name
    out = []
    for ch in name:
        code = ord(ch)
        if ch == "%":
            out.append("%25")
        elif ch == "/":
            out.append("%2F")
        elif code == 0:
            out.append("%00")
        elif 0xDC80 <= code <= 0xDCFF:  # an invalid UTF-8 byte kept by surrogateescape
            out.append(f"%{code - 0xDC00:02X}")
        elif 0xD800 <= code <= 0xDFFF:  # a lone surrogate that is not a byte: escape its UTF-8-ish bytes
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
        else:
            out.append(ch)
    return "".join(out)


def _cut(encoded: str, limit: int) -> str:
    """The longest prefix of ``encoded`` within ``limit`` UTF-8 bytes that splits no character or %XX."""
    out, used, i = [], 0, 0
    while i < len(encoded):
        piece = encoded[i:i + 3] if encoded[i] == "%" else encoded[i]
        size = len(piece.encode("utf-8"))
        if used + size > limit:
            break
        out.append(piece)
        used += size
        i += len(piece)
    return "".join(out)


def _fits(stem: str) -> bool:
    return len((stem + LONGEST_SUFFIX).encode("utf-8")) <= NAME_MAX


def file_stem(name: str, ordinal: int = 1) -> str:
    """The file-name stem of the ``ordinal``-th tensor called ``name`` (1 = the first)."""
    encoded = encode_name(name)
    tag = f"~{ordinal}" if ordinal > 1 else ""
    if not _fits(encoded + tag):
        digest = hashlib.sha256(name_bytes(name)).hexdigest()[:16]
        encoded = f"{_cut(encoded, _KEEP_BYTES)}~{digest}"
    return encoded + tag


def assign_stems(names: list[str]) -> list[str]:
    """One distinct stem per tensor, in order: duplicates numbered, and no numbered stem equals another
    tensor's plain stem (a tensor literally named "a~2" beside two tensors named "a")."""
    taken: set[str] = set()
    firsts = [file_stem(n) for n in names]
    plain = set(firsts)
    seen: dict[str, int] = {}
    stems = []
    for name, first in zip(names, firsts):
        ordinal = seen.get(name, 0) + 1
        stem = first if ordinal == 1 else file_stem(name, ordinal)
        while stem in taken or (ordinal > 1 and stem in plain):
            ordinal += 1
            stem = file_stem(name, ordinal)
        seen[name] = ordinal
        taken.add(stem)
        stems.append(stem)
    return stems
