"""Counts a model's config gives (its layers, vocabulary, widths, heads), checked against the tensors present
before anything is sized or looped by them.

A config is the folder's (``config.json``, for ``gguf/``) or made from a GGUF's metadata (for ``hf/``), and
either may say anything: a ``num_hidden_layers`` of 10**9 had a header builder make a name table per block
for minutes and gigabytes, a ``vocab_size`` of 10**8 pad a vocabulary to that length. Every count the views
size something by must be a whole number the tensors bear out: the block count names a last block some
tensor belongs to (a dotted part of its name, ``layers.N-1`` or ``blk.N-1``) and is no more than the tensors
present; a width or a vocabulary is no larger than the largest tensor dimension (so a vocabulary is no
longer than the embedding's rows, however long that is: o200k's 201,088 rows pass).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ckptfs.core.descriptors import TensorInfo

#: the config keys of a model's block count, in the order the converters look for them
BLOCK_KEYS = ("n_layers", "num_hidden_layers", "n_layer", "num_layers")

#: config keys whose value sizes something a view builds (a vocabulary padded to it, a rotary table of a
#: head's size, a permutation of a width)
SIZE_KEYS = ("vocab_size", "vocab_size_per_layer_input", "type_vocab_size", "hidden_size", "n_embd", "dim",
             "intermediate_size", "num_attention_heads", "n_head", "n_heads", "num_key_value_heads",
             "n_kv_heads", "n_head_kv", "head_dim")

_INDEX = re.compile(r"(?<![^.])\d+(?![^.])")  # a dotted part of a tensor name that is a number


def count_problem(config: Mapping[str, Any], infos: Sequence[TensorInfo], source: str) -> str | None:
    """Why a count ``source`` (``config.json``, ``the GGUF``) gives is not one the tensors ``infos`` bear out
    (one line), or None when every one is (see the module docstring)."""
    largest = max((d for info in infos for d in info.shape), default=0)
    for key in SIZE_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if not _is_count(value):
            return f"{source}'s {key} is {_shown(value)}, not a count"
        if value > largest:
            return f"{source}'s {key} {value} is larger than any tensor dimension ({largest})"
    block_key = next((key for key in BLOCK_KEYS if key in config), None)
    if block_key is None:
        return None
    blocks = config[block_key]
    if not _is_count(blocks):
        return f"{source}'s {block_key} is {_shown(blocks)}, not a count"
    if blocks > len(infos):
        return f"{source}'s {block_key} is {blocks}, more than the {len(infos)} tensors present"
    if blocks > 0 and blocks - 1 not in {int(m) for info in infos for m in _INDEX.findall(info.name)}:
        return f"{source}'s {block_key} is {blocks}, but no tensor belongs to a block {blocks - 1}"
    return None


def _is_count(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
