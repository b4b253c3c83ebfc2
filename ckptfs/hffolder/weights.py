"""GGUF tensors -> Hugging Face parameters: names from transformers' map, transforms from its processors.

transformers maps names with ``get_gguf_hf_weights_map`` (gguf-py's tensor-name tables walked over the
model's own state dict) and undoes llama.cpp's changes with a per-architecture ``TensorProcessor``. Both are
reused here: the name map runs over a model built on the ``meta`` device (no memory), and the processor is
asked, once per tensor and on tiny probe arrays, what it does — so that the virtual safetensors file can
produce any row range of a parameter from just the GGUF rows behind it, instead of dequantizing whole
tensors as transformers does:

- a *row order* (LLaMA's q/k head permutation): the processor is run on a column of row numbers, and output
  row r is then stored row ``order[r]``;
- a *value map* (Gemma's norms stored as ``1 + w``): the processor itself is run on each decoded row range;
  a weight with a companion ``X.scale`` (a GGUF converted from ModelOpt NVFP4) is multiplied by it first.

Only processors known to be row-local (``config.ROW_LOCAL_PROCESSORS``) are used this way; for the others
the architecture gets no hf/ folder (``config.check_supported``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptfs.checkpoint.api import Checkpoint, Tensor
from ckptfs.hffolder.config import ROW_LOCAL_PROCESSORS, Unsupported

ValueMap = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class ParamSource:
    """One Hugging Face parameter: which GGUF tensor it comes from and how."""

    name: str
    tensor: Tensor
    shape: tuple[int, ...]
    row_order: np.ndarray | None = None   # output row r = stored row row_order[r]
    value_map: ValueMap | None = None      # applied to float32 rows, elementwise


def _meta_model(config: Any):
    """The model class ``from_pretrained`` would build for this config, on the meta device (no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def gguf_to_hf_names(config: Any, processor: Any) -> dict[str, str]:
    """transformers' own GGUF name -> parameter name map for this config's model."""
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    return get_gguf_hf_weights_map(_meta_model(config), processor)


def _row_order(processor: Any, gguf_name: str, rows: int) -> np.ndarray | None:
    """The processor's row permutation of this tensor (None when it keeps the order)."""
    probe = np.arange(rows, dtype=np.float64).reshape(rows, 1)
    out = processor.process(weights=probe, name=gguf_name, tensor_key_mapping={}, parsed_parameters={}).weights
    order = np.asarray(out).reshape(-1)
    if order.shape != (rows,) or np.array_equal(order, probe[:, 0]):
        return None
    as_int = order.astype(np.int64)
    if not np.array_equal(np.sort(as_int), np.arange(rows)) or not np.array_equal(as_int, order):
        raise Unsupported(f"transformers' processor changes the rows of {gguf_name!r} in a way that is not a "
                          "row permutation")
    return as_int


def _value_map(processor: Any, gguf_name: str) -> ValueMap | None:
    """The processor's elementwise change of this tensor's values (None when it leaves them alone)."""
    def apply(values: np.ndarray) -> np.ndarray:
        return processor.process(weights=values, name=gguf_name, tensor_key_mapping={},
                                 parsed_parameters={}).weights

    probe = np.array([0.25, -3.0], np.float32)
    return None if np.array_equal(apply(probe.copy()), probe) else apply


def plan(checkpoint: Checkpoint, architecture: str, config: Any, config_values: dict) -> list[ParamSource]:
    """Every parameter the safetensors file holds, in GGUF file order (a sequential read of the file is a
    sequential read of the GGUF)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    cls = TENSOR_PROCESSORS.get(architecture, TensorProcessor)
    processor = cls(config=config_values)
    names = gguf_to_hf_names(config, processor)
    params: list[ParamSource] = []
    seen: set[str] = set()
    for tensor in checkpoint.tensors:
        hf_name = names.get(tensor.name)
        if hf_name is None or hf_name in seen:
            continue  # transformers skips tensors its model has no parameter for (rope_freqs, ...)
        if not tensor.decodable or tensor.info.damaged:
            raise Unsupported(f"tensor {tensor.name!r} cannot be decoded ({tensor.info.damaged or tensor.storage_type})")
        seen.add(hf_name)
        rows = tensor.shape[0] if len(tensor.shape) > 1 else 1
        kind = ROW_LOCAL_PROCESSORS.get(cls.__name__)
        order = _row_order(processor, tensor.name, rows) if kind == "rows" else None
        values = _value_map(processor, tensor.name) if kind == "values" else None
        scale = companion_scale(checkpoint, tensor.name)
        if scale is not None:
            values = _scaled(scale, values)
        params.append(ParamSource(hf_name, tensor, tuple(tensor.shape), order, values))
    return params


def companion_scale(checkpoint: Checkpoint, name: str) -> np.float32 | None:
    """The companion scale of GGUF weight ``name`` (``X.scale`` beside ``X.weight``: the second-level scale of
    a GGUF converted from ModelOpt NVFP4, which llama.cpp multiplies into the layer's output), or None. One
    value per weight; a scale per expert belongs to MoE tensors, which hf/ does not serve."""
    if not name.endswith(".weight"):
        return None
    scale_name = name[:-len(".weight")] + ".scale"
    if scale_name not in checkpoint:
        return None
    tensor = checkpoint[scale_name]
    if not tensor.decodable or tensor.info.damaged or tensor.size != 1:
        raise Unsupported(f"the companion scale {scale_name!r} is not one readable value "
                          f"({tensor.info.damaged or f'{tensor.size} values'})")
    return np.float32(tensor.numpy().reshape(-1)[0])


def _scaled(scale: np.float32, then: ValueMap | None) -> ValueMap:
    """The weight times its companion scale (one float32 multiply, as llama.cpp's F32 scale), then ``then``."""
    def apply(values: np.ndarray) -> np.ndarray:
        scaled = np.multiply(values, scale, dtype=np.float32)
        return scaled if then is None else then(scaled)

    return apply
