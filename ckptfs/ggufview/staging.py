"""The model folder the header is built from, as a local path: the tokenizer libraries (transformers,
sentencepiece, gguf-py's ``SpecialVocab`` and ``Metadata``) read files by path.

The small files those libraries read (JSON, ``tokenizer.model``, text, the model card, a chat template) and a
sentence-transformers pooling module's ``config.json`` are copied through the checkpoint's own sources into a
folder of the same name in memory (``/dev/shm`` where there is one: a tmpfs, so no disk is written), removed
once the header is built — from a remote folder (``https://``, ``s3://``, ``hf://``) and a local one alike. The
libraries then read only files the folder's listing holds (a link leading outside the folder, which the
listing leaves out, is never read), read through the pinned sources the mount serves them from, and the view
knows every file it is made from (``StagedFolder.files``: ``gguf/model.gguf`` is readable only by those who
may read them all). The folder keeps the source folder's name because gguf-py reads a model's name, version
and fine-tune from it as the converter run on that folder would.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.core.errors import CheckpointError
from ckptfs.ggufview import Unsupported
from ckptfs.ggufview.files import inside, pooling_modules
from ckptfs.sources.local import LocalFolder

STAGED_SUFFIXES = (".json", ".model", ".txt", ".md", ".jinja")
MAX_STAGED_BYTES = 512 << 20  # a file past this is not one the tokenizer libraries read
MEMORY_DIR = "/dev/shm"


@dataclass(frozen=True)
class StagedFolder:
    """The local copy (``path``) and the source files it was copied from (``files``: paths or URLs)."""

    path: Path
    files: tuple[str, ...]


@contextmanager
def model_folder(ck: Checkpoint) -> Iterator[StagedFolder]:
    """The folder holding ``config.json`` and the tokenizer files, local for as long as the block runs."""
    path = ck.passthrough.get("config.json")
    if path is None or ck.format != "safetensors":
        raise Unsupported("not a Hugging Face model folder (config.json and safetensors)")
    base = path[: -len("config.json")]
    name = PurePosixPath(base.split("?", 1)[0].rstrip("/")).name or "model"
    parent = MEMORY_DIR if os.access(MEMORY_DIR, os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="ckptfs-gguf-", dir=parent) as tmp:
        folder = Path(tmp) / name
        folder.mkdir()
        files = []
        for file_name, source in ck.passthrough.items():
            if file_name.endswith(STAGED_SUFFIXES) and "/" not in file_name:
                _fetch(ck, source, folder / file_name)
                files.append(source)
        for module in pooling_modules(folder):
            pooling = _pooling_config(base, module)
            if pooling is not None:
                _fetch(ck, pooling, inside(folder, module) / "config.json")
                files.append(pooling)
        yield StagedFolder(folder, tuple(files))


def _pooling_config(base: str, module: str) -> str | None:
    """The ``config.json`` of pooling module ``module`` of the folder at ``base``: a remote folder's URL; a
    local folder's path when the module folder's listing holds it (a regular file, a link only when it stays
    inside the module folder or its Hugging Face cache), else None; Unsupported for one that is there but is
    no regular file (a FIFO, a dangling link)."""
    if "://" in base:
        return f"{base}{module}/config.json"
    module_folder = LocalFolder(os.path.join(base, module))
    try:
        listed = module_folder.list()
    except OSError:
        return None
    if "config.json" in listed:
        return module_folder.join("config.json")
    if "config.json" in module_folder.broken():
        raise Unsupported(f"{module.rstrip('/')}/config.json is not a regular file")
    return None


def _fetch(ck: Checkpoint, remote: str, local: Path) -> None:
    """Copy one file through the checkpoint's sources; Unsupported (one line) for one too large, or that
    cannot be read as it was mounted (changed since, or not the bytes a ``--manifest`` lists)."""
    try:
        source = ck.sources.get(remote)
        if source.size > MAX_STAGED_BYTES:
            raise Unsupported(f"{remote} is {source.size} bytes, too large for a tokenizer or config file")
        data = source.pread(0, source.size)
    except CheckpointError as exc:
        raise Unsupported(str(exc)) from None
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(data)

