"""tokenizer.json and tokenizer_config.json of a GGUF, built by transformers' own GGUF tokenizer converters.

transformers' ``get_gguf_tokenizer`` reads the ``tokenizer.ggml.*`` keys out of the file (with its own
reader) and groups them with ``GGUF_TOKENIZER_MAPPING``; ``convert_gguf_tokenizer`` then builds the fast
tokenizer with the builder for the file's tokenizer model and architecture (sentencepiece, byte-level BPE,
unigram, Gemma's respelled spaces...). Here the same mapping is applied to ckptfs's decoded metadata, the
same converter builds the tokenizer, and the tokenizer class ``AutoTokenizer`` would pick for the model saves
the files (``save_pretrained``), so loading the folder gives the tokenizer ``gguf_file=`` gives.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckptfs.hffolder.config import Unsupported, reader_value

#: transformers' special-token attribute -> the tokenizer.ggml key holding its id (as get_gguf_tokenizer)
_SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                   "pad_token": "padding_token_id"}


def gguf_tokenizer(metadata: Mapping[str, Any]) -> tuple[str, dict, dict]:
    """(architecture, tokenizer_dict, tokenizer_config) as ``get_gguf_tokenizer(path)`` returns them."""
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING

    if "tokenizer.ggml.tokens" not in metadata:
        raise Unsupported("the GGUF holds no tokenizer (no tokenizer.ggml.tokens)")
    grouped = {group: {name: reader_value(metadata[f"tokenizer.{key}"]) for key, name in renames.items()
                       if f"tokenizer.{key}" in metadata}
               for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer, tokenizer_config = grouped["tokenizer"], grouped["tokenizer_config"]
    tokenizer_type = tokenizer.get("tokenizer_type")
    if tokenizer_type == "llama":
        tokenizer_config.setdefault("add_bos_token", True)
    elif tokenizer_type == "gemma4":
        tokenizer_config["add_bos_token"] = False
    tokens = tokenizer["tokens"]
    for name, key in _SPECIAL_TOKENS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        tokenizer_config[name] = tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None
    return metadata["general.architecture"], tokenizer, tokenizer_config


def _tokenizer_class(model_type: str):
    """The class ``AutoTokenizer`` instantiates for this model type (TokenizersBackend where none is registered)."""
    from transformers import TokenizersBackend
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

    name = TOKENIZER_MAPPING_NAMES.get(model_type)
    cls = tokenizer_class_from_name(name) if name else None
    return cls if cls is not None else TokenizersBackend


def tokenizer_files(metadata: Mapping[str, Any], model_type: str) -> dict[str, bytes]:
    """File name -> bytes of the tokenizer files ``save_pretrained`` writes for this GGUF's tokenizer."""
    from transformers.integrations.gguf import convert_gguf_tokenizer

    architecture, tokenizer_dict, tokenizer_config = gguf_tokenizer(metadata)
    try:
        backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    except ValueError as exc:  # a tokenizer model transformers has no converter for
        raise Unsupported(f"transformers cannot build its tokenizer: {str(exc).splitlines()[0]}") from None
    tokenizer = _tokenizer_class(model_type)(tokenizer_object=backend, **tokenizer_config, **extra)
    with tempfile.TemporaryDirectory(prefix="ckptfs-hf-") as tmp:
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
