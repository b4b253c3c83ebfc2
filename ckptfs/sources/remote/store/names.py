"""Name records of the ``--cache-dir`` store: what a remote name (a file's URL, a repository folder's URL) stood
for when its bytes were fetched, so the stored bytes can be found and served without asking the origin.

The store's files are keyed by content identity (``ckptfs.sources.identity``: ETag, size and URL, the tail
digest of a weak validator, or the LFS oid), which only the origin can tell for a URL. A name record closes
that gap: ``DIR/remote/<2 hex>/<32 hex>.name`` (the digest of ``name:<URL>``, the URL as
``identity.content_url`` names it: no user info, no signing parameter, no query in clear, so nothing in a
record is a credential and a re-signed URL finds it), a small JSON object under an HMAC of the folder's key
(``auth.py``), naming

- for a file: the content identity, size, validator, the LFS oid, the tail digest and range of a weak
  validator, the revision's commit where the origin sent one, its modification time, and when its first
  bytes were stored (``fetched_at``, epoch seconds);
- for a repository folder: its file listing (names, sizes, LFS oids) and revision, and when it was listed.

Written whole (a temporary file, ``fsync``, ``rename``): a crash leaves the old record or the new one, never
a torn one. A file's record is written only once some of its bytes are in the store (``SparseStore.pin``):
never a record before its bytes. A record whose MAC fails (damaged, or forged by someone without the key) is
no record (one log line). A record names a version; it never says which bytes are present (the index does).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
from typing import Any

from ckptfs.cache import entry
from ckptfs.cache.folder import open_private, unlink

log = logging.getLogger(__name__)

SUFFIX = ".name"
_MAC_BYTES = 32


def name_path(directory: str, name: str) -> str:
    """The record file of ``name`` under the store's folder ``directory`` (``DIR/remote``)."""
    digest = entry.key_digest("name:" + name).hex()
    return os.path.join(directory, digest[:2], digest + SUFFIX)


class NameRecords:
    """The name records of one store folder (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], mac_key: bytes) -> None:
        self.directory = os.fspath(directory)
        self._key = mac_key
        self._warned = False

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, b"ckptfs-name\0" + payload, hashlib.sha256).digest()

    def read(self, name: str) -> dict[str, Any] | None:
        """The record of ``name``, or None (none, unreadable, or its MAC fails: logged once)."""
        path = name_path(self.directory, name)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError:
            return None
        payload, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
        try:
            if len(raw) <= _MAC_BYTES or not hmac.compare_digest(mac, self._mac(payload)):
                raise ValueError("MAC mismatch")
            record = json.loads(payload)
            if not isinstance(record, dict) or record.get("name") != name:
                raise ValueError("the record of another name")
        except ValueError as exc:
            if not self._warned:
                self._warned = True
                log.warning("cache dir: name record %s ignored (%s)", os.path.basename(path), exc)
            return None
        return record

    def write(self, name: str, record: dict[str, Any]) -> None:
        """Replace the record of ``name`` with ``record`` (its ``name`` field set here), whole or not at all.
        OSError when the folder cannot be written."""
        payload = json.dumps({**record, "name": name}, sort_keys=True, separators=(",", ":")).encode()
        path = name_path(self.directory, name)
        temp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # (threads of a process write it at once)
        fd = open_private(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC)
        try:
            os.write(fd, payload + self._mac(payload))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.rename(temp, path)
        except OSError:
            unlink(temp)
            raise

