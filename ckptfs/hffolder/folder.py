"""The hf/ folder of a GGUF: config, tokenizer and a virtual model.safetensors, as Views (and the base both
hf/ folders share: a quantized folder's release is ``dense.DenseFolder``).

Everything but the tensor data is built at once (config and tokenizer JSON are small; building them needs
transformers, so failures surface here, as one ``Unsupported`` line, not at the first read); the tensor data
is decoded only when read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.core.counts import count_problem
from ckptfs.engine.views import BytesView, View
from ckptfs.hffolder.config import Unsupported, check_supported, config_dict, config_files
from ckptfs.hffolder.safetensors_view import DTYPES, ParamData, SafetensorsView
from ckptfs.hffolder.tokenizer import tokenizer_files
from ckptfs.hffolder.weights import plan

WEIGHTS_FILE = "model.safetensors"
COPY_CHUNK = 16 * 1024 * 1024


def _static(data: bytes) -> BytesView:
    return BytesView(lambda: data)


class FolderFiles(Mapping):
    """File name -> View of an hf/ folder, and what each file is made of (its mode: ``tree.ownership``).

    ``origins``: the files passed through unchanged, name -> the source file they are; ``made_from``: the
    folder files every other file is made from beside the checkpoint's own (its config and tokenizer files)."""

    _views: dict[str, View]
    origins: dict[str, str]
    made_from: tuple[str, ...] = ()
    checkpoint: Checkpoint

    def __getitem__(self, name: str) -> View:
        return self._views[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def read(self, name: str) -> bytes:
        """The whole file ``name`` (for the small ones; the safetensors files are better streamed)."""
        view = self._views[name]
        return view.read(0, view.size)

    def write_to(self, directory: str | os.PathLike) -> Path:
        """Save the folder as real files (a Hugging Face folder on disk, e.g. for a benchmark's floor)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for name, view in self._views.items():
            with open(out / name, "wb") as f:
                for offset in range(0, view.size, COPY_CHUNK):
                    f.write(view.read(offset, COPY_CHUNK))
        return out

    owns_checkpoint = False  # hf_folder(path) opened it, so close() closes it; a Checkpoint passed in stays open

    def close(self) -> None:
        if self.owns_checkpoint:
            self.checkpoint.close()


class HfFolder(FolderFiles):
    """File name -> View of a Hugging Face model folder made from a GGUF checkpoint."""

    def __init__(self, checkpoint: Checkpoint, dtype: str = "bfloat16"):
        if dtype not in DTYPES:
            raise ValueError(f"hf dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        if checkpoint.format != "gguf":
            raise Unsupported(f"hf/ is made from GGUF checkpoints; this one is {checkpoint.format}")
        self.checkpoint = checkpoint
        self.dtype = dtype
        self.origins = {}  # every file is made from the GGUF
        metadata = checkpoint.metadata
        architecture, _ = check_supported(metadata)
        values = config_dict(metadata, [t.name for t in checkpoint.tensors])
        problem = count_problem(values, [t.info for t in checkpoint.tensors], "the GGUF")
        if problem is not None:  # before transformers sizes its config by them (layer types per block...)
            raise Unsupported(problem)
        self.config, files = config_files(values, metadata, dtype)
        files.update(tokenizer_files(metadata, self.config.model_type))
        self.params = plan(checkpoint, architecture, self.config, values)
        self._views = {name: _static(data) for name, data in files.items()}
        from transformers import __version__ as version

        self._views[WEIGHTS_FILE] = SafetensorsView([
            ParamData(p, p.tensor.values_as(np.dtype(np.float32)), dtype, f"hf:{version}", checkpoint.cache,
                      checkpoint.sources)
            for p in self.params])
