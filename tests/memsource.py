"""An in-memory byte source (a dict of bytes) registered as the scheme ``mem://``.

It exists to show that a new kind of source is one module plus one ``register_scheme`` call: nothing in the
readers, the multi-file discovery, the block engine or the mount knows it. ``mem://KEY`` names the bytes
``STORE[KEY]``; ``mem://DIR`` names a folder when some key starts with ``DIR/``.

Run as a program (``python -m memsource DIR mount ...`` with tests/ on sys.path) it loads every file under
DIR into the store, registers the scheme and runs the ckptfs CLI with the remaining arguments, so a real
mount daemon serves ``mem://`` sources from memory.
"""

from __future__ import annotations

import hashlib
import os
import sys

from ckptfs.core.errors import CheckpointError
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.sources import ByteSource, Folder, register_scheme, sha256_content_id

STORE: dict[str, bytes] = {}
PREFIX = "mem://"


class MemSource(ByteSource):
    def __init__(self, url: str):
        key = url[len(PREFIX):]
        if key not in STORE:
            raise CheckpointError(url, None, "no such object in memory")
        self.name = url
        self._data = STORE[key]
        self.size = len(self._data)
        self.identity = (self.size, id(self._data))
        self.reads: list[tuple[int, int]] = []

    def pread(self, offset: int, size: int, *, scope: ReadScope = NOTHING_SAID) -> bytes:
        if size <= 0:
            return b""
        if offset < 0 or offset + size > self.size:
            raise CheckpointError(self.name, offset, f"bytes {offset}..{offset + size} lie past the end")
        self.reads.append((offset, size))
        return self._data[offset: offset + size]

    def content_id(self) -> str:
        return sha256_content_id(hashlib.sha256(self._data).hexdigest())


class MemFolder(Folder):
    def __init__(self, url: str):
        self.name = url.rstrip("/")
        self._key = self.name[len(PREFIX):]

    def list(self) -> dict[str, int]:
        start = self._key + "/"
        return {key[len(start):]: len(data) for key, data in STORE.items()
                if key.startswith(start) and "/" not in key[len(start):]}

    def join(self, name: str) -> str:
        return f"{self.name}/{name}"


def open_folder(url: str) -> MemFolder | None:
    key = url[len(PREFIX):].rstrip("/")
    return MemFolder(url) if any(k.startswith(key + "/") for k in STORE) else None


def register() -> None:
    register_scheme("mem", MemSource, open_folder)


def load_dir(root: str) -> None:
    """Every file under ``root`` into the store, keyed by its path relative to ``root``."""
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                STORE[os.path.relpath(path, root)] = f.read()


if __name__ == "__main__":
    load_dir(sys.argv[1])
    register()
    from ckptfs.commands.cli import main

    sys.argv = ["ckptfs", *sys.argv[2:]]
    main()
