"""The tokenizer keys of ``gguf/model.gguf``, as the converter writes them for a llama-family folder.

A SentencePiece ``tokenizer.model`` is read with ``sentencepiece`` (pieces, scores, types; then
``added_tokens.json`` and ``tokenizer_config.json``'s ``added_tokens_decoder`` over them, ``[PADi]`` up to
``vocab_size``). Without one, a ``tokenizer.json`` in the SentencePiece style (BPE with byte fallback) goes through gguf-py's
``LlamaHfVocab`` (``tokenizer.ggml.model = llama``); any other ``tokenizer.json`` is a GPT-2 style BPE
vocabulary read with transformers' ``AutoTokenizer``, its pre-tokenizer named by the hash of one fixed text's
token ids (``pre_hashes``). Special tokens, merges, ``add_*_token`` flags and the chat template come from
gguf-py's ``SpecialVocab``, read by the converter's gguf-py's rules (``special``). The tokenizer files are read from the local folder, as the libraries read them.
"""

from __future__ import annotations

import json
import logging
from hashlib import sha256
from pathlib import Path

from ckptfs.ggufview import Unsupported
from ckptfs.ggufview.pre_hashes import CHECK_TEXT, PRE_TOKENIZERS

log = logging.getLogger("ckptfs.ggufview")

#: The pre-tokenizer regexes llama.cpp implements under a name, for a tokenizer whose hash is not listed
#: (a fine-tune with its own vocabulary but a known pre-tokenizer): the regex decides how text is split.
PRE_TOKENIZER_REGEXES = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+": "llama-bpe",
}
_SPECIAL_LOOKING = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")


def looks_special(token: str) -> bool:
    """The converter's rule for added tokens that ought to be control tokens though not marked special."""
    return (token in _SPECIAL_LOOKING or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>"))
            or (token.startswith("<unused") and token.endswith(">")))


def add_llama_vocab(writer, folder: Path, config: dict) -> None:
    """Every tokenizer key for a llama-family folder."""
    import gguf

    from ckptfs.ggufview.special import SpecialVocab

    tokenizer_config = _json(folder / "tokenizer_config.json")
    if tokenizer_config is not None:
        if (prefix := tokenizer_config.get("add_prefix_space")) is not None:
            writer.add_add_space_prefix(prefix)
        if tokenizer_config.get("tokenizer_class") == "HybridDNATokenizer":
            raise Unsupported("the HybridDNA tokenizer is not served")
    if (folder / "tekken.json").is_file() and not (folder / "tokenizer.json").is_file():
        raise Unsupported("a Mistral tekken.json tokenizer is not served")
    if not any((folder / name).is_file() for name in ("tokenizer.model", "tokenizer.json", "vocab.json")):
        raise Unsupported("the folder has no tokenizer (tokenizer.model, tokenizer.json or vocab.json)")
    if (folder / "tokenizer.model").is_file():
        _add_sentencepiece(writer, folder, config, tokenizer_config or {})
        special = SpecialVocab(folder, n_vocab=writer_token_count(writer))
    else:
        try:
            _add_hf_spm(writer, gguf.LlamaHfVocab(folder))
            special = SpecialVocab(folder, n_vocab=writer_token_count(writer))
        except (FileNotFoundError, TypeError):
            _add_gpt2(writer, folder, config)
            special = SpecialVocab(folder, load_merges=True)
    special.add_to_gguf(writer)
    vocab_size = config.get("vocab_size", 32000)
    if vocab_size == 32016:
        raise Unsupported("CodeLlama's infill tokens are not served yet")
    if vocab_size == 49152:
        writer.add_add_bos_token(False)


def writer_token_count(writer) -> int:
    import gguf

    return len(writer.kv_data[0][gguf.Keys.Tokenizer.LIST].value)


