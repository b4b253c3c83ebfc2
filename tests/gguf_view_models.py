"""Tiny Hugging Face model folders made at test time, and llama.cpp's converter run on them as the oracle
of ``gguf/model.gguf``.

A folder is a transformers config with random weights saved as safetensors, and a byte-level BPE tokenizer
trained with ``tokenizers`` on a few sentences (the Llama 3 split regex, two special tokens, a chat
template), a SentencePiece ``tokenizer.model`` or a WordPiece one. The converter is the one in the llama.cpp
tree the client tests build, run by scripts/llama_convert.py. It identifies a BPE pre-tokenizer by the hash
of one text's token ids and refuses a hash it does not list; a tokenizer trained here has a hash of its own,
so the reference run registers it under the name of its pre-tokenizer, as the converter's update script
would add it to its table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import REPO, skip_or_fail

sys.path.append(str(REPO / "scripts"))
import llama_client
import llama_convert
from llama_convert import llama_cpp_tree

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
SENTENCES = ["Hello my name is Llama and I live in a small house by the sea.",
             "The quick brown fox jumps over the lazy dog 12345.",
             "A model is released as safetensors; llama.cpp wants a GGUF file."]
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def make_bpe_tokenizer(folder: Path, vocab_size: int = 400, lowercase: bool = False, split: str = LLAMA3_SPLIT,
                       specials: tuple[str, ...] = ("<|begin_of_text|>", "<|end_of_text|>"), bos: bool = True):
    """Llama 3's shape: the split regex, byte-level encoding, a post-processor of ByteLevel then a template
    that adds the first special token (``bos``; Qwen's shape without: ByteLevel alone, no BOS token);
    ``lowercase``: a Lowercase normalizer first; the last special token is the EOS token."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), "isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 40, trainer)
    steps = [processors.ByteLevel(trim_offsets=False)]
    if bos:
        steps.append(processors.TemplateProcessing(single=f"{specials[0]} $A",
                                                   pair=f"{specials[0]} $A {specials[0]}:1 $B:1",
                                                   special_tokens=[(specials[0], 0)]))
    tok.post_processor = processors.Sequence(steps)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=specials[-1],
                                   **({"bos_token": specials[0]} if bos else {}))
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def make_wordpiece_tokenizer(folder: Path, vocab_size: int = 300):
    """BERT's shape: a lowercasing BertNormalizer, the Bert pre-tokenizer, WordPiece with ``##``
    continuations, [CLS] A [SEP] templates."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(SENTENCES * 40, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                                   cls_token="[CLS]", mask_token="[MASK]")
    fast.save_pretrained(folder)
    return fast


class SpmTokenizer:
    """What make_llama needs of a tokenizer: its length and its special ids."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def make_spm_tokenizer(folder: Path, tokenizer_class: str | None = None,
                       added_tokens: tuple[str, ...] = ("<|im_start|>",)) -> SpmTokenizer:
    """A SentencePiece BPE model with byte fallback (tokenizer.model), added tokens past its pieces
    (added_tokens.json) and a tokenizer_config.json naming the specials, as Llama 2-era folders have (Phi-3's
    has ``<|endoftext|>``, which llama.cpp looks up by name for a model named phi3)."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES * 40), model_prefix=str(folder / "tokenizer"),
                                   vocab_size=320, model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                   hard_vocab_limit=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   minloglevel=2)
    (folder / "tokenizer.vocab").unlink()
    size = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model")).vocab_size()
    added = {text: size + i for i, text in enumerate(added_tokens)}
    (folder / "added_tokens.json").write_text(json.dumps(added))
    decoder = {str(i): {"content": text, "special": True, "normalized": False, "lstrip": False, "rstrip": False,
                        "single_word": False} for text, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2), *added.items())}
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE, "added_tokens_decoder": decoder,
        **({"tokenizer_class": tokenizer_class} if tokenizer_class else {})}))
    return SpmTokenizer(size + len(added))


def make_llama(folder: Path, *, dtype: str = "bfloat16", arch: str = "llama", seed: int = 0,
               hidden: int = 64, heads: int = 4, kv_heads: int = 2, layers: int = 2, shard: str | None = None,
               rope: dict | None = None, tokenizer: str = "bpe", bias: bool = False, lowercase: bool = False) -> Path:
    """A tiny llama (or Mistral) folder in ``dtype``, its vocabulary padded past the tokenizer's ids (the
    converter writes [PADi] tokens for those); ``shard``: save_pretrained's max_shard_size; ``rope``: the
    config's rope_parameters; ``tokenizer``: bpe (tokenizer.json) or spm (tokenizer.model); ``bias``:
    attention biases (the q/k ones permuted as their rows are); ``lowercase``: the BPE tokenizer lowercases."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = make_bpe_tokenizer(folder, lowercase=lowercase) if tokenizer == "bpe" else make_spm_tokenizer(folder)
    bos, eos = (1, 2) if isinstance(tokenizer, SpmTokenizer) else (0, 1)
    torch.manual_seed(seed)
    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM),
                                 "mistral": (MistralConfig, MistralForCausalLM)}[arch]
    config = config_class(vocab_size=len(tokenizer) + 7, hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                          max_position_embeddings=512, bos_token_id=bos, eos_token_id=eos,
                          attention_bias=bias, **({"rope_parameters": rope} if rope else {}))
    model = model_class(config)
    with torch.no_grad():  # weights large enough that greedy text is not one repeated token
        for param in model.parameters():
            param.normal_(0.0, 0.5 if param.ndim > 1 else 0.1)
            if param.ndim == 1:
                param.add_(1.0)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    generation = json.loads((folder / "generation_config.json").read_text())
    generation.update(temperature=0.6, top_p=0.9, repetition_penalty=1.1, do_sample=True)  # general.sampling.*
    (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def _randomize(model, dtype: str, folder: Path, norm_center: float = 1.0, embedding_std: float = 0.5) -> None:
    """Weights large enough that greedy text is not one repeated token; saved in ``dtype``. Gemma's norms
    scale by ``1 + weight`` (``norm_center`` 0) and its scaled embeddings would drown the blocks' outputs at
    the usual size (the last prompt token repeated), so its embeddings are smaller."""
    import torch

    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.5 if param.ndim > 1 else 0.1)
            if param.ndim == 1:
                param.add_(norm_center)
        model.get_input_embeddings().weight.normal_(0.0, embedding_std)
    model.to(getattr(torch, dtype)).save_pretrained(folder)


