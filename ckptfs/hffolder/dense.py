"""hf/ of a quantized safetensors folder: the unquantized release, made from the quantized layers' views.

People dequantize FP8, FP4, bitsandbytes, GPTQ... checkpoints to disk for tools that do not know the scheme
(and wait for the whole model to be written again). The scheme views (``ckptfs.packed``) already give every
quantized layer's weight as the release stores it, so the release is a folder of virtual files:

- ``config.json``: the folder's own, without ``quantization_config`` (nor compressed-tensors' older
  ``compression_config``), its ``torch_dtype``/``dtype`` the served dtype;
- every other file of the folder passed through byte for byte (tokenizer, generation config, chat template,
  README...), except the quantization settings files (``hf_quant_config.json``, ``quantize_config.json``) and
  the folder's shard index, which would name the quantized shards;
- one safetensors file per source shard (``model.safetensors`` when there is one; else the source shards'
  names with a ``model.safetensors.index.json``), holding the release's state dict
  (``Checkpoint.release_names``: each view under its name and shape, the tensors no view is made of) in
  the source file's order, every float tensor at the served dtype: the view's float32 value rounded once.
  Built per read range by the one safetensors builder (``safetensors_view``): a read decodes only the tiles
  of the layers under it.

Nothing here needs transformers or torch. A folder whose quantized layers are not all viewable (a missing
part, an unsupported format) gets no hf/: the release would lack those weights or hold their quantized parts.
A folder that is not quantized gets none either: its files are already the release.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from ckptfs.checkpoint.api import Checkpoint, Tensor
from ckptfs.engine.views import BytesView, FileView, View
from ckptfs.hffolder.config import Unsupported
from ckptfs.hffolder.folder import FolderFiles
from ckptfs.hffolder.safetensors_view import DTYPES, ParamData, SafetensorsView
from ckptfs.hffolder.weights import ParamSource
from ckptfs.tree.mount_tree import own_name
from ckptfs.util.jsonutil import loads

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"
#: the quantization settings files a release does not have
QUANT_FILES = ("hf_quant_config.json", "quantize_config.json")
#: config.json keys that describe the quantization (compressed-tensors wrote ``compression_config`` once)
QUANT_KEYS = ("quantization_config", "compression_config")
MAX_CONFIG_BYTES = 16 << 20
KEY_TAG = "hf-release"


def release_problem(ck: Checkpoint) -> str | None:
    """Why ``ck`` gets no release folder (one line), or None. Cheap: the views are made at open."""
    if ck.format != "safetensors":
        return f"hf/ is made from a GGUF or a quantized safetensors folder; this is {ck.format}"
    if CONFIG_FILE not in ck.passthrough:
        return "the safetensors have no config.json beside them: not a Hugging Face model folder"
    if not ck.packed_views:
        return ("the folder is not quantized (no quantized layer found): its safetensors files are the "
                "unquantized release already")
    absent = [row for row in ck.packed_views if not row["present"]]
    if absent:
        row = absent[0]
        more = f" (and {len(absent) - 1} more layers)" if len(absent) > 1 else ""
        return f"layer {row['name']} has no dense view{more}: {row['reason']}"
    return None


def release_config(raw: bytes, dtype: str) -> bytes:
    """config.json of the release: the quantization settings dropped, the dtype keys set to ``dtype``
    (``torch_dtype`` and ``dtype`` where present; ``torch_dtype`` when neither is, which both transformers 4
    and 5 read)."""
    doc = loads(raw, CONFIG_FILE)
    if not isinstance(doc, dict):
        raise Unsupported("config.json is not a JSON object")
    config = {key: value for key, value in doc.items() if key not in QUANT_KEYS}
    keys = [key for key in ("torch_dtype", "dtype") if key in config] or ["torch_dtype"]
    for key in keys:
        config[key] = dtype
    return (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _values(tensor: Tensor) -> Any:
    """A tensor's values as the release's file takes them: float32 for float values (rounded once to the
    served dtype), an integer tensor's own."""
    assert tensor.dtype is not None  # release_names lists decodable tensors only
    return tensor.values_as(np.dtype(np.float32)) if tensor.dtype.kind == "f" else tensor.data


class DenseFolder(FolderFiles):
    """File name -> View of the unquantized release of a quantized safetensors folder (module docstring)."""

    def __init__(self, checkpoint: Checkpoint, dtype: str = "bfloat16"):
        if dtype not in DTYPES:
            raise ValueError(f"hf dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        problem = release_problem(checkpoint)
        if problem is not None:
            raise Unsupported(problem)
        self.checkpoint = checkpoint
        self.dtype = dtype
        config_path = checkpoint.passthrough[CONFIG_FILE]
        source = checkpoint.sources.get(config_path)
        if source.size > MAX_CONFIG_BYTES:
            raise Unsupported(f"config.json holds {source.size} bytes, more than a config file")
        config = release_config(source.pread(0, source.size), dtype)
        self.made_from = (config_path,)
        self._views: dict[str, View] = {CONFIG_FILE: BytesView(lambda: config)}
        self.origins = {}
        for name, path in checkpoint.passthrough.items():
            if name == CONFIG_FILE or name in QUANT_FILES or "/" in name or name.endswith(".safetensors.index.json"):
                continue
            self._views[name] = FileView(path, checkpoint.sources)
            self.origins[name] = path
        shards = self._shards()
        for file, params in shards.items():
            self._views[file] = SafetensorsView(params)
        if len(shards) > 1:
            self._views[INDEX_FILE] = BytesView(lambda: index_json(shards))

    def _shards(self) -> dict[str, list[ParamData]]:
        """File name -> the release's tensors that file holds, in the order of the source shard they come from
        (a view is in its marker part's shard)."""
        ck = self.checkpoint
        by_source: dict[str, list[Tensor]] = {path: [] for path in ck.files}
        for name in ck.release_names():
            tensor = ck[name]
            by_source.setdefault(tensor.info.source, []).append(tensor)
        single = sum(1 for tensors in by_source.values() if tensors) == 1
        shards: dict[str, list[ParamData]] = {}
        for path, tensors in by_source.items():
            if not tensors:
                continue
            tensors.sort(key=lambda t: t.info.offset)
            file = WEIGHTS_FILE if single else own_name(path, "safetensors")
            shards[file] = [ParamData(ParamSource(t.name, t, tuple(t.shape)), _values(t), self.dtype, KEY_TAG,
                                      ck.cache, ck.sources) for t in tensors]
        return shards


def index_json(shards: Mapping[str, list[ParamData]]) -> bytes:
    """model.safetensors.index.json of the shards, as ``save_pretrained`` writes it."""
    weight_map = {p.param.name: file for file, params in shards.items() for p in params}
    total = sum(p.nbytes for params in shards.values() for p in params)
    doc = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")
