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
