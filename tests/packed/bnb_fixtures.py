"""bitsandbytes fixtures made by bitsandbytes itself, and its own dequantization as the oracle.

Writers: ``quantize_4bit`` / ``QuantState.as_dict(packed=True)`` (what ``Linear4bit`` saves) and
``int8_vectorwise_quant`` (what ``Linear8bitLt`` saves as ``weight`` and ``SCB``), written as a model folder
by ``safetensors.torch``; or a tiny Llama quantized and saved by transformers (``save_pretrained`` on CPU).

Oracles: the 4-bit values are bitsandbytes' pure-PyTorch ``dequantize_4bit`` (its default backend's
``_dequantize_4bit_compute``, eagerly: the module wraps it in ``torch.compile``), fed with the quant state
restored from the stored tensors by ``QuantState.from_dict`` and its nested absmax decoded by
``dequantize_blockwise`` plus the offset, as ``functional.dequantize_4bit`` does. Its native CPU kernel is not
the oracle: it takes the wrong block scale where a row is not a multiple of the block size. LLM.int8: its
``int8_vectorwise_dequant``. Nothing here imports ckptfs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def quantize_4bit(weight, quant_type: str, blocksize: int = 64, double_quant: bool = False) -> dict[str, Any]:
    """A 4-bit layer's stored tensors by role (``weight``, ``weight.absmax``, ...), as Linear4bit saves them."""
    import bitsandbytes.functional as F

    codes, state = F.quantize_4bit(weight, blocksize=blocksize, compress_statistics=double_quant,
                                   quant_type=quant_type)
    tensors = {"weight": codes}
    tensors.update({f"weight.{key}": value for key, value in state.as_dict(packed=True).items()})
    return tensors


def dequantize_4bit(tensors: dict[str, Any], dtype=None):
    """bitsandbytes' pure-PyTorch 4-bit dequantization of stored tensors (``dtype``: the quant state's when
    None; ``torch.float32`` for the unrounded values), as a torch tensor of the weight's shape."""
    import torch
    import bitsandbytes.functional as F
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    stored = {key[len("weight."):]: value for key, value in tensors.items() if key.startswith("weight.")}
    state = F.QuantState.from_dict(stored, device=torch.device("cpu"))
    absmax = state.absmax
    if state.nested:
        absmax = F.dequantize_blockwise(state.absmax, state.state2)
        absmax += state.offset
    compute = getattr(_dequantize_4bit_compute, "__wrapped__", _dequantize_4bit_compute)
    code = _get_4bit_code(state.quant_type, torch.device("cpu"))
    return compute(tensors["weight"].reshape(-1), absmax.float(), code, state.blocksize, state.shape,
                   dtype or state.dtype)


def native_dequantize_4bit(tensors: dict[str, Any]):
    """``functional.dequantize_4bit`` as a user calls it (on CPU: bitsandbytes' native kernel)."""
    import torch
    import bitsandbytes.functional as F

    stored = {key[len("weight."):]: value for key, value in tensors.items() if key.startswith("weight.")}
    state = F.QuantState.from_dict(stored, device=torch.device("cpu"))
    return F.dequantize_4bit(tensors["weight"], state)


def quantize_int8(weight) -> dict[str, Any]:
    """An LLM.int8 layer's stored tensors (``weight`` int8, ``SCB``, ``weight_format`` 0 = row)."""
    import torch
    import bitsandbytes.functional as F

    codes, scb, _ = F.int8_vectorwise_quant(weight.half())
    return {"weight": codes, "SCB": scb, "weight_format": torch.tensor(0, dtype=torch.uint8)}


def dequantize_int8(tensors: dict[str, Any]):
    import bitsandbytes.functional as F

    return F.int8_vectorwise_dequant(tensors["weight"], tensors["SCB"])


def bnb_config(bits: int = 4, quant_type: str = "nf4", double_quant: bool = False,
               skip: list[str] | None = None) -> dict[str, Any]:
    """``quantization_config`` as transformers writes it for ``BitsAndBytesConfig``."""
    return {"quant_method": "bitsandbytes", "load_in_4bit": bits == 4, "load_in_8bit": bits == 8,
            "_load_in_4bit": bits == 4, "_load_in_8bit": bits == 8, "bnb_4bit_quant_type": quant_type,
            "bnb_4bit_use_double_quant": double_quant, "bnb_4bit_compute_dtype": "bfloat16",
            "bnb_4bit_quant_storage": "uint8", "llm_int8_threshold": 6.0, "llm_int8_skip_modules": skip,
            "llm_int8_has_fp16_weight": False, "llm_int8_enable_fp32_cpu_offload": False}


def write_folder(folder: str | Path, layers: dict[str, dict[str, Any]], quantization_config: dict[str, Any],
                 extra: dict[str, Any] | None = None) -> Path:
    """A model folder: ``model.safetensors`` (torch tensors, bfloat16 kept) and ``config.json``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    flat = {f"{prefix}.{role}": value.contiguous() for prefix, tensors in layers.items()
            for role, value in tensors.items()}
    flat.update(extra or {})
    save_file(flat, str(folder / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
              "quantization_config": quantization_config}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def saved_by_transformers(folder: Path, bits: int, **options: Any) -> Path:
    """A tiny Llama (hidden 96, intermediate 200, 2 layers; bfloat16) quantized by transformers with
    bitsandbytes on CPU and written by ``save_pretrained`` into ``folder / "q"``."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=96, intermediate_size=200, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=128)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder / "dense")
    settings = BitsAndBytesConfig(load_in_4bit=bits == 4, load_in_8bit=bits == 8, **options)
    model = AutoModelForCausalLM.from_pretrained(folder / "dense", quantization_config=settings, device_map="cpu",
                                                 dtype=torch.bfloat16)
    model.save_pretrained(folder / "q")
    return folder / "q"


def stored_layers(path: Path) -> dict[str, dict[str, Any]]:
    """A saved folder's bitsandbytes layers: ``prefix -> {role: torch tensor}`` (layers with an SCB or a
    quant state)."""
    from safetensors.torch import load_file

    tensors = load_file(str(path / "model.safetensors"))
    prefixes = {name.split(".weight.quant_state.")[0] for name in tensors if ".weight.quant_state." in name}
    prefixes |= {name[:-len(".SCB")] for name in tensors if name.endswith(".SCB")}
    return {prefix: {name[len(prefix) + 1:]: value for name, value in tensors.items()
                     if name.startswith(prefix + ".")} for prefix in prefixes}


def as_numpy(tensor) -> np.ndarray:
    """A float torch tensor as float32 numpy (exact widening)."""
    import torch

    return tensor.to(torch.float32).numpy()
