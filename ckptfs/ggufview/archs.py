"""The architectures ``gguf/model.gguf`` is made for: one entry each.

An entry says which ``config.json`` ``architectures`` names it serves, llama.cpp's architecture (gguf-py's
``MODEL_ARCH`` member, which gives the tensor-name map), whether the common text-model keys are written and
which keys follow them, the per-tensor rules (``transforms``: renames, row order, rows kept, a value added),
the tensors computed from the config, the tensors made from several stored parts (``parts``: gpt-oss's
MXFP4 experts) and the tokenizer export (``vocab``). Adding an architecture is one entry here plus its test
against the converter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.ggufview import Config, Unsupported
from ckptfs.ggufview import arch_keys, generated, gptoss, transforms, vocab

if TYPE_CHECKING:
    from ckptfs.ggufview.tensors import RowReader, TensorPlan

#: (HF tensor name, its 2-D shape (rows, cols), config) -> the stored row of each output row, or None
RowOrder = Callable[[str, tuple[int, int], Config], "np.ndarray | None"]
#: (GGUFWriter, config, folder) -> None: keys written into the header
Keys = Callable[[Any, Config, Path], None]


#: (config, stored tensors, gguf-py's name map, file type, a reader of stored rows) -> (tensors made from
#: several stored parts, the names of the stored tensors they consume)
Parts = Callable[[Config, list[TensorInfo], Any, Any, "RowReader"], "tuple[list[TensorPlan], set[str]]"]


def _no_keys(writer, config: Config, folder: Path) -> None:
    return None


def _no_parts(config: Config, infos: list[TensorInfo], name_map, file_type, read) -> tuple[list, set[str]]:
    return [], set()


def _no_check(config: Config) -> None:
    return None


@dataclass(frozen=True)
class Architecture:
    name: str                              # general.architecture
    hf_names: tuple[str, ...]              # config.json "architectures"[0] values it serves
    model_arch: str                        # gguf.MODEL_ARCH member
    extra_keys: Keys = _no_keys            # keys past the common ones
    row_order: RowOrder = transforms.same_rows
    check: Callable[[Config], None] = _no_check  # raises Unsupported for a config this entry cannot serve
    #: tensors the converter computes from the config (llama.cpp name -> float32 values)
    generated: Callable[[Config], dict[str, np.ndarray]] = generated.nothing
    vocab: Keys = vocab.add_llama_vocab    # every tokenizer key
    common_keys: bool = True               # the common text-model keys (phi3 writes its own set)
    tensor_name: Callable[[str], str | None] = transforms.default_name  # None: not in the file
    shift: Callable[[str], float] = transforms.no_shift            # added to every value (float32 rule)
    rows_kept: Callable[[str, Path, Config], int | None] = transforms.all_rows
    parts: Parts = _no_parts                # tensors made from several stored parts (gpt-oss's MXFP4 experts)


def _llama_check(config: Config) -> None:
    if any(key in config for key in ("num_local_experts", "draft_vocab_size", "text_config")):
        raise Unsupported("this llama-family config (experts, a draft model or a nested text config) "
                          "is not served yet")


def _nested_check(config: Config) -> None:
    if "text_config" in config:
        raise Unsupported("a config with a nested text_config is not served yet")


def _bert_check(config: Config) -> None:
    if arch_keys.classifier_labels(config):
        raise Unsupported("a BERT classification head (id2label) is not served yet")


ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("llama", ("LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM"), "LLAMA",
                 arch_keys.llama_keys, transforms.llama_rows, _llama_check, generated.llama3_rope_freqs),
    Architecture("qwen2", ("Qwen2ForCausalLM",), "QWEN2", arch_keys.pooling_keys,
                 check=_nested_check, vocab=vocab.add_spm_or_gpt2_vocab),
    Architecture("qwen3", ("Qwen3ForCausalLM",), "QWEN3", arch_keys.qwen3_keys,
                 check=_nested_check, vocab=vocab.add_spm_or_gpt2_vocab),
    Architecture("gemma3", ("Gemma3ForCausalLM",), "GEMMA3", arch_keys.gemma3_keys, check=_nested_check,
                 vocab=vocab.add_gemma3_vocab, shift=transforms.gemma_norm_shift,
                 rows_kept=transforms.gemma3_rows_kept),
    Architecture("phi3", ("Phi3ForCausalLM",), "PHI3", arch_keys.phi3_keys, check=_nested_check,
                 generated=generated.phi3_rope_factors, vocab=vocab.add_phi3_vocab, common_keys=False),
    Architecture("bert", ("BertModel", "BertForMaskedLM"), "BERT", arch_keys.bert_keys, check=_bert_check,
                 vocab=vocab.add_wordpiece_vocab, tensor_name=transforms.bert_name),
    Architecture("gpt-oss", ("GptOssForCausalLM",), "GPT_OSS", gptoss.gptoss_keys, check=gptoss.check,
                 vocab=vocab.add_gpt2_vocab, tensor_name=gptoss.tensor_name, parts=gptoss.expert_parts),
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
