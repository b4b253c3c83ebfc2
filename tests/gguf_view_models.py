"""Tiny Hugging Face model folders made at test time, and llama.cpp's converter run on them as the oracle
of ``gguf/model.gguf``.

A folder is a transformers config with random weights saved as safetensors, and a byte-level BPE tokenizer
trained with ``tokenizers`` on a few sentences (the Llama 3 split regex, two special tokens, a chat
template). The converter is the one in the llama.cpp tree the client tests build (found from the probe's
path, as scripts/llama_client.py finds the probe). It identifies a BPE pre-tokenizer by the hash of one
text's token ids and refuses a hash it does not list; a tokenizer trained here has a hash of its own, so the
reference run registers it under the name of its pre-tokenizer, as the converter's update script would add
it to its table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO

sys.path.append(str(REPO / "scripts"))
import llama_client  # noqa: E402

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
SENTENCES = ["Hello my name is Llama and I live in a small house by the sea.",
             "The quick brown fox jumps over the lazy dog 12345.",
             "A model is released as safetensors; llama.cpp wants a GGUF file."]
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"

# The converter, with one pre-tokenizer registered: argv = tree, name, converter arguments.
_CONVERT = """
import runpy, sys
tree, name = sys.argv[1], sys.argv[2]
sys.argv = [tree + "/convert_hf_to_gguf.py", *sys.argv[3:]]
sys.path.insert(0, tree)
from conversion import base
listed = base.TextModel.get_vocab_base_pre
def registered(self, tokenizer):
    try:
        return listed(self, tokenizer)
    except NotImplementedError:  # the hash of this test's tokenizer, registered under its pre-tokenizer
        return name
base.TextModel.get_vocab_base_pre = registered
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def llama_cpp_tree() -> Path:
    """The llama.cpp source tree the client tests build (beside the probe's bin/ folder)."""
    return llama_client.probe_path().parent.parent / "src" / "llama.cpp"


def make_bpe_tokenizer(folder: Path, vocab_size: int = 400, lowercase: bool = False):
    """Llama 3's shape: the split regex, byte-level encoding, a post-processor of ByteLevel then a template
    that adds <|begin_of_text|>; ``lowercase``: a Lowercase normalizer first."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), "isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 40, trainer)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", 0)])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


class SpmTokenizer:
    """What make_llama needs of a tokenizer: its length and its special ids."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def make_spm_tokenizer(folder: Path) -> SpmTokenizer:
    """A SentencePiece BPE model with byte fallback (tokenizer.model), one added token past its pieces
    (added_tokens.json) and a tokenizer_config.json naming the specials, as Llama 2-era folders have."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES * 40), model_prefix=str(folder / "tokenizer"),
                                   vocab_size=320, model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                   hard_vocab_limit=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   minloglevel=2)
    (folder / "tokenizer.vocab").unlink()
    size = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model")).vocab_size()
    added = {"<|im_start|>": size}
    (folder / "added_tokens.json").write_text(json.dumps(added))
    decoder = {str(i): {"content": text, "special": True, "normalized": False, "lstrip": False, "rstrip": False,
                        "single_word": False} for text, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))}
    decoder[str(size)] = {**decoder["1"], "content": "<|im_start|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE, "added_tokens_decoder": decoder}))
    return SpmTokenizer(size + 1)


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


def set_architecture(folder: Path, name: str) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["architectures"] = [name]
    path.write_text(json.dumps(config))


def convert(folder: Path, out: Path, outtype: str, pre: str = "llama-bpe") -> Path:
    """llama.cpp's convert_hf_to_gguf.py on ``folder`` (the project's Python, the tree's gguf-py)."""
    done = subprocess.run([sys.executable, "-c", _CONVERT, str(llama_cpp_tree()), pre, str(folder),
                           "--outfile", str(out), "--outtype", outtype],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed: {done.stderr[-3000:]}")
    return out


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
