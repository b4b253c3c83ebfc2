"""The architectures ``gguf/model.gguf`` is made for: one entry each.

An entry says which ``config.json`` ``architectures`` names it serves, llama.cpp's architecture (gguf-py's
``MODEL_ARCH`` member, which gives the tensor-name map), the keys it writes beyond the common text-model
ones, which stored rows each tensor's rows come from (``row_order``), and which tokenizer exports it tries.
Adding an architecture is one entry here plus its test against the converter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptfs.ggufview import Unsupported

Config = Mapping[str, Any]
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
    rope = config.get("rope_parameters", config.get("rope_scaling")) or {}
    rope_type = str(rope.get("rope_type", rope.get("type", ""))).lower()
    if rope_type == "llama3":
        raise Unsupported("llama3 rope scaling (a generated rope_freqs tensor) is not served yet")


ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("llama", ("LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM"), "LLAMA",
                 _llama_keys, _llama_rows, _llama_check),
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