def make_causal(folder: Path, arch: str, *, dtype: str = "bfloat16", seed: int = 0, hidden: int = 64,
                heads: int = 4, kv_heads: int = 2, layers: int = 2, tokenizer: str = "bpe",
                rope: dict | None = None) -> Path:
    """A tiny qwen2, qwen3, gemma3 (text) or phi3 folder in ``dtype``, its vocabulary padded past the
    tokenizer's ids; ``tokenizer``: bpe (tokenizer.json; Qwen's split regex and specials for the qwens) or
    spm (tokenizer.model); ``rope``: the config's rope_parameters (phi3: LongRoPE factors)."""
    import torch
    import transformers as tf

    folder.mkdir(parents=True, exist_ok=True)
    if tokenizer == "bpe" and arch.startswith("qwen"):
        made = make_bpe_tokenizer(folder, split=QWEN2_SPLIT, specials=QWEN_SPECIALS, bos=False)
        bos, eos = None, len(QWEN_SPECIALS) - 1
    elif tokenizer == "bpe":
        made = make_bpe_tokenizer(folder)
        bos, eos = 0, 1
    else:
        phi3 = {"tokenizer_class": "LlamaTokenizer", "added_tokens": ("<|endoftext|>", "<|im_start|>")}
        made = make_spm_tokenizer(folder, **(phi3 if arch == "phi3" else {}))
        bos, eos = 1, 2
    torch.manual_seed(seed)
    config_class, model_class = {"qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
                                 "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
                                 "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
                                 "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM)}[arch]
    extra = {"head_dim": hidden // heads} if arch in ("qwen3", "gemma3") else {}
    if arch == "gemma3":
        extra.update(sliding_window=16, query_pre_attn_scalar=hidden // heads)
    if arch == "phi3":
        extra.update(original_max_position_embeddings=128 if rope else 512, pad_token_id=0)
    if rope:
        extra["rope_parameters"] = rope
    config = config_class(vocab_size=len(made) + 7, hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                          max_position_embeddings=512, bos_token_id=bos, eos_token_id=eos, **extra)
    gemma = {"norm_center": 0.0, "embedding_std": 0.02} if arch == "gemma3" else {}
    _randomize(model_class(config), dtype, folder, **gemma)
    return folder


def make_bert(folder: Path, *, dtype: str = "float32", seed: int = 0, hidden: int = 64, heads: int = 4,
              layers: int = 2) -> Path:
    """A tiny BERT sentence-embedding folder: BertModel weights, a WordPiece tokenizer and the
    sentence-transformers modules.json with mean pooling."""
    import torch
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    made = make_wordpiece_tokenizer(folder)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(made) + 5, hidden_size=hidden, intermediate_size=2 * hidden,
                        num_hidden_layers=layers, num_attention_heads=heads, max_position_embeddings=128)
    _randomize(BertModel(config), dtype, folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}))
    return folder


def set_architecture(folder: Path, name: str) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["architectures"] = [name]
    path.write_text(json.dumps(config))


def convert(folder: Path, out: Path, outtype: str, pre: str = "llama-bpe", extra: tuple[str, ...] = ()) -> Path:
    """llama.cpp's convert_hf_to_gguf.py on ``folder`` (the project's Python, the tree's gguf-py), the
    test tokenizer's pre-tokenizer registered under ``pre``; ``extra``: more of its options."""
    llama_convert.convert(folder, out, outtype, pre, timeout=600, extra=extra)
    return out


