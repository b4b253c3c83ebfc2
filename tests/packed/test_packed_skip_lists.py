"""The modules-not-quantized lists, each matched by its producer's own rule: transformers'
``should_convert_module`` (``modules_to_not_convert``, ``llm_int8_skip_modules``) and compressed-tensors'
``match_name`` (``ignore``) are the oracles over a grid of names and patterns; ModelOpt's wildcards by
``fnmatch``'s rule as its exporter writes them."""

from __future__ import annotations

import itertools

import pytest

from ckptfs.packed.detect import Absent, not_quantized

NAMES = ["lm_head", "model.layers.1.self_attn.q_proj", "model.layers.11.self_attn.q_proj", "model.layers.1.mlp.gate",
         "model.layers.1.mlp.gate_proj", "model.embed_tokens", "language_model.lm_head", "visual.blocks.0.attn.qkv"]


def test_transformers_lists_match_as_should_convert_module():
    quantizers_utils = pytest.importorskip("transformers.quantizers.quantizers_utils")
    patterns = ["lm_head", "model.layers.1", "layers.1", "mlp.gate", "q_proj", "model.layers.*.self_attn",
                r"model\.layers\.1[0-9]", "visual", "gate_proj", "embed"]
    for name, pattern in itertools.product(NAMES, patterns):
        want = not quantizers_utils.should_convert_module(name, [pattern])
        for key in ("modules_to_not_convert", "llm_int8_skip_modules"):
            got = not_quantized(name, {key: [pattern]})
            assert (got is not None) == want, (name, pattern, key)
            if want:
                assert got == f"layer is in the config's {key} list ({pattern})"


def test_compressed_tensors_ignore_matches_as_match_name():
    """Every name compressed-tensors' ``match_name`` ignores is ignored; beyond it, only a name ending in
    ``.`` + the entry (``language_model.lm_head`` for ``lm_head``: the module its class-free list means)."""
    match = pytest.importorskip("compressed_tensors.utils.match")
    patterns = ["lm_head", "re:.*lm_head", "re:model\\.layers\\.1\\..*", "model.layers.1.mlp.gate", "re:visual.*",
                "mlp.gate"]
    for name, pattern in itertools.product(NAMES, patterns):
        got = not_quantized(name, {"ignore": [pattern]}) is not None
        want = match.match_name(name, pattern)
        assert got == (want or (not pattern.startswith("re:") and name.endswith("." + pattern))), (name, pattern)


def test_modelopt_exclude_modules_and_bad_patterns():
    assert not_quantized("model.layers.3.self_attn.o_proj", {"exclude_modules": ["*self_attn*"]}) is not None
    assert not_quantized("model.layers.3.mlp.down_proj", {"exclude_modules": ["*self_attn*"]}) is None
    assert not_quantized("model.layers.3.mlp.down_proj", {"exclude_modules": ["lm_head", "mlp.down"]}) is not None
    assert not_quantized("lm_head", {"exclude_modules": "lm_head"}) is not None       # a string, not a list
    with pytest.raises(Absent, match="is not a valid regular expression"):
        not_quantized("lm_head", {"ignore": ["re:("]})
