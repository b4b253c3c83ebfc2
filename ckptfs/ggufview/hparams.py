"""The keys every text model gets from ``config.json``: the converter's common rules (the first of each list
of synonyms that the config has; rope scaling from ``rope_parameters`` or ``rope_scaling``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckptfs.core.counts import BLOCK_KEYS, count_problem
from ckptfs.core.descriptors import TensorInfo
from ckptfs.ggufview import Config, Unsupported


def find(config: Config, keys: tuple[str, ...]) -> Any:
    """The value of the first of ``keys`` in ``config`` (None if none is there)."""
    return next((config[key] for key in keys if key in config), None)


def rope_parameters(config: Config) -> dict[str, Any]:
    """``rope_parameters`` (or ``rope_scaling``) with the top-level rope keys mirrored into it."""
    rope = dict(config.get("rope_parameters", config.get("rope_scaling")) or {})
    theta = find(config, ("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta",
                          "rotary_emb_base"))
    local_theta = find(config, ("local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta",
                                "rope_local_base_freq"))
    partial = find(config, ("partial_rotary_factor", "rope_pct", "rope_percent"))
    original = find(config, ("original_max_position_embeddings",))
    if "full_attention" not in rope and "sliding_attention" not in rope:
        if local_theta is not None:
            rope["sliding_attention"] = {"rope_theta": local_theta}
        if "rope_theta" not in rope and theta is not None:
            rope["rope_theta"] = theta
        if "rope_type" not in rope and rope.get("type") is not None:
            rope["rope_type"] = rope["type"]
        if "partial_rotary_factor" not in rope and partial is not None:
            rope["partial_rotary_factor"] = partial
        if "original_max_position_embeddings" not in rope and original is not None:
            rope["original_max_position_embeddings"] = original
    return rope


def block_count(config: Config) -> int:
    return find(config, BLOCK_KEYS)


def check_sizes(config: Config, infos: Sequence[TensorInfo]) -> None:
    """Unsupported (one line) unless every count config.json gives that the header builder sizes or loops by
    is one the tensors present bear out (``core.counts``): checked before anything is sized by them."""
    problem = count_problem(config, infos, "config.json")
    if problem is not None:
        raise Unsupported(problem)


def add_common_keys(writer, config: Config, file_type: int) -> None:
    """Block count, lengths, heads, rope, norms and the file type, as the converter writes them for any
    text model."""
    import gguf

    writer.add_block_count(block_count(config))
    optional = (
        (("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
          "model_max_length"), writer.add_context_length),
        (("hidden_size", "n_embd", "dim"), writer.add_embedding_length),
        (("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner",
          "hidden_dim"), writer.add_feed_forward_length),
        (("num_attention_heads", "n_head", "n_heads"), writer.add_head_count),
        (("num_key_value_heads", "n_kv_heads"), writer.add_head_count_kv),
    )
    for keys, add in optional:
        if (value := find(config, keys)) is not None:
            add(value)
    if config.get("is_causal") is False:
        writer.add_causal_attention(False)
    rope = rope_parameters(config)
    params = rope.get("full_attention", rope)
    rope_type = params.get("rope_type")
    factor = params.get("factor")
    if rope_type == "linear" and factor is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(factor)
    elif rope_type == "yarn" and factor is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(factor)
        writer.add_rope_scaling_orig_ctx_len(params["original_max_position_embeddings"])
        yarn = (("extrapolation_factor", writer.add_rope_scaling_yarn_ext_factor),
                ("attention_factor", writer.add_rope_scaling_yarn_attn_factor),
                ("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
                ("beta_slow", writer.add_rope_scaling_yarn_beta_slow))
        for key, add in yarn:
            value = params.get(key, params.get("attn_factor")) if key == "attention_factor" else params.get(key)
            if value is not None:
                add(value)
    elif rope_type in ("su", "longrope"):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    if "mrope_section" in rope:
        writer.add_rope_dimension_sections((list(rope["mrope_section"]) + [0, 0, 0, 0])[:4])
    if (theta := params.get("rope_theta")) is not None:
        writer.add_rope_freq_base(theta)
    if (local_theta := rope.get("sliding_attention", {}).get("rope_theta")) is not None:
        writer.add_rope_freq_base_swa(local_theta)
    if (eps := find(config, ("rms_norm_eps", "norm_eps"))) is not None:
        writer.add_layer_norm_rms_eps(eps)
    if (eps := find(config, ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"))) is not None:
        writer.add_layer_norm_eps(eps)
    _add_expert_keys(writer, config)
    if (head_dim := config.get("head_dim")) is not None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_file_type(file_type)


def _add_expert_keys(writer, config: Config) -> None:
    """A mixture of experts' counts, groups and gating function, as the converter's common rules write them."""
    import gguf

    if (experts := find(config, ("num_local_experts", "num_experts", "n_routed_experts"))) is not None:
        writer.add_expert_count(experts)
    if (used := find(config, ("num_experts_per_tok", "num_experts_per_token", "top_k_experts"))) is not None:
        writer.add_expert_used_count(used)
    if (groups := config.get("n_group")) is not None:
        writer.add_expert_group_count(groups)
    if (groups_used := config.get("topk_group")) is not None:
        writer.add_expert_group_used_count(groups_used)
    score = find(config, ("score_function", "scoring_func", "score_func", "moe_router_activation",
                          "moe_router_activation_func", "expert_selection_fn"))
    if score is not None:
        gating = {"sigmoid": gguf.ExpertGatingFuncType.SIGMOID, "softmax": gguf.ExpertGatingFuncType.SOFTMAX}
        if score not in gating:
            raise Unsupported(f"the expert gating function {score!r} is not served")
        writer.add_expert_gating_func(gating[score])