def _json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _add_sentencepiece(writer, folder: Path, config: dict, tokenizer_config: dict) -> None:
    """A SentencePiece vocabulary (``tokenizer.ggml.model`` llama, pre-tokenizer default)."""
    import gguf
    from sentencepiece import SentencePieceProcessor

    kind = gguf.TokenType
    processor = SentencePieceProcessor()
    processor.LoadFromFile(str(folder / "tokenizer.model"))
    vocab_size = config.get("vocab_size_per_layer_input", config.get("vocab_size")) or processor.vocab_size()
    tokens = [f"[PAD{i}]".encode() for i in range(vocab_size)]
    scores = [-10000.0] * vocab_size
    types = [kind.UNUSED] * vocab_size
    for i in range(min(processor.vocab_size(), vocab_size)):
        tokens[i], scores[i] = processor.IdToPiece(i).encode(), processor.GetScore(i)
        types[i] = (kind.UNKNOWN if processor.IsUnknown(i) else kind.CONTROL if processor.IsControl(i)
                    else kind.UNUSED if processor.IsUnused(i) else kind.BYTE if processor.IsByte(i) else kind.NORMAL)
    for text, i in (_json(folder / "added_tokens.json") or {}).items():
        if i < vocab_size:
            tokens[i], scores[i], types[i] = text.encode(), -1000.0, kind.USER_DEFINED
    for key, data in tokenizer_config.get("added_tokens_decoder", {}).items():
        i, text = int(key), data["content"]
        if i >= vocab_size:
            continue
        if data.get("special") or looks_special(text):
            types[i] = kind.CONTROL
        else:
            text = text.replace("\u2581", " ")
            types[i] = kind.USER_DEFINED
        tokens[i], scores[i] = text.encode(), -1000.0
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)


def _add_hf_spm(writer, vocab) -> None:
    tokens, scores, types = [], [], []
    for text, score, token_type in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(token_type)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)


def _add_gpt2(writer, folder: Path, config: dict) -> None:
    """A GPT-2 style BPE vocabulary: every id below ``vocab_size``, an id the tokenizer lacks as ``[PADi]``
    (unused), added tokens normalized as the tokenizer would and typed control or user-defined."""
    import gguf
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise Unsupported(f"transformers cannot read the tokenizer: {' '.join(str(exc).split())}") from None
    vocab = tokenizer.vocab
    vocab_size = config.get("vocab_size", len(vocab))
    if max(vocab.values()) >= vocab_size:
        raise Unsupported(f"the tokenizer has ids past config.json's vocab_size {vocab_size}")
    pre = pre_tokenizer_name(tokenizer, folder)
    by_id = {token_id: token for token, token_id in vocab.items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = by_id[i]
        if token in added:
            if not decoder[i].normalized:
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            if decoder[i].special or looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)


def pre_tokenizer_name(tokenizer, folder: Path) -> str:
    """llama.cpp's name of the tokenizer's pre-tokenizer: by the converter's hash, else by its split regex."""
    digest = sha256(str(tokenizer.encode(CHECK_TEXT)).encode()).hexdigest()
    if digest in PRE_TOKENIZERS:
        return PRE_TOKENIZERS[digest]
    regex = _split_regex(_json(folder / "tokenizer.json") or {})
    if regex in PRE_TOKENIZER_REGEXES:
        log.info("pre-tokenizer hash %s not listed; its split regex is %s's", digest, PRE_TOKENIZER_REGEXES[regex])
        return PRE_TOKENIZER_REGEXES[regex]
    raise Unsupported(f"the BPE pre-tokenizer is not recognized (hash {digest})")


def _split_regex(tokenizer_json: dict) -> str | None:
    """The regex of the one Split step of a byte-level pre-tokenizer (None for any other shape)."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    splits = [step for step in steps if step.get("type") == "Split"]
    others = [step for step in steps if step.get("type") != "Split"]
    if len(splits) != 1 or [step.get("type") for step in others] != ["ByteLevel"]:
        return None
    if others[0].get("use_regex", True) or splits[0].get("invert"):
        return None
    return (splits[0].get("pattern") or {}).get("Regex")
