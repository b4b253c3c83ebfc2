"""A tiny gpt-oss folder in the release's MXFP4 layout, made at test time.

The weights come from transformers' ``GptOssForCausalLM`` (random, large enough that greedy text is not one
repeated token); the MoE projections are then quantized to MXFP4 with numpy + ml_dtypes and stored as the
release stores them: ``PROJ_blocks`` U8 ``[E, out, in / 32, 16]`` (element ``2j`` of a 32-value block in the
low nibble of byte ``j``), ``PROJ_scales`` U8 ``[E, out, in / 32]`` (E8M0 exponents), ``PROJ_bias`` BF16;
everything else BF16. ``config.json`` is written in the release's form (``rope_scaling`` and ``rope_theta``
at the top, ``quantization_config`` ``mxfp4``), the weights in two shards with an index.

The tokenizer is o200k-shaped: a byte-level BPE trained with ``tokenizers`` on a few sentences, split by
o200k's regex (the ``Split`` then ``ByteLevel`` pre-tokenizer of the release's ``tokenizer.json``), the
harmony special tokens after the trained vocabulary (``<|startoftext|>`` the BOS, ``<|return|>`` the EOS,
``<|endoftext|>`` the padding, reserved tokens between), a chat template in ``chat_template.jinja``. The
converter names the release's pre-tokenizer ``gpt-4o`` by its hash; a tokenizer trained here has a hash of its
own, so the reference run registers it under ``gpt-4o`` (what the update script does for a model it adds).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

O200K_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
               r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
               r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
#: The harmony special tokens in id order (the release's ids 199998 to 200012, then its reserved ones).
HARMONY = ("<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>", "<|reserved_200001|>", "<|return|>",
           "<|constrain|>", "<|reserved_200004|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>",
           "<|reserved_200009|>", "<|reserved_200010|>", "<|reserved_200011|>", "<|call|>", "<|reserved_200013|>")
PRE = "gpt-4o"
CHAT_TEMPLATE = ("{%- for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>"
                 "{%- endfor %}{%- if add_generation_prompt %}<|start|>assistant{%- endif %}")
SENTENCES = ["Hello my name is Llama and I live in a small house by the sea.",
             "The quick brown fox jumps over the lazy dog 12345.",
             "A model is released as safetensors; llama.cpp wants a GGUF file.",
             "OpenAI's open-weight models use the o200k tokenizer, don't they?"]


def make_o200k_tokenizer(folder: Path, vocab_size: int = 400):
    """The trained vocabulary, then the harmony tokens (special, not normalized) after it."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_SPLIT), "isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 40, trainer)
    tok.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in HARMONY])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=HARMONY[0], eos_token="<|return|>",
                                   pad_token="<|endoftext|>")
    fast.save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return fast


def mxfp4_quantize(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[E, in, out]`` float32 (transformers' layout) -> the release's ``blocks`` ``[E, out, in/32, 16]`` and
    ``scales`` ``[E, out, in/32]``: per 32 inputs of an output row the smallest power of two that fits the
    block's largest magnitude into E2M1's 6, the codes rounded to nearest by ml_dtypes."""
    import ml_dtypes

    rows = np.ascontiguousarray(dense.transpose(0, 2, 1), np.float32)
    experts, out, in_features = rows.shape
    groups = rows.reshape(experts, out, in_features // 32, 32)
    largest = np.abs(groups).max(axis=-1)
    exponent = np.ceil(np.log2(np.maximum(largest, 2.0 ** -100) / 6.0)).astype(np.int32)
    codes = (groups / np.ldexp(1.0, exponent)[..., None]).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (exponent + 127).astype(np.uint8)


def gpt_oss_config(*, vocab: int, hidden: int, heads: int, kv_heads: int, head_dim: int, layers: int,
                   experts: int, top_k: int, intermediate: int) -> dict:
    """config.json in the release's form (openai/gpt-oss-20b's keys, tiny sizes)."""
    return {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": vocab - len(HARMONY) + HARMONY.index("<|return|>"), "experts_per_token": top_k,
        "head_dim": head_dim, "hidden_act": "silu", "hidden_size": hidden, "initial_context_length": 256,
        "initializer_range": 0.02, "intermediate_size": intermediate,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "max_position_embeddings": 8192, "model_type": "gpt_oss", "num_attention_heads": heads,
        "num_experts_per_tok": top_k, "num_hidden_layers": layers, "num_key_value_heads": kv_heads,
        "num_local_experts": experts, "output_router_logits": False,
        "pad_token_id": vocab - len(HARMONY) + HARMONY.index("<|endoftext|>"),
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"],
                                "quant_method": "mxfp4"},
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 256,
                         "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 16, "swiglu_limit": 7.0,
        "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": vocab}


def make_gpt_oss(folder: Path, *, seed: int = 0, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                 head_dim: int = 16, layers: int = 2, experts: int = 4, top_k: int = 2,
                 intermediate: int = 96) -> Path:
    """The folder (see the module docstring): ``model-00001-of-00002.safetensors`` holds the embeddings and
    layer 0, the second shard the rest."""
    import torch
    from safetensors.torch import save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = make_o200k_tokenizer(folder)
    config = gpt_oss_config(vocab=len(tokenizer), hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                            layers=layers, experts=experts, top_k=top_k, intermediate=intermediate)
    torch.manual_seed(seed)
    model_config = {key: value for key, value in config.items() if key != "quantization_config"}
    model = GptOssForCausalLM(GptOssConfig(**model_config))
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(0.0, 0.5 if param.ndim > 1 else 0.1)
            if name.endswith("norm.weight"):
                param.add_(1.0)
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                blocks, scales = mxfp4_quantize(param.float().numpy())
                tensors[f"{name}_blocks"] = torch.from_numpy(blocks)
                tensors[f"{name}_scales"] = torch.from_numpy(scales)
            else:
                tensors[name] = param.to(torch.bfloat16).contiguous()
    first = {name for name in tensors if ".layers." not in name or ".layers.0." in name}
    shards = {"model-00001-of-00002.safetensors": sorted(first),
              "model-00002-of-00002.safetensors": sorted(set(tensors) - first)}
    for shard, names in shards.items():
        save_file({name: tensors[name] for name in names}, str(folder / shard), metadata={"format": "pt"})
    weight_map = {name: shard for shard, names in shards.items() for name in names}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    ids = {text: len(tokenizer) - len(HARMONY) + i for i, text in enumerate(HARMONY)}
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<|startoftext|>"], "do_sample": True,
         "eos_token_id": [ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]],
         "pad_token_id": ids["<|endoftext|>"], "transformers_version": "4.55.0.dev0"}))
    return folder
