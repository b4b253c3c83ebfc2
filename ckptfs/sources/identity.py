"""Content identity: the one key that caches shared between processes, and pickles, use for a file.

Identity in order of strength (one place computes it, so caches and pickles never disagree):

1. ``sha256:<hex>`` — the file's SHA-256 where it is known without reading the file (a manifest, the
   Hub's LFS oid, an S3 checksum): the same bytes anywhere have the same identity.
2. ``etag:<etag>:<size>:<url>`` — a remote object's ETag with its size and URL. Where the validator cannot
   tell two versions of one size apart (nginx's ETag and any Last-Modified have a resolution of one
   second), ``:tail-<digest>`` is added: the BLAKE2b of the file's last bytes (``ckptfs.sources.remote.version.SAMPLE_BYTES``),
   so a replaced file whose last bytes differ never shares a cache entry with the one it replaced.
3. ``local:<host>:<dev>:<ino>:<size>:<mtime_ns>:<ctime_ns>`` — a local file as this machine sees it. The host
   name keeps entries under it from ever being shared across machines; ctime changes on every write, so an
   in-place rewrite that restores the mtime still gets a new identity.
"""

from __future__ import annotations

import hashlib
import socket
from typing import Any

_HOST = socket.gethostname()


def local_content_id(identity: tuple[Any, ...]) -> str:
    return "local:" + _HOST + ":" + ":".join(str(part) for part in identity)


def remote_content_id(etag: str | None, size: int, url: str, sample: bytes | None = None) -> str:
    base = f"etag:{etag or ''}:{size}:{url}"
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