# Phi-3.5's LongRoPE at a tiny scale: 8 rotary pairs, a context 4x the original one.
PHI3_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "long_factor": [1.0 + i / 4 for i in range(8)],
                 "short_factor": [1.0 + i / 16 for i in range(8)]}

# Llama 3.1's rope scaling at a tiny scale: 8 rotary frequencies, some below, some inside and some past the
# band the scaling smooths (wavelengths 16 to 64), so the converter's rope_freqs tensor has all three kinds.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

PATH_KEYS = ("general.name", "general.basename")


def gguf_maps(path: Path) -> tuple[dict, dict]:
    """(key -> (types, value), tensor name -> (type, shape, bytes)) of a GGUF, gguf-py's reading; the
    path-dependent keys left out."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    fields = {key: (tuple(field.types), field.contents()) for key, field in reader.fields.items()
              if key not in PATH_KEYS and not key.startswith("general.source")
              and key not in ("GGUF.kv_count",)}
    tensors = {t.name: (t.tensor_type.name, tuple(int(d) for d in t.shape), bytes(t.data)) for t in reader.tensors}
    return fields, tensors


def assert_same_gguf(mine: Path, reference: Path) -> None:
    """Every key's type and value and every tensor's type, shape and bytes equal (the path-dependent keys
    left out), and the file sizes too."""
    fields, tensors = gguf_maps(mine)
    ref_fields, ref_tensors = gguf_maps(reference)
    assert sorted(fields) == sorted(ref_fields)
    for key, value in ref_fields.items():
        assert fields[key] == value, key
    assert sorted(tensors) == sorted(ref_tensors)
    for name, (qtype, shape, data) in ref_tensors.items():
        assert tensors[name][:2] == (qtype, shape), name
        assert tensors[name][2] == data, name
    assert mine.stat().st_size == reference.stat().st_size


def s3_gguf_copy(mounted, folder: Path, out: Path, *mount_args: str) -> Path:
    """``folder`` put in a moto S3 bucket, mounted as ``s3://models/NAME/`` with ``--gguf`` and
    ``mount_args``, and its ``gguf/model.gguf`` copied to ``out`` (while the server runs)."""
    import shutil

    import boto3
    from loopback.servers import MotoS3, environment

    with MotoS3() as server, environment(server.env()):
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket="models")
        for path in folder.rglob("*"):
            if path.is_file():
                client.put_object(Bucket="models", Key=f"{folder.name}/{path.relative_to(folder).as_posix()}",
                                  Body=path.read_bytes())
        mnt = mounted(f"s3://models/{folder.name}/", "--gguf", *mount_args, "--timeout", "30", env=server.env())
        shutil.copyfile(mnt / "gguf" / "model.gguf", out)
    return out


def converter_tree() -> Path:
    """The llama.cpp tree holding the converter (skip, or fail where the suite requires it, when absent)."""
    tree = llama_cpp_tree()
    if not (tree / "convert_hf_to_gguf.py").is_file():
        skip_or_fail(f"llama.cpp's converter is not there ({tree}): run bash scripts/build_llama_cpp.sh")
    return tree


class GgufMounts:
    """``gguf/model.gguf`` of a folder mounted with --gguf-type ``outtype``: one mount per pair (through a
    module-scoped ``mounted`` fixture), unless ``fresh``."""

    def __init__(self, mount):
        self.mount, self.paths = mount, {}

    def __call__(self, folder: Path, outtype: str, fresh: bool = False) -> Path:
        key = (folder, outtype)
        if fresh or key not in self.paths or not self.paths[key].exists():
            self.paths[key] = self.mount(folder, "--gguf", "--gguf-type", outtype) / "gguf" / "model.gguf"
        return self.paths[key]


def assert_same_greedy(reference: Path, mine: Path, n_predict: int, distinct: int = 3) -> None:
    """llama.cpp (the probe) generates the same greedy tokens and text from ``mine`` in every load mode as
    from ``reference`` with mmap; the reference's text has at least ``distinct`` different tokens (random
    tiny models are made so that it is not one repeated token, and the comparison can fail)."""
    probe = llama_client.probe_path()
    if not probe.exists():
        skip_or_fail(f"llama.cpp is not built ({probe} is missing): run bash scripts/build_llama_cpp.sh")
    expected = llama_client.run(reference, "mmap", n_predict, probe=probe)
    assert len(expected["tokens"]) == n_predict and len(set(expected["tokens"])) >= distinct, expected
    for mode in llama_client.MODES:
        result = llama_client.run(mine, mode, n_predict, probe=probe)
        assert result["tokens"] == expected["tokens"], mode
        assert result["text"] == expected["text"], mode
        if mode == "dio":
            assert not result["dio_fallback"], result["warnings"]


@pytest.fixture(scope="module")
def converter() -> Path:
    """The converter's tree, for a test module that imports this fixture."""
    return converter_tree()


@pytest.fixture(scope="module")
def mounted_gguf(module_mounted) -> GgufMounts:
    """One --gguf mount per folder and type in a test module that imports this fixture."""
    return GgufMounts(module_mounted)
