"""The hyperparameter keys each architecture writes past (or, for phi3, instead of) the common text-model
ones, by the rules of the converter's class for it; every writer gets ``(GGUFWriter, config, folder)``."""

from __future__ import annotations

from pathlib import Path

from ckptfs.ggufview import Config, Unsupported
from ckptfs.ggufview.files import pooling_config
from ckptfs.ggufview.generated import longrope_attention_factor
from ckptfs.ggufview.hparams import block_count, find, rope_parameters


def llama_keys(writer, config: Config, folder: Path) -> None:
    writer.add_vocab_size(config["vocab_size"])
    rope_dim = config.get("head_dim")
    if rope_dim is None:
        rope_dim = config["hidden_size"] // config["num_attention_heads"]
    writer.add_rope_dimension_count(rope_dim)


def pooling_keys(writer, config: Config, folder: Path) -> None:
    """The pooling of a sentence-transformers folder (``modules.json``'s Pooling module), and of a
    classification head's ``classifier_pooling``."""
    import gguf

    modes = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS, "lasttoken": gguf.PoolingType.LAST}
    pooling = pooling_config(folder)
    if pooling is not None:
        flags = (("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls"),
                 ("pooling_mode_lasttoken", "lasttoken"))
        mode = next((mode for key, mode in flags if pooling.get(key)), pooling.get("pooling_mode"))
        if mode not in modes:
            raise Unsupported("only mean, CLS and last-token pooling are served")
        writer.add_pooling_type(modes[mode])
    if (classifier := config.get("classifier_pooling")) is not None:
        if classifier not in ("cls", "mean"):
            raise Unsupported(f"classifier_pooling {classifier!r} is not served")
        writer.add_classifier_pooling_type(modes[classifier])


def gemma3_keys(writer, config: Config, folder: Path) -> None:
    """Gemma 3's defaults for keys its configs may leave out, the global layers' rope base, the final
    logit soft-capping and the sliding window (over the common keys of the same names, as the converter
    writes them twice: gguf-py's line about each goes to the mount's debug log, ``liblog``)."""
    writer.add_context_length(config.get("max_position_embeddings", 131072))
    writer.add_head_count(config.get("num_attention_heads", 8))
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
    writer.add_key_length(config.get("head_dim", 256))
    writer.add_value_length(config.get("head_dim", 256))
    rope = rope_parameters(config)
    writer.add_rope_freq_base(rope.get("full_attention", rope).get("rope_theta", 1_000_000.0))
    if config.get("attn_logit_softcapping") is not None:
        raise Unsupported("a Gemma 3 config with attn_logit_softcapping is not served")
    if softcap := config.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(softcap)
    if config.get("sliding_window_pattern") != 1:
        writer.add_sliding_window(config["sliding_window"])
    writer.add_head_count_kv(config.get("num_key_value_heads", 4))


def phi3_keys(writer, config: Config, folder: Path) -> None:
    """Every phi3 key (the converter's phi3 class writes its own set, not the common one)."""
    rope = rope_parameters(config)
    n_embd = find(config, ("hidden_size", "n_embd"))
    n_head = find(config, ("num_attention_heads", "n_head"))
    writer.add_context_length(find(config, ("n_positions", "max_position_embeddings")))
    writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(block_count(config))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(find(config, ("num_key_value_heads", "n_head_kv")))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * n_embd) // n_head)
    writer.add_rope_freq_base(rope.get("full_attention", rope)["rope_theta"])
    writer.add_sliding_window(config.get("sliding_window") or 0)
    if (attention_factor := longrope_attention_factor(config)) is not None:
        writer.add_rope_scaling_attn_factors(attention_factor)


def bert_keys(writer, config: Config, folder: Path) -> None:
    """Bidirectional attention and the sentence-transformers pooling."""
    writer.add_causal_attention(False)
    pooling_keys(writer, config, folder)


def classifier_labels(config: Config) -> list | None:
    """A sequence classifier's labels (None for transformers' two placeholder labels)."""
    labels = config.get("id2label")
    if not labels:
        return None
    if len(labels) == 2 and labels.get(0, labels.get("0")) == "LABEL_0":
        return None
    return labels


def qwen3_keys(writer, config: Config, folder: Path) -> None:
    """Pooling as qwen2; a Qwen3 reranker (named so by its folder, its README or its config), which the
    converter turns into a classifier, is refused."""
    readme = folder / "README.md"
    text = readme.read_text(encoding="utf-8", errors="replace").lower() if readme.is_file() else ""
    hints = [folder.name, config.get("_name_or_path", ""), config.get("model_type", ""),
             *(config.get("architectures") or [])[:1]]
    hints = [str(hint).lower() for hint in hints if hint]
    if ("# qwen3-reranker" in text or "# qwen3-vl-reranker" in text
            or any("qwen3-reranker" in hint or "qwen3-vl-reranker" in hint for hint in hints)):
        raise Unsupported("a Qwen3 reranker is not served yet")
    pooling_keys(writer, config, folder)
