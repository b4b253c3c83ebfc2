"""Integrity: manifests of a checkpoint's stored bytes, verification, diffs and checked reads.

- ``manifest``: build ("ckptfs-manifest/1": per file size + sha256, per tensor place, crc32, sha256 and 1 MiB
  chunk crc32s; one pass, files in parallel) and load (every field checked, one-line errors);
- ``verify``: a checkpoint against a manifest, or its structure alone;
- ``diff``: two checkpoints (or one and a manifest): tensors, shapes, types, bytes, dequantized values;
- ``checked``: a ByteSource wrapper that checks the chunks a read covers on first access
  (``ckptfs.open(..., manifest=FILE)``, ``ckptfs mount --manifest FILE``);
- ``cli``: the ``ckptfs manifest``, ``verify`` and ``diff`` commands.

``import ckptfs`` does not import this package; it is loaded when one of those is used.
"""

from __future__ import annotations

from ckptfs.core.errors import IntegrityError
from ckptfs.integrity.manifest import CHUNK_SIZE, FORMAT, Manifest, build_manifest, load_manifest
from ckptfs.integrity.verify import Mismatch, verify

__all__ = ["IntegrityError", "CHUNK_SIZE", "FORMAT", "Manifest", "build_manifest", "load_manifest", "Mismatch",
           "verify"]
