"""Per-tensor rules of the converter's architecture classes, as functions of a tensor's Hugging Face name:
which stored row each output row comes from (llama's q/k permutation), which rows are kept (Gemma 3 drops
embedding rows past its tokenizer), what is added to every value (Gemma's norms store ``weight - 1``) and how
a stored name is renamed or dropped before gguf-py's name map (BERT's ``bert.`` prefix, its pooler).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ckptfs.ggufview import Config
from ckptfs.ggufview.files import read_json


def head_permutation(rows: int, n_head: int) -> np.ndarray:
    """The stored row of each output row under the converter's q/k permutation: within each head, the
    two halves of the rotary dimensions are interleaved (output row ``2*i + j`` of a head is its stored row
    ``j*half + i``), which turns Hugging Face's rotate-half layout into GGML's pairwise one."""
    per_head = rows // n_head
    half = per_head // 2
    h, i, j = np.meshgrid(np.arange(n_head), np.arange(half), np.arange(2), indexing="ij")
    return (h * per_head + j * half + i).reshape(-1)


def llama_rows(name: str, shape: tuple[int, int], config: Config) -> np.ndarray | None:
    """llama's q/k projections (weights and biases) permuted per head; k with the KV head count."""
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return head_permutation(shape[0], n_head)
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return head_permutation(shape[0], n_kv)
    return None


def same_rows(name: str, shape: tuple[int, int], config: Config) -> None:
    """Every other architecture served keeps the stored row order."""
    return None


def no_shift(name: str) -> float:
    return 0.0


def gemma_norm_shift(name: str) -> float:
    """Gemma's RMS norms multiply by ``1 + weight``: the converter stores ``weight + 1`` (added in the type
    it holds the tensor in: float32 for BF16, the stored type for F16 and F32)."""
    return 1.0 if name.endswith("norm.weight") else 0.0


def all_rows(name: str, folder: Path, config: Config) -> None:
    return None


def gemma3_rows_kept(name: str, folder: Path, config: Config) -> int | None:
    """Gemma 3's token embedding keeps only the rows its tokenizer has ids for: the SentencePiece
    vocabulary's length (``vocab_size`` padded with [PADi]) or, without one, ``tokenizer.json``'s vocabulary
    plus its added tokens."""
    if "embed_tokens.weight" not in name:
        return None
    if (folder / "tokenizer.model").is_file():
        from ckptfs.ggufview.vocab_spm import spm_vocab_size

        return spm_vocab_size(folder, config)
    tokenizer = read_json(folder / "tokenizer.json")
    return len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"])


def default_name(name: str) -> str | None:
    """A stored name as the converter maps it (a multimodal wrapper's ``language_model.`` dropped)."""
    return name.replace("language_model.", "")


_BERT_DROPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


def bert_name(name: str) -> str | None:
    """BERT's names: the ``bert.`` prefix dropped, old ``gamma``/``beta`` as weight/bias, and the pooler
    and the pre-training heads left out (the model serves embeddings)."""
    name = name.removeprefix("bert.")
    if name.endswith(".gamma"):
        name = name[:-6] + ".weight"
    if name.endswith(".beta"):
        name = name[:-5] + ".bias"
    if name in _BERT_DROPPED or name.startswith(("cls.predictions", "cls.seq_relationship")):
        return None
    return default_name(name)
