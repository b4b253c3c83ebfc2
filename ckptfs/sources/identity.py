"""Content identity: the one key that caches shared between processes, and pickles, use for a file.

Identity in order of strength (one place computes it, so caches and pickles never disagree):

1. ``sha256:<hex>`` — the file's SHA-256 where it is known without reading the file (a manifest, the
   Hub's LFS oid, an S3 checksum): the same bytes anywhere have the same identity.
2. ``etag:<etag>:<size>:<url>`` — a remote object's ETag with its size and URL (``content_url``: no user info,
   no signature, no query in clear). Where the validator cannot
   tell two versions of one size apart (nginx's ETag and any Last-Modified have a resolution of one
   second), ``:tail-<digest>`` is added: the BLAKE2b of the file's last bytes (``ckptfs.sources.remote.version.SAMPLE_BYTES``),
   so a replaced file whose last bytes differ never shares a cache entry with the one it replaced.
3. ``local:<host>:<dev>:<ino>:<size>:<mtime_ns>:<ctime_ns>`` — a local file as this machine sees it. The host
   name keeps entries under it from ever being shared across machines; ctime changes on every write, so an
   in-place rewrite that restores the mtime still gets a new identity.

**A URL in an identity** (and in the ``--cache-dir`` store's name records, ``record_name``) is
:func:`content_url`: ``scheme://host/path`` (no user info), then, when the query holds parameters that select
content, ``:q-`` and a digest of them. A presigned URL's **signing parameters** do not select content and are
left out, so a URL re-signed later (a new signature, a new expiry) finds the bytes stored under the first;
the parameters that remain (S3's ``versionId``, anything not listed) are kept, digested, so two versions never
share an identity and no query string is written to disk. The signing parameters (names compared
case-insensitively, ``SIGNING_PREFIXES`` / ``SIGNING_NAMES``, and any name ending in ``token``):

- AWS (Signature V4 and V2): ``X-Amz-*``, ``AWSAccessKeyId``, ``Signature``, ``Expires``;
- Google Cloud Storage: ``X-Goog-*``, ``GoogleAccessId``; Alibaba OSS: ``X-Oss-*``, ``OSSAccessKeyId``;
- CloudFront (the Hugging Face CDN's): ``Policy``, ``Key-Pair-Id``, ``Signature``, ``Expires``;
- Azure shared access signatures: ``sig``, ``se``, ``sp``, ``sv``, ``st``, ``sr``, ``ss``, ``srt``, ``spr``, ``si``,
  ``sdd``, ``skoid``, ``sktid``, ``skt``, ``ske``, ``sks``, ``skv``;
- tokens: ``token``, ``access_token``, ``security-token``, any name ending in ``token``.
"""

from __future__ import annotations

import hashlib
import socket
from typing import Any
from urllib.parse import parse_qsl

from ckptfs.util.redact import split_source

_HOST = socket.gethostname()

SIGNING_PREFIXES = ("x-amz-", "x-goog-", "x-oss-")
SIGNING_NAMES = frozenset({
    "awsaccesskeyid", "signature", "expires", "googleaccessid", "ossaccesskeyid", "policy", "key-pair-id",
    "sig", "se", "sp", "sv", "st", "sr", "ss", "srt", "spr", "si", "sdd", "skoid", "sktid", "skt", "ske", "sks",
    "skv",
})


def is_signing(name: str) -> bool:
    """Whether query parameter ``name`` signs a URL rather than selects its content (module docstring)."""
    name = name.lower()
    return name in SIGNING_NAMES or name.startswith(SIGNING_PREFIXES) or name.endswith("token")


def content_url(url: str) -> str:
    """``url`` as an identity names it (module docstring): no user info, no fragment, no signing
    parameter, the rest of the query as a digest. A path is returned as it is."""
    parts = split_source(url)
    if parts is None:
        return url
    kept = sorted((k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not is_signing(k))
    if not kept:
        return parts.bare()
    digest = hashlib.blake2b(repr(kept).encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return f"{parts.bare()}:q-{digest}"


def local_content_id(identity: tuple[Any, ...]) -> str:
    return "local:" + _HOST + ":" + ":".join(str(part) for part in identity)


def remote_content_id(etag: str | None, size: int, url: str, sample: bytes | None = None) -> str:
    base = f"etag:{etag or ''}:{size}:{content_url(url)}"
    return base if sample is None else f"{base}:tail-{sample_digest(sample)}"


def sample_digest(sample: bytes) -> str:
    """The digest of a file's sampled bytes (see ``remote_content_id``)."""
    return hashlib.blake2b(sample, digest_size=16).hexdigest()


def sha256_content_id(hexdigest: str) -> str:
    return "sha256:" + hexdigest.lower()


def checkpoint_content_id(file_ids: list[str]) -> str:
    """One identity for a checkpoint made of several files (order matters: it is the files' order)."""
    if len(file_ids) == 1:
        return file_ids[0]
    return "set:" + hashlib.sha256("\n".join(file_ids).encode()).hexdigest()
