"""config.json of a GGUF: transformers' own GGUF config tables, fed with ckptfs's metadata.

transformers turns a GGUF's metadata into a config inside ``load_gguf_checkpoint``, which insists on opening
the file with gguf-py's reader (seconds for a big vocabulary). Here the same tables — ``GGUF_CONFIG_MAPPING``
(llama.cpp key -> config attribute per architecture), ``GGUF_CONFIG_DEFAULTS_MAPPING`` and the list of
architectures it can map — are applied to the values ckptfs's reader already decoded, with the few
architecture fix-ups that function makes (mistral, gemma3 -> gemma3_text, tied embeddings, vocab size).
``tests/test_hf_*.py`` check the result against ``load_gguf_checkpoint`` itself for every architecture tested.

These tables are not a stable API of transformers: the version the tests run with is pinned in setup.sh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np


class Unsupported(Exception):
    """This GGUF gets no hf/ folder; the message (one line) says why."""


#: transformers' legacy GGUF tensor processors that are row-local, and how (see weights.py): "rows" permutes
#: rows, "values" maps values elementwise, None changes nothing. The virtual safetensors file can then produce
#: any row range on its own. Other processors reshape, split or merge tensors (MoE experts, T5, Bloom's fused
#: QKV...), which ckptfs does not replay: those architectures get no hf/ folder.
ROW_LOCAL_PROCESSORS = {"TensorProcessor": None, "LlamaTensorProcessor": "rows",
                        "Gemma2TensorProcessor": "values", "NemotronTensorProcessor": "values"}

#: Text-only model types that transformers' loader derives from a multimodal architecture name.
_TEXT_MODEL_TYPES = {"gemma3": "gemma3_text"}

#: GGUF architecture names that transformers spells differently as model types (its own renames).
_ARCH_RENAMES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "gpt_oss": "gpt_oss",
                 "minimax-m2": "minimax_m2"}


def reader_value(value: Any) -> Any:
    """A metadata value as transformers' GGUF readers hand it over: arrays as lists of Python scalars."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [reader_value(v) for v in value]
    return value


def architectures(metadata: Mapping[str, Any]) -> tuple[str, str]:
    """(architecture as the file names it, the name transformers' tables use for it)."""
    if "general.architecture" not in metadata:
        raise Unsupported("the GGUF has no general.architecture key")
    architecture = metadata["general.architecture"]
    name = metadata.get("general.name") or ""
    if "llama" in architecture and "mistral" in name:
        return architecture, "mistral"
    if "t5" in architecture:
        raise Unsupported(f"architecture {architecture!r} is an encoder-decoder model; hf/ serves causal LMs")
    return architecture, _ARCH_RENAMES.get(architecture, architecture)


def check_supported(metadata: Mapping[str, Any]) -> tuple[str, str]:
    """The (architecture, transformers name) pair, or Unsupported saying why transformers cannot map it."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    architecture, updated = architectures(metadata)
    if _newer_loader(architecture):
        raise Unsupported(f"transformers loads {architecture!r} through its newer GGUF conversion path, which "
                          "ckptfs's hf/ does not replay yet")
    if architecture not in GGUF_CONFIG_MAPPING and updated not in GGUF_CONFIG_MAPPING:
        raise Unsupported(f"transformers has no GGUF mapping for architecture {architecture!r}")
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor).__name__
    if processor not in ROW_LOCAL_PROCESSORS:
        raise Unsupported(f"transformers converts {architecture!r} tensors with {processor}, which reshapes or "
                          "splits them; ckptfs's hf/ serves only architectures whose tensors map one to one")
    return architecture, updated


def _newer_loader(architecture: str) -> bool:
    try:
        from transformers.integrations.gguf import GGUF_CONFIG_ARCHS
    except ImportError:  # a transformers without the newer path
        return False
    return architecture in GGUF_CONFIG_ARCHS


def config_dict(metadata: Mapping[str, Any], tensor_names: Sequence[str]) -> dict[str, Any]:
    """The config dict ``load_gguf_checkpoint(path)["config"]`` builds, from ckptfs's metadata."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    architecture, updated = check_supported(metadata)
    config: dict[str, Any] = {}
    if "stablelm" in architecture:
        config["use_qkv_bias"] = any(b in n for n in tensor_names for b in ("attn_q.bias", "attn_k.bias", "attn_v.bias"))
        config["use_parallel_residual"] = not any("ffn_norm" in n for n in tensor_names)
    config["tie_word_embeddings"] = (all(n != "output.weight" for n in tensor_names)
                                     or architecture in ("falcon", "bloom"))
    defaults = GGUF_CONFIG_DEFAULTS_MAPPING.get(updated, GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture) or {})
    for key, value in defaults.items():
        config.setdefault(key, value)
    mapping = cast(dict[str, dict[str, Any]], GGUF_CONFIG_MAPPING)  # transformers types its values as object
    for gguf_key in metadata:
        renamed_key = gguf_key.replace(architecture, updated)
        prefix, _, config_key = renamed_key.partition(".")
        table = mapping.get(prefix)
        if table is None or config_key not in table or table[config_key] in (None, -1):
            continue
        found: Any = reader_value(metadata[gguf_key])
        if isinstance(found, list) and len(found) == 1:
            found = found[0]
        if isinstance(found, str) and architecture in found:
            found = found.replace(architecture, updated)
        config[table[config_key]] = found
    model_type = config.get("model_type")
    config["model_type"] = _TEXT_MODEL_TYPES.get(model_type, model_type) if model_type is not None else None
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in metadata:
        config["vocab_size"] = len(metadata["tokenizer.ggml.tokens"])
    return config


def causal_lm_class(model_type: str) -> str | None:
    """The class transformers loads a causal LM of ``model_type`` with (``LlamaForCausalLM``, ...): what a
    real Hugging Face folder's ``config.json`` names under ``architectures``, and what llama.cpp's
    ``convert_hf_to_gguf.py`` and vLLM pick their model code by. None for a type transformers has none for."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)


def config_files(config_values: dict[str, Any], metadata: Mapping[str, Any], dtype: str) -> tuple[Any, dict[str, bytes]]:
    """(the config object, {"config.json": ..., "generation_config.json": ...}) as save_pretrained writes them.

    The config is the one ``from_pretrained(dir, gguf_file=...)`` builds, with ``dtype`` set to the dtype the
    safetensors file holds and ``architectures`` naming the model's causal-LM class (``causal_lm_class``),
    which the GGUF loader leaves unset. generation_config.json takes the special token ids from the tokenizer metadata
    (the config mapping leaves them at the config class's defaults).
    """
    import tempfile
    from pathlib import Path

    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.for_model(**config_values)
    config.dtype = dtype
    architecture = causal_lm_class(config.model_type)
    if architecture is not None:
        config.architectures = [architecture]
    generation = GenerationConfig.from_model_config(config)
    ids = {"bos_token_id": "tokenizer.ggml.bos_token_id", "eos_token_id": "tokenizer.ggml.eos_token_id",
           "pad_token_id": "tokenizer.ggml.padding_token_id"}
    found = {attr: int(metadata[key]) for attr, key in ids.items() if key in metadata}
    for attr, value in found.items():
        setattr(generation, attr, value)
    with tempfile.TemporaryDirectory(prefix="ckptfs-hf-") as tmp:
        config.save_pretrained(tmp)
        if found:
            generation.save_pretrained(tmp)
        files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
    return config, files
