"""The architectures ``gguf/model.gguf`` is made for: one entry each.

An entry says which ``config.json`` ``architectures`` names it serves, llama.cpp's architecture (gguf-py's
``MODEL_ARCH`` member, which gives the tensor-name map), the keys it writes beyond the common text-model
ones, which stored rows each tensor's rows come from (``row_order``), and which tokenizer exports it tries.
Adding an architecture is one entry here plus its test against the converter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptfs.ggufview import Config, Unsupported
from ckptfs.ggufview.hparams import rope_parameters

#: (HF tensor name, its 2-D shape (rows, cols), config) -> the stored row of each output row, or None
RowOrder = Callable[[str, tuple[int, int], Config], "np.ndarray | None"]


@dataclass(frozen=True)
class Architecture:
    name: str                              # general.architecture
    hf_names: tuple[str, ...]              # config.json "architectures"[0] values it serves
    model_arch: str                        # gguf.MODEL_ARCH member
    extra_keys: Callable[[Any, Config], None]  # (GGUFWriter, config): keys past the common ones
    row_order: RowOrder
    check: Callable[[Config], None]        # raises Unsupported for a config this entry cannot serve
    #: tensors the converter computes from the config (llama.cpp name -> float32 values)
    generated: Callable[[Config], dict[str, np.ndarray]] = lambda config: {}


def head_permutation(rows: int, n_head: int) -> np.ndarray:
    """The stored row of each output row under the converter's q/k permutation: within each head, the
    two halves of the rotary dimensions are interleaved (output row ``2*i + j`` of a head is its stored row
    ``j*half + i``), which turns Hugging Face's rotate-half layout into GGML's pairwise one."""
    per_head = rows // n_head
    half = per_head // 2
    h, i, j = np.meshgrid(np.arange(n_head), np.arange(half), np.arange(2), indexing="ij")
    return (h * per_head + j * half + i).reshape(-1)


def _llama_rows(name: str, shape: tuple[int, int], config: Config) -> np.ndarray | None:
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return head_permutation(shape[0], n_head)
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return head_permutation(shape[0], n_kv)
    return None


def _llama_keys(writer, config: Config) -> None:
    writer.add_vocab_size(config["vocab_size"])
    rope_dim = config.get("head_dim")
    if rope_dim is None:
        rope_dim = config["hidden_size"] // config["num_attention_heads"]
    writer.add_rope_dimension_count(rope_dim)


def _llama_check(config: Config) -> None:
    if any(key in config for key in ("num_local_experts", "draft_vocab_size", "text_config")):
        raise Unsupported("this llama-family config (experts, a draft model or a nested text config) "
                          "is not served yet")


def _llama_generated(config: Config) -> dict[str, np.ndarray]:
    """``rope_freqs.weight`` for llama3 rope scaling: each rotary frequency's scale, computed as the
    converter computes it, in torch float32 (a float32 power in numpy differs in the last bit for some)."""
    rope = rope_parameters(config)
    params = rope.get("full_attention", rope)
    if not params or str(params.get("rope_type", "")).lower() != "llama3":
        return {}
    try:
        import torch
    except ImportError:
        raise Unsupported("llama3 rope scaling needs torch for its rope_freqs tensor: pip install torch") from None
    base = params.get("rope_theta", 10000.0)
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    factor = params.get("factor", 8.0)
    low, high = params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    old_context = params.get("original_max_position_embeddings", 8192)
    long_wave, short_wave = old_context / low, old_context / high
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    scales = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < short_wave:
            scales.append(1)
        elif wavelen > long_wave:
            scales.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            scales.append(1 / ((1 - smooth) / factor + smooth))
    return {"rope_freqs.weight": torch.tensor(scales, dtype=torch.float32).numpy()}


ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("llama", ("LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM"), "LLAMA",
                 _llama_keys, _llama_rows, _llama_check, _llama_generated),
)


def supported_names() -> list[str]:
    return sorted({name for arch in ARCHITECTURES for name in arch.hf_names})


def architecture_of(config: Config) -> Architecture:
    """The entry for ``config``'s first ``architectures`` name; Unsupported naming it and the list."""
    names = config.get("architectures") or []
    hf_name = names[0] if names else None
    for arch in ARCHITECTURES:
        if hf_name in arch.hf_names:
            arch.check(config)
            return arch
    shown = "no architectures in config.json" if hf_name is None else f"architecture {hf_name}"
    raise Unsupported(f"{shown} is not served (supported: {', '.join(supported_names())})")
