"""Tensor names -> safe, distinct, reversible file names (docs/interfaces.md, "Mount layout").

A tensor name is arbitrary bytes in the formats; a file name cannot contain '/' or NUL, must be valid for the
tools users point at a mount, and is at most NAME_MAX (255) bytes. Encoding: '%' -> %25, '/' -> %2F,
NUL -> %00, each byte of invalid UTF-8 (held as a lone surrogate after surrogateescape decoding) -> %XX;
everything else as is. The second and later tensors with the same name get ``~2``, ``~3``... before the
suffix; a name too long once ``.meta.json`` is added is cut to 200 bytes (on a character boundary) plus
``~`` and 16 hex digits of the SHA-256 of the original name. meta.json always keeps the original name.

A checkpoint file's own name taken from an ``http(s)`` URL (``file_name``) follows the same rules, so that
two URLs never map to one name and ``cp -r`` of a mount never meets a name too long: the percent-decoded
name escaped as above, and a name over NAME_MAX bytes becomes a 200-byte stem, ``~``, 16 hex digits of the
SHA-256 of the name, and the original extension (``.gguf``, ``.safetensors``). A Hub repository's file names
(``hf://``: the listing's names, a file's own name) are raw names too, and take the same rules. Keys that
were never percent-decoded (an ``s3://`` key) are only capped that way (``capped_name``), and so are numbered
names (``~2``) that would grow past the limit.
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
        size = len(name_bytes(piece))
        if used + size > limit:
            break
        out.append(piece)
        used += size
        i += len(piece)
    return "".join(out)


def _fits(stem: str) -> bool:
    return len((stem + LONGEST_SUFFIX).encode("utf-8")) <= NAME_MAX


def _digest(name: str) -> str:
    return hashlib.sha256(name_bytes(name)).hexdigest()[:16]


def file_stem(name: str, ordinal: int = 1) -> str:
    """The file-name stem of the ``ordinal``-th tensor called ``name`` (1 = the first)."""
    encoded = encode_name(name)
    tag = f"~{ordinal}" if ordinal > 1 else ""
    if not _fits(encoded + tag):
        encoded = f"{_cut(encoded, _KEEP_BYTES)}~{_digest(name)}"
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


#: The longest extension a cut file name keeps (``.safetensors`` is 12 bytes); a longer tail is part of the stem.
_EXT_MAX = 32


def _with_tag(encoded: str, digest: str, tag: str = "") -> str:
    """``encoded`` with ``tag`` (``~2``) before its extension, cut to a 200-byte stem + ``~`` + ``digest`` when
    it would be longer than NAME_MAX bytes."""
    stem, dot, ext = encoded.rpartition(".")
    if not dot or not stem or len(name_bytes(ext)) > _EXT_MAX:
        stem, ext = encoded, ""
    ext = f".{ext}" if ext else ""
    if len(name_bytes(stem + tag + ext)) <= NAME_MAX:
        return stem + tag + ext
    return f"{_cut(stem, _KEEP_BYTES)}~{digest}{tag}{ext}"


def file_name(name: str) -> str:
    """The name a file called ``name`` (a URL's last part, percent-decoded with surrogateescape) has in a
    mount: escaped as a tensor name is, and within NAME_MAX bytes (see the module docstring)."""
    return _with_tag(encode_name(name), _digest(name))


def capped_name(name: str) -> str:
    """``name`` (a valid file name, or an object key that was not percent-decoded) within NAME_MAX bytes."""
    return _with_tag(name, _digest(name))


def numbered_name(name: str, ordinal: int) -> str:
    """The file name ``name`` with ``~N`` before its extension (a file whose name is taken), cut with a hash
    of ``name`` when the number would take it past NAME_MAX."""
    return _with_tag(name, _digest(name), f"~{ordinal}")
