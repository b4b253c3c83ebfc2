"""``gguf/model.gguf`` in the mount of a Hugging Face model folder (``--gguf``): the GGUF file llama.cpp's
``convert_hf_to_gguf.py`` would write for that folder, served without writing it.

The header (metadata, vocabulary, tensor infos) is built once at mount from ``config.json`` and the
tokenizer files; each tensor's bytes are produced per read from the safetensors rows that read covers,
renamed, reordered (the q/k permutation of llama-family attention) and converted to the output type. What an
architecture needs is one entry of ``archs.ARCHITECTURES``. Needs ``ckptfs[gguf]`` (gguf-py, transformers,
tokenizers), imported only when a mount asks for ``gguf/``.
"""

from collections.abc import Mapping
from typing import Any

Config = Mapping[str, Any]  # a parsed config.json

GGUF_DIR = "gguf"
GGUF_FILE = "model.gguf"
OUTPUT_TYPES = ("auto", "f32", "f16", "bf16", "q8_0")


class Unsupported(Exception):
    """The folder gets no ``gguf/``: the one-line reason (an architecture, a tokenizer, a dtype)."""
