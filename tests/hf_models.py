"""Small generated GGUF models of real architectures (llama, qwen2, gemma3) for the hf/ tests.

Weights are random (tiny sizes, several storage types); the tokenizer is trained at test time on a generated
corpus — sentencepiece for llama and gemma3, a byte-level BPE with the ``tokenizers`` library for qwen2 — and
written into the GGUF metadata the way llama.cpp's converter writes it (token list, scores, token types,
merges, special ids, add_bos/add_eos). Everything is written by gguf-py's writer (``fixtures.write_gguf``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from fixtures import quantized, write_gguf
from gguf import GGUFValueType as VT

# llama.cpp's token types (gguf TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_WORDS = ("the model reads a checkpoint and maps every tensor lazily while the kernel asks for pages "
          "quantized blocks decode into floats numbers like 3.14159 or 1e-6 and 42 appear too").split()
_UNICODE = ["naïve café", "Grüße aus Köln", "日本語のテキスト", "中文分词测试", "Привет, мир", "😀🚀✨",
            "مرحبا بالعالم", "ελληνικά", "한국어 문장"]
_CODE = ["def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
         "if __name__ == '__main__':\n\tmain()", "{\"key\": [1, 2, 3], \"ok\": true}", "SELECT * FROM t WHERE id=7;"]
_SPACES = ["two  spaces", "tab\there", "trailing   ", "   leading", "line\nbreak\r\nwindows", "\n\n\n"]


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Varied text: words, numbers, Unicode in several scripts, code and odd whitespace."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            lines.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 14))))
        elif kind == 1:
            lines.append(rng.choice(_UNICODE) + " " + " ".join(rng.choice(_WORDS) for _ in range(3)))
        elif kind == 2:
            lines.append(rng.choice(_CODE))
        else:
            lines.append(rng.choice(_SPACES) + rng.choice(_WORDS))
    return lines


def probe_texts(specials: list[str]) -> list[str]:
    """Texts the tokenizers are compared on: unseen mixes of everything, and special tokens inside text."""
    texts = ["", " ", "Hello world", "  two leading spaces", "tabs\tand\nnewlines\r\n", "x" * 40,
             "naïve café 日本語 😀 مرحبا", "def g(y):\n\treturn {'a': y}\n", "1234567890 3.14 -2e-5"]
    texts += [f"before {s} after" for s in specials] + ["".join(specials)]
    return texts + corpus(40, seed=7)


@dataclass
class Vocab:
    """A tokenizer as GGUF metadata, and its special tokens."""

    metadata: dict[str, Any]
    specials: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.metadata["tokenizer.ggml.tokens"][0])


def _strings(values: list[str]) -> tuple:
    return (values, VT.ARRAY, VT.STRING)


def sentencepiece_vocab(folder: Path, *, gemma: bool, vocab_size: int = 640) -> Vocab:
    """Train a sentencepiece BPE model; its vocabulary as llama.cpp's ``_set_vocab_sentencepiece`` writes it."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    text = folder / "corpus.txt"
    text.write_text("\n".join(corpus()), encoding="utf-8")
    prefix = folder / "spm"
    specials = ["<start_of_turn>", "<end_of_turn>"] if gemma else ["<|user|>", "<|end|>"]
    ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3) if gemma else dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(prefix), vocab_size=vocab_size,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                   user_defined_symbols=specials, num_threads=1, minloglevel=2, **ids)
    sp = spm.SentencePieceProcessor(model_file=str(prefix) + ".model")
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i) else
                     UNUSED if sp.is_unused(i) else BYTE if sp.is_byte(i) else
                     USER_DEFINED if tokens[-1] in specials else NORMAL)
    metadata = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": _strings(tokens),
        "tokenizer.ggml.scores": (scores, VT.ARRAY, VT.FLOAT32),
        "tokenizer.ggml.token_type": (types, VT.ARRAY, VT.INT32),
        "tokenizer.ggml.bos_token_id": (sp.bos_id(), VT.UINT32),
        "tokenizer.ggml.eos_token_id": (sp.eos_id(), VT.UINT32),
        "tokenizer.ggml.unknown_token_id": (sp.unk_id(), VT.UINT32),
        "tokenizer.ggml.add_bos_token": (True, VT.BOOL),
        "tokenizer.ggml.add_eos_token": (False, VT.BOOL),
        "tokenizer.ggml.add_space_prefix": (not gemma, VT.BOOL),
    }
    if sp.pad_id() >= 0:
        metadata["tokenizer.ggml.padding_token_id"] = (sp.pad_id(), VT.UINT32)
    return Vocab(metadata, specials)


