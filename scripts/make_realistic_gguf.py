#!/usr/bin/env python3
"""Write a GGUF shaped like a real small model, for ``ckptfs bench`` (and benchmarks/make_bench_safetensors.py).

Real GGUFs are not made of a few big tensors: a 262,144-entry tokenizer vocabulary (tokens, scores, token
types) dominates the header, and a quantized file mixes types because K-quants need rows that are whole
256-element blocks. This file copies the shapes of Gemma-3 270M (hidden 640, FFN 2048, 4 query heads and 1
KV head of 256, a 262144 x 640 embedding) and the type choice llama.cpp's Q4_K_M makes for them: rows of
640 values cannot be K-quants, so those matrices fall back to Q5_0 / Q8_0, while the 1024- and 2048-long
rows (attn_output, ffn_down) get Q4_K / Q6_K, and every norm is F32. The layer count (default 26) and an
untied ``output.weight`` bring the file to about 0.5 GB, large enough that streaming it takes seconds.

The tensor bytes are random but valid: random bytes everywhere, then every fp16 scale overwritten with a
finite value of realistic size (quantizing with gguf-py takes minutes and it cannot make K-quants; the read
path's speed does not depend on the weights). Deterministic for a given --seed. Generates in ~10 s.

``--shapes SKELETON.json`` writes a real file's layout instead (scripts/real-shapes/ holds the header
skeletons of two real Q4_K_M GGUFs): exactly its tensor names, storage types and shapes (``--scale`` multiplies
every dim, row lengths staying whole blocks), its metadata keys with their scalar values, and its arrays
(vocabulary, scores, token types, merges) at the skeleton's lengths. Real files owe their costs to this mix:
109 of Gemma 3 270M's 236 tensors are F32 norms of a few KiB, where per-file costs dominate a stream.
:func:`skeleton_tensors` is the one reader of skeletons (benchmarks/torch.py uses it too).

Usage: python scripts/make_realistic_gguf.py [OUT.gguf] [--layers 26] [--vocab 262144] [--no-output]
                                            [--split-max-tensors N]
       python scripts/make_realistic_gguf.py [OUT.gguf] --shapes scripts/real-shapes/gemma3-270m-q4_k_m.json
                                            [--scale 1.0] [--max-dim N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - a script dependency, not the package's
    sys.exit("make_realistic_gguf.py needs gguf-py: pip install gguf (or pip install 'ckptfs[bench]')")

DEFAULT_OUT = "/tmp/ckptfs-bench/realistic.gguf"
HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM = 640, 2048, 4, 1, 256

# (elements per block, bytes per block, byte offsets of fp16 scale fields) — docs/block-formats.md.
LAYOUTS = {
    "Q8_0": (32, 34, (0,)),
    "Q5_0": (32, 22, (0,)),
    "Q4_K": (256, 144, (0, 2)),
    "Q6_K": (256, 210, (208,)),
}


def random_blocks(storage_type: str, n_elements: int, rng: np.random.Generator) -> np.ndarray:
    """Valid block bytes ``u8[n_blocks, block_bytes]``: random payload, finite fp16 scales of ~1e-3."""
    block_elements, block_bytes, scale_offsets = LAYOUTS[storage_type]
    n_blocks = n_elements // block_elements
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for offset in scale_offsets:
        scale = (rng.uniform(2e-4, 4e-3, n_blocks) * rng.choice([-1.0, 1.0], n_blocks)).astype("<f2")
        raw[:, offset:offset + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return raw


def layer_tensors(i: int) -> list[tuple[str, tuple[int, int] | tuple[int], str]]:
    """One Gemma-3 block: (name, numpy shape (rows, cols), storage type) as Q4_K_M assigns them."""
    p = f"blk.{i}."
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    return [
        (p + "attn_norm.weight", (HIDDEN,), "F32"),
        (p + "attn_q.weight", (q, HIDDEN), "Q5_0"),
        (p + "attn_k.weight", (kv, HIDDEN), "Q5_0"),
        (p + "attn_v.weight", (kv, HIDDEN), "Q8_0"),
        (p + "attn_q_norm.weight", (HEAD_DIM,), "F32"),
        (p + "attn_k_norm.weight", (HEAD_DIM,), "F32"),
        (p + "attn_output.weight", (HIDDEN, q), "Q4_K"),
        (p + "post_attention_norm.weight", (HIDDEN,), "F32"),
        (p + "ffn_norm.weight", (HIDDEN,), "F32"),
        (p + "ffn_gate.weight", (FFN, HIDDEN), "Q5_0"),
        (p + "ffn_up.weight", (FFN, HIDDEN), "Q5_0"),
        (p + "ffn_down.weight", (HIDDEN, FFN), "Q6_K" if i % 2 == 0 else "Q4_K"),
        (p + "post_ffw_norm.weight", (HIDDEN,), "F32"),
    ]


def model_tensors(layers: int, vocab: int, untied_output: bool) -> list[tuple[str, tuple[int, ...], str]]:
    tensors: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (vocab, HIDDEN), "Q8_0")]
    for i in range(layers):
        tensors += layer_tensors(i)
    tensors.append(("output_norm.weight", (HIDDEN,), "F32"))
    if untied_output:
        tensors.append(("output.weight", (vocab, HIDDEN), "Q8_0"))
    return tensors


def vocabulary(n: int, rng: np.random.Generator) -> tuple[list[str], np.ndarray, np.ndarray]:
    """A SentencePiece-like vocabulary: control tokens, 256 byte tokens, then word pieces of 1-12 letters."""
    control = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]"]
    tokens = control + [f"<0x{b:02X}>" for b in range(256)]
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzetaoinshrdlu", np.uint8)
    lengths = rng.integers(1, 13, n)
    codes = letters[rng.integers(0, len(letters), int(lengths.sum()))].tobytes().decode()
    pos, seen = 0, set(tokens)
    for length in lengths:
        if len(tokens) >= n:
            break
        piece = ("\u2581" if length % 3 else "") + codes[pos:pos + length]
        pos += length
        if piece in seen:
            piece = f"{piece}{len(tokens)}"
        seen.add(piece)
        tokens.append(piece)
    while len(tokens) < n:
        tokens.append(f"<unused{len(tokens)}>")
    scores = -np.arange(n, dtype=np.float32)
    types = np.full(n, 1, np.int32)  # NORMAL
    types[:len(control)] = 3  # CONTROL
    types[len(control):len(control) + 256] = 6  # BYTE
    return tokens, scores, types


def write(out: str, layers: int, vocab: int, untied_output: bool, seed: int, split_max_tensors: int = 0) -> int:
    """The default model; with ``split_max_tensors`` a split set ``OUT-0000N-of-0000M.gguf`` (gguf-py's
    splitting writer) holding the same keys and tensor bytes as the single file of the same seed."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    writer = gguf.GGUFWriter(out, "gemma3", split_max_tensors=split_max_tensors)
    writer.add_name("ckptfs realistic bench model")
    writer.add_context_length(32768)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(15)  # MOSTLY_Q4_K_M
    tokens, scores, types = vocabulary(vocab, rng)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores.tolist())  # the writer wants sequences, not arrays
    writer.add_token_types(types.tolist())
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_chat_template("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
                             "{{ m['content'] }}<end_of_turn>\n{% endfor %}<start_of_turn>model\n")
    add_random_tensors(writer, model_tensors(layers, vocab, untied_output), rng)
    return finish(writer, out)


