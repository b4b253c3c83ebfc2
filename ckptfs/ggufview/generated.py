"""Tensors the converter computes from ``config.json`` rather than reads (llama.cpp name -> float32)."""

from __future__ import annotations

import math

import numpy as np

from ckptfs.ggufview import Config, Unsupported
from ckptfs.ggufview.hparams import rope_parameters


def nothing(config: Config) -> dict[str, np.ndarray]:
    return {}


def llama3_rope_freqs(config: Config) -> dict[str, np.ndarray]:
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


def phi3_rope_factors(config: Config) -> dict[str, np.ndarray]:
    """phi3's LongRoPE factors (128k-context configs): the long and short per-frequency factors as F32
    tensors, one per rotary pair (Unsupported for lists of another length or a scaling type the converter
    refuses)."""
    rope = rope_parameters(config)
    long_factors, short_factors = rope.get("long_factor"), rope.get("short_factor")
    if not long_factors:
        return {}
    longrope_attention_factor(config)  # the type is one the converter serves
    n_embd = config.get("hidden_size", config.get("n_embd"))
    n_head = config.get("num_attention_heads", config.get("n_head"))
    rope_dims = int(rope.get("partial_rotary_factor", 1.0) * n_embd) // n_head
    if short_factors is None or len(long_factors) != len(short_factors) or len(long_factors) != rope_dims / 2:
        raise Unsupported(f"phi3 LongRoPE factors must be {rope_dims // 2} long and short values")
    return {"rope_factors_long.weight": np.asarray(long_factors, np.float32),
            "rope_factors_short.weight": np.asarray(short_factors, np.float32)}


def longrope_attention_factor(config: Config) -> float | None:
    """The attention factor phi3's LongRoPE scaling writes (None without long factors): the converter's
    formula for its scaling type, from the context length over the original one."""
    rope = rope_parameters(config)
    if not rope.get("long_factor"):
        return None
    context = config.get("n_positions", config.get("max_position_embeddings"))
    original = rope["original_max_position_embeddings"]
    scale = context / original
    kind = str(rope.get("rope_type", "")).lower()
    if kind in ("su", "longrope"):
        return math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
    if kind == "yarn":
        return 0.1 * math.log(scale) + 1.0 if scale > 1.0 else 1.0
    raise Unsupported(f"phi3 rope scaling type {kind!r} is not served")