def byte_level_vocab(vocab_size: int = 640) -> Vocab:
    """Train a byte-level BPE (as Qwen2 uses); written as llama.cpp's ``_set_vocab_gpt2`` writes it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    vocab = tok.get_vocab()
    tokens = [None] * len(vocab)
    for token, i in vocab.items():
        tokens[i] = token
    merges = [" ".join(m) if isinstance(m, list) else m for m in json.loads(tok.to_str())["model"]["merges"]]
    types = [CONTROL if t in specials else NORMAL for t in tokens]
    end = vocab["<|endoftext|>"]
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": _strings(tokens),
        "tokenizer.ggml.token_type": (types, VT.ARRAY, VT.INT32),
        "tokenizer.ggml.merges": _strings(merges),
        "tokenizer.ggml.bos_token_id": (end, VT.UINT32),
        "tokenizer.ggml.eos_token_id": (vocab["<|im_end|>"], VT.UINT32),
        "tokenizer.ggml.padding_token_id": (end, VT.UINT32),
        "tokenizer.ggml.add_bos_token": (False, VT.BOOL),
    }
    return Vocab(metadata, specials)


@dataclass(frozen=True)
class Shape:
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 256
    layers: int = 2


#: Storage types cycled over the 2-D weights (row lengths 64 and 256 fit every block size used).
WEIGHT_TYPES = ("Q8_0", "F16", "Q4_0", "BF16", "F32", "Q5_1", "Q6_K", "Q4_K")


def _weights(names_shapes: list[tuple[str, tuple[int, ...]]], rng: np.random.Generator, norm_offset: float,
             types: tuple[str, ...]) -> dict[str, tuple[np.ndarray, str]]:
    tensors = {}
    for i, (name, shape) in enumerate(names_shapes):
        if len(shape) == 1:  # norms are F32 in llama.cpp's files; Gemma's are stored as 1 + w
            tensors[name] = ((rng.standard_normal(shape) * 0.1 + norm_offset).astype(np.float32), "F32")
            continue
        kind = types[i % len(types)]
        if kind in ("Q6_K", "Q4_K") and shape[-1] % 256:
            kind = "Q8_0"
        if kind in ("F32", "F16"):
            tensors[name] = ((rng.standard_normal(shape) * 0.05).astype(np.float32 if kind == "F32" else np.float16), kind)
        elif kind == "BF16":
            tensors[name] = ((rng.standard_normal(shape) * 0.05).astype(np.float32), kind)
        else:
            tensors[name] = (quantized(kind, shape, rng), kind)
    return tensors


def _layer_shapes(arch: str, s: Shape, vocab: int, tied: bool) -> list[tuple[str, tuple[int, ...]]]:
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out = [("token_embd.weight", (vocab, s.hidden))]
    for b in range(s.layers):
        p = f"blk.{b}."
        out += [(p + "attn_norm.weight", (s.hidden,)), (p + "attn_q.weight", (q, s.hidden)),
                (p + "attn_k.weight", (kv, s.hidden)), (p + "attn_v.weight", (kv, s.hidden)),
                (p + "attn_output.weight", (s.hidden, q)), (p + "ffn_norm.weight", (s.hidden,)),
                (p + "ffn_gate.weight", (s.ffn, s.hidden)), (p + "ffn_up.weight", (s.ffn, s.hidden)),
                (p + "ffn_down.weight", (s.hidden, s.ffn))]
        if arch == "qwen2":
            out += [(p + "attn_q.bias", (q,)), (p + "attn_k.bias", (kv,)), (p + "attn_v.bias", (kv,))]
        if arch == "gemma3":
            out += [(p + "attn_q_norm.weight", (s.head_dim,)), (p + "attn_k_norm.weight", (s.head_dim,)),
                    (p + "post_attention_norm.weight", (s.hidden,)), (p + "post_ffw_norm.weight", (s.hidden,))]
    out.append(("output_norm.weight", (s.hidden,)))
    if not tied:
        out.append(("output.weight", (vocab, s.hidden)))
    return out


def _arch_metadata(arch: str, s: Shape) -> dict[str, Any]:
    u32 = lambda v: (v, VT.UINT32)  # noqa: E731
    f32 = lambda v: (v, VT.FLOAT32)  # noqa: E731
    meta = {
        f"{arch}.context_length": u32(256),
        f"{arch}.embedding_length": u32(s.hidden),
        f"{arch}.block_count": u32(s.layers),
        f"{arch}.feed_forward_length": u32(s.ffn),
        f"{arch}.attention.head_count": u32(s.heads),
        f"{arch}.attention.head_count_kv": u32(s.kv_heads),
        f"{arch}.attention.layer_norm_rms_epsilon": f32(1e-6),
        f"{arch}.rope.freq_base": f32(10000.0),
        "general.name": ("tiny " + arch, VT.STRING),
        "general.file_type": u32(7),
    }
    if arch == "llama":
        meta[f"{arch}.rope.dimension_count"] = u32(s.head_dim)
    if arch == "gemma3":
        meta[f"{arch}.attention.key_length"] = u32(s.head_dim)
        meta[f"{arch}.attention.value_length"] = u32(s.head_dim)
        meta[f"{arch}.attention.sliding_window"] = u32(8)
    return meta


def write_model(path: Path, arch: str, vocab: Vocab, *, seed: int = 0, tied: bool | None = None,
                shape: Shape = Shape(), types: tuple[str, ...] = WEIGHT_TYPES, extra: dict | None = None):
    """A GGUF of ``arch`` with random weights and ``vocab``; returns fixtures.Written."""
    rng = np.random.default_rng(seed)
    tied = arch == "gemma3" if tied is None else tied
    tensors = _weights(_layer_shapes(arch, shape, vocab.size, tied), rng, 1.0, types)
    metadata = {**_arch_metadata(arch, shape), **vocab.metadata, **(extra or {})}
    return write_gguf(path, tensors, metadata, arch=arch)


def split_copy(src: Path, folder: Path, per_shard: int) -> list[Path]:
    """The GGUF ``src`` re-written as a split set by gguf-py's splitting writer (``gguf-split``'s layout:
    shard 1 holds the metadata, every shard the split.* keys); returns the shard paths in order."""
    from gguf import GGUFReader, GGUFWriter

    reader = GGUFReader(str(src))
    folder.mkdir(parents=True, exist_ok=True)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(folder / src.name), arch, split_max_tensors=per_shard)
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = f.types[1] if len(f.types) > 1 else None
        writer.add_key_value(key, f.contents(), f.types[0], sub)
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        writer.add_tensor(t.name, np.asarray(t.data).view(np.int8), raw_shape=shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(folder.glob(f"{src.stem}-*-of-*.gguf"))
