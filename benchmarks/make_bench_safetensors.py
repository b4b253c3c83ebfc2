"""Write the safetensors counterpart of scripts/make_realistic_gguf.py, for the second ``ckptfs bench`` run.

The same model shapes (Gemma-3 270M: hidden 640, FFN 2048, 262144 x 640 embedding, tied output; 26 layers by
default) under Hugging Face tensor names, stored the way published checkpoints are: BF16 matrices (the
attention projections F16, so both half-precision kinds are read), F32 norms. A header with
``__metadata__`` {"format": "pt"}. Tensors are laid out as the reference writer does (by decreasing element
size, then name), so every tensor is aligned to its element size. Values are normal(0, 0.02) weights and
1 +- 0.1 norms; deterministic for a given --seed. Writing streams tensor by tensor (~600 MB, ~10 s).

Usage: python -m benchmarks make_bench_safetensors [OUT.safetensors] [--layers 26]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time

import numpy as np

DEFAULT_OUT = "/tmp/ckptfs-bench/realistic.safetensors"
HIDDEN, FFN, Q_DIM, KV_DIM, HEAD_DIM, VOCAB = 640, 2048, 1024, 256, 256, 262144
ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}


def model_tensors(layers: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of every tensor, Hugging Face naming (Gemma3ForCausalLM)."""
    tensors: list[tuple[str, tuple[int, ...], str]] = [("model.embed_tokens.weight", (VOCAB, HIDDEN), "BF16"),
                                                       ("model.norm.weight", (HIDDEN,), "F32")]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors += [
            (p + "input_layernorm.weight", (HIDDEN,), "F32"),
            (p + "self_attn.q_proj.weight", (Q_DIM, HIDDEN), "F16"),
            (p + "self_attn.k_proj.weight", (KV_DIM, HIDDEN), "F16"),
            (p + "self_attn.v_proj.weight", (KV_DIM, HIDDEN), "F16"),
            (p + "self_attn.o_proj.weight", (HIDDEN, Q_DIM), "F16"),
            (p + "self_attn.q_norm.weight", (HEAD_DIM,), "F32"),
            (p + "self_attn.k_norm.weight", (HEAD_DIM,), "F32"),
            (p + "post_attention_layernorm.weight", (HIDDEN,), "F32"),
            (p + "pre_feedforward_layernorm.weight", (HIDDEN,), "F32"),
            (p + "mlp.gate_proj.weight", (FFN, HIDDEN), "BF16"),
            (p + "mlp.up_proj.weight", (FFN, HIDDEN), "BF16"),
            (p + "mlp.down_proj.weight", (HIDDEN, FFN), "BF16"),
            (p + "post_feedforward_layernorm.weight", (HIDDEN,), "F32"),
        ]
    return tensors


def tensor_bytes(shape: tuple[int, ...], dtype: str, is_norm: bool, rng: np.random.Generator) -> bytes:
    n = int(np.prod(shape))
    values = rng.standard_normal(n, dtype=np.float32)
    values *= np.float32(0.1 if is_norm else 0.02)
    if is_norm:
        values += np.float32(1.0)
    if dtype == "F32":
        return values.astype("<f4").tobytes()
    if dtype == "F16":
        return values.astype("<f2").tobytes()
    return (values.view("<u4") >> 16).astype("<u2").tobytes()  # BF16: the top half of each float32


def header_bytes(tensors: list[tuple[str, tuple[int, ...], str]], itemsize: dict[str, int]) -> tuple[bytes, int]:
    """The 8-byte length and the JSON header of ``tensors`` (name, shape, dtype) laid out in the given order
    (the reference writer's: decreasing element size, then name), padded to 8 bytes; and the data size."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    position = 0
    for name, shape, dtype in tensors:
        size = int(np.prod(shape, dtype=np.int64)) * itemsize[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [position, position + size]}
        position += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, position


def write(out: str, layers: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    tensors = sorted(model_tensors(layers), key=lambda t: (-ITEMSIZE[t[2]], t[0]))
    head, _ = header_bytes(tensors, ITEMSIZE)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "wb") as f:
        f.write(head)
        for name, shape, dtype in tensors:
            f.write(tensor_bytes(shape, dtype, name.endswith("norm.weight"), rng))
    return os.path.getsize(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=DEFAULT_OUT)
    parser.add_argument("--layers", type=int, default=26)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    size = write(args.out, args.layers, args.seed)
    print(f"{args.out}: {size / 2**20:.0f} MiB, {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0
