"""Write a safetensors file with a DeepSeek-V3-shaped header (about 94,000 tensors) and sparse data.

What it tests is scale in the tensor count, not in bytes: opening, indexing and listing ~94k tensors (about
282k names in a mount). The layout follows DeepSeek-V3's published checkpoint: 62 blocks (the last is the
multi-token-prediction block), the first 3 dense, the rest mixture-of-experts with 256 routed experts and
one shared expert; FP8 (F8_E4M3) projection weights each with an F32 ``weight_scale_inv`` of 128x128 tiles,
BF16 norms and embeddings, F32 router biases. Shapes are the real ones; the data section is a sparse hole
(``truncate``), so the file takes a few MB of disk whatever its apparent size. Tensors are laid out by the
reference writer's order (decreasing element size, then name).

Usage: python -m benchmarks make_scale_safetensors [OUT.safetensors] [--experts 256]
"""

from __future__ import annotations

import argparse
import os

from benchmarks.make_bench_safetensors import header_bytes

HIDDEN, MOE_FFN, DENSE_FFN, VOCAB = 7168, 2048, 18432, 129280
Q_LORA, KV_LORA, ROPE, NOPE, V_HEAD, HEADS = 1536, 512, 64, 128, 128, 128
ITEMSIZE = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
DEFAULT_OUT = "/tmp/ckptfs-bench/scale.safetensors"


def _fp8(name: str, rows: int, cols: int) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(f"{name}.weight", "F8_E4M3", (rows, cols)),
            (f"{name}.weight_scale_inv", "F32", (-(-rows // 128), -(-cols // 128)))]


def _mlp(prefix: str, ffn: int) -> list:
    return (_fp8(f"{prefix}.gate_proj", ffn, HIDDEN) + _fp8(f"{prefix}.up_proj", ffn, HIDDEN)
            + _fp8(f"{prefix}.down_proj", HIDDEN, ffn))


def model_tensors(experts: int = 256, blocks: int = 62, dense: int = 3) -> list[tuple[str, str, tuple[int, ...]]]:
    out = [("model.embed_tokens.weight", "BF16", (VOCAB, HIDDEN)), ("model.norm.weight", "BF16", (HIDDEN,)),
           ("lm_head.weight", "BF16", (VOCAB, HIDDEN))]
    for i in range(blocks):
        p = f"model.layers.{i}"
        out += [(f"{p}.input_layernorm.weight", "BF16", (HIDDEN,)),
                (f"{p}.post_attention_layernorm.weight", "BF16", (HIDDEN,)),
                (f"{p}.self_attn.q_a_layernorm.weight", "BF16", (Q_LORA,)),
                (f"{p}.self_attn.kv_a_layernorm.weight", "BF16", (KV_LORA,))]
        out += _fp8(f"{p}.self_attn.q_a_proj", Q_LORA, HIDDEN)
        out += _fp8(f"{p}.self_attn.q_b_proj", HEADS * (NOPE + ROPE), Q_LORA)
        out += _fp8(f"{p}.self_attn.kv_a_proj_with_mqa", KV_LORA + ROPE, HIDDEN)
        out += _fp8(f"{p}.self_attn.kv_b_proj", HEADS * (NOPE + V_HEAD), KV_LORA)
        out += _fp8(f"{p}.self_attn.o_proj", HIDDEN, HEADS * V_HEAD)
        if i < dense:
            out += _mlp(f"{p}.mlp", DENSE_FFN)
            continue
        out += [(f"{p}.mlp.gate.weight", "BF16", (experts, HIDDEN)),
                (f"{p}.mlp.gate.e_score_correction_bias", "F32", (experts,))]
        out += _mlp(f"{p}.mlp.shared_experts", MOE_FFN)
        for e in range(experts):
            out += _mlp(f"{p}.mlp.experts.{e}", MOE_FFN)
        if i == blocks - 1:  # the multi-token-prediction block's own parts
            out += [(f"{p}.enorm.weight", "BF16", (HIDDEN,)), (f"{p}.hnorm.weight", "BF16", (HIDDEN,)),
                    (f"{p}.eh_proj.weight", "BF16", (HIDDEN, 2 * HIDDEN)),
                    (f"{p}.shared_head.norm.weight", "BF16", (HIDDEN,)),
                    (f"{p}.shared_head.head.weight", "BF16", (VOCAB, HIDDEN))]
    return out


def write(path: str, tensors: list[tuple[str, str, tuple[int, ...]]]) -> int:
    """Header as the reference writer lays it out, then a sparse data section; returns the tensor count."""
    order = sorted(((name, shape, dtype) for name, dtype, shape in tensors), key=lambda t: (-ITEMSIZE[t[2]], t[0]))
    head, data_size = header_bytes(order, ITEMSIZE)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + data_size)
    return len(order)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=DEFAULT_OUT)
    parser.add_argument("--experts", type=int, default=256)
    args = parser.parse_args(argv)
    count = write(args.out, model_tensors(args.experts))
    print(f"{args.out}: {count} tensors, {os.path.getsize(args.out) / 1e9:.0f} GB apparent, sparse")
    return 0
