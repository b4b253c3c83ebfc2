"""The model folder the header is built from, as a local path: the tokenizer libraries (transformers,
sentencepiece, gguf-py's ``SpecialVocab`` and ``Metadata``) read files by path.

A local folder is used where it is. For a remote one (``https://``, ``s3://``, ``hf://``) the small files those
libraries read (JSON, ``tokenizer.model``, text, the model card, a chat template) and a sentence-transformers
pooling module's ``config.json`` are fetched through the checkpoint's own sources into a folder of the same
name in memory (``/dev/shm`` where there is one: a tmpfs, so no disk is written), removed once the header is
built. The folder keeps the remote folder's name because gguf-py reads a model's name, version and fine-tune
from it as the converter run on a download of that folder would.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.ggufview import Unsupported
from ckptfs.ggufview.files import inside, pooling_modules

STAGED_SUFFIXES = (".json", ".model", ".txt", ".md", ".jinja")
MAX_STAGED_BYTES = 512 << 20  # a file past this is not one the tokenizer libraries read
MEMORY_DIR = "/dev/shm"


@contextmanager
def model_folder(ck: Checkpoint) -> Iterator[Path]:
    """The folder holding ``config.json`` and the tokenizer files, local for as long as the block runs."""
    path = ck.passthrough.get("config.json")
    if path is None or ck.format != "safetensors":
        raise Unsupported("not a Hugging Face model folder (config.json and safetensors)")
    if "://" not in path:
        yield Path(path).parent
        return
    base = path[: -len("config.json")]
    name = PurePosixPath(base.split("?", 1)[0].rstrip("/")).name or "model"
    parent = MEMORY_DIR if os.access(MEMORY_DIR, os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="ckptfs-gguf-", dir=parent) as tmp:
        folder = Path(tmp) / name
        folder.mkdir()
        for file_name, remote in ck.passthrough.items():
            if file_name.endswith(STAGED_SUFFIXES) and "/" not in file_name:
                _fetch(ck, remote, folder / file_name)
        for module in pooling_modules(folder):
            _fetch(ck, f"{base}{module}/config.json", inside(folder, module) / "config.json")
        yield folder


def _fetch(ck: Checkpoint, remote: str, local: Path) -> None:
    source = ck.sources.get(remote)
    if source.size > MAX_STAGED_BYTES:
        raise Unsupported(f"{remote} is {source.size} bytes, too large for a tokenizer or config file")
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(source.pread(0, source.size))