def add_random_tensors(writer: gguf.GGUFWriter, tensors, rng: np.random.Generator) -> None:
    """Each (name, numpy shape, storage type): F32 values near 1 (norms), else random valid blocks."""
    for name, shape, storage_type in tensors:
        n = int(np.prod(shape))
        if storage_type == "F32":
            writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).reshape(shape))
        elif storage_type in LAYOUTS:
            stored = random_blocks(storage_type, n, rng).reshape(*shape[:-1], -1)
            writer.add_tensor(name, stored, raw_dtype=gguf.GGMLQuantizationType[storage_type])
        else:
            raise SystemExit(f"{name}: no random-block layout for {storage_type}")


def finish(writer: gguf.GGUFWriter, out: str) -> int:
    """Write the file (or split set) and return its size in bytes (all shards of a set)."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if os.path.exists(out):
        return os.path.getsize(out)
    stem = out[:-len(".gguf")] if out.endswith(".gguf") else out
    folder = os.path.dirname(os.path.abspath(out))
    return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)
               if re.fullmatch(re.escape(os.path.basename(stem)) + r"-\d{5}-of-\d{5}\.gguf", name))


# ------------------------------------------------------------------------------- a real file's skeleton


def load_skeleton(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def skeleton_tensors(path: str, scale: float = 1.0,
                     max_dim: int | None = None) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, storage type) of every tensor of a header skeleton, in file order, each dim times
    ``scale`` and at most ``max_dim``; a row (gguf_dims[0]) stays a whole number of blocks of its type."""
    tensors = []
    for t in load_skeleton(path)["tensors"]:
        block = LAYOUTS[t["type"]][0] if t["type"] in LAYOUTS else 1
        dims = []
        for i, n in enumerate(t["gguf_dims"]):
            m = max(1, round(n * scale))
            if max_dim is not None:
                m = min(max_dim, m)
            dims.append(max(block, m // block * block) if i == 0 else m)
        tensors.append((t["name"], tuple(reversed(dims)), t["type"]))
    return tensors


_ARRAY = re.compile(r"<array of (\d+) ")
_STRING = re.compile(r"<string of (\d+) bytes>")


def _merges(n: int, tokens: list[str]) -> list[str]:
    """BPE merge rules "left right" of the vocabulary's pieces (content does not matter, lengths do)."""
    return [f"{tokens[i % len(tokens)]} {tokens[(7 * i + 1) % len(tokens)]}" for i in range(n)]


def add_skeleton_metadata(writer: gguf.GGUFWriter, metadata: dict, rng: np.random.Generator) -> int:
    """The skeleton's keys with its scalar values; arrays and long strings (given there as lengths) made up
    at those lengths. Numeric arrays (scores, token types) get the vocabulary's length. The vocabulary size."""
    tokens_desc = str(metadata.get("tokenizer.ggml.tokens", ""))
    found = _ARRAY.match(tokens_desc)
    vocab = int(found.group(1)) if found else 0
    tokens, scores, types = vocabulary(vocab, rng) if vocab else ([], np.zeros(0, np.float32),
                                                                   np.zeros(0, np.int32))
    value = gguf.GGUFValueType
    for key, v in metadata.items():
        if key == "general.architecture":
            continue  # written by GGUFWriter itself
        if isinstance(v, bool):
            writer.add_key_value(key, v, value.BOOL)
        elif isinstance(v, int):
            writer.add_key_value(key, v, value.UINT32 if 0 <= v < 2**32 else value.INT64)
        elif isinstance(v, float):
            writer.add_key_value(key, v, value.FLOAT32)
        elif key == "tokenizer.ggml.tokens":
            writer.add_token_list(tokens)
        elif key == "tokenizer.ggml.scores":
            writer.add_token_scores(scores.tolist())
        elif key == "tokenizer.ggml.token_type":
            writer.add_token_types(types.tolist())
        elif v == "<numeric array>":
            writer.add_array(key, np.zeros(vocab, np.float32).tolist())
        elif _ARRAY.match(v):
            n = int(_ARRAY.match(v).group(1))
            strings = _merges(n, tokens) if key.endswith("merges") and tokens else [f"tag{i}" for i in range(n)]
            writer.add_array(key, strings)
        elif _STRING.match(v):
            n = int(_STRING.match(v).group(1))
            writer.add_string(key, ("{{ bos_token }}{% for m in messages %}" * (n // 38 + 1))[:n])
        else:
            writer.add_string(key, v)
    return vocab


def write_skeleton(out: str, skeleton: str, scale: float = 1.0, max_dim: int | None = None, seed: int = 0,
                   with_metadata: bool = True, split_max_tensors: int = 0) -> int:
    """A GGUF with the skeleton's tensors (see :func:`skeleton_tensors`), random valid data, and (unless
    ``with_metadata`` is False) its metadata keys and vocabulary; a split set as :func:`write` makes it."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    meta = load_skeleton(skeleton).get("metadata", {})
    writer = gguf.GGUFWriter(out, str(meta.get("general.architecture", "bench")), split_max_tensors=split_max_tensors)
    if with_metadata:
        add_skeleton_metadata(writer, meta, rng)
    add_random_tensors(writer, skeleton_tensors(skeleton, scale, max_dim), rng)
    return finish(writer, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=DEFAULT_OUT)
    parser.add_argument("--layers", type=int, default=26)
    parser.add_argument("--vocab", type=int, default=262144)
    parser.add_argument("--no-output", action="store_true", help="tie the output to the embedding")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shapes", metavar="SKELETON.json", help="a real GGUF's header skeleton to copy")
    parser.add_argument("--scale", type=float, default=1.0, help="with --shapes: multiply every dim")
    parser.add_argument("--max-dim", type=int, help="with --shapes: cap every dim")
    parser.add_argument("--split-max-tensors", type=int, default=0, metavar="N",
                        help="write a split set OUT-0000K-of-0000M.gguf of at most N tensors a shard")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.shapes:
        size = write_skeleton(args.out, args.shapes, args.scale, args.max_dim, args.seed,
                              split_max_tensors=args.split_max_tensors)
    else:
        size = write(args.out, args.layers, args.vocab, not args.no_output, args.seed, args.split_max_tensors)
    print(f"{args.out}: {size / 2**20:.0f} MiB, {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
