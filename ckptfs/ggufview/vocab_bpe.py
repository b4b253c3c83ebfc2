"""Vocabularies of a Hugging Face tokenizer (GPT-2 style BPE and WordPiece), read as transformers'
``AutoTokenizer`` reads them (``tokenizer_read``) and listed as the converter lists them: every id below ``config.json``'s ``vocab_size`` (``[PADi]`` for ids the tokenizer
lacks), added tokens normalized as the tokenizer would and typed control or user-defined; the pre-tokenizer
named by the hash of one fixed text's token ids (``pre_hashes``), or by its shape for a hash not listed.
"""

from __future__ import annotations

import logging
from hashlib import sha256
from pathlib import Path
from typing import TYPE_CHECKING

from ckptfs.ggufview import Config, Unsupported
from ckptfs.ggufview.files import read_json
from ckptfs.ggufview.pre_hashes import CHECK_TEXT, PRE_TOKENIZERS
from ckptfs.ggufview.tokenizer_read import TokenizerReader, TransformersTokenizer, direct_tokenizer
from ckptfs.ggufview.vocab_spm import looks_special

if TYPE_CHECKING:
    from gguf import TokenType

log = logging.getLogger("ckptfs.ggufview")

#: The pre-tokenizer regexes llama.cpp implements under a name, for a tokenizer whose hash is not listed
#: (a fine-tune with its own vocabulary but a known pre-tokenizer): the regex decides how text is split.
PRE_TOKENIZER_REGEXES = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+": "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+": "qwen2",
    # o200k (GPT-4o, gpt-oss): llama.cpp splits the same way for every name it lists with this regex
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+": "gpt-4o",
}
#: A SentencePiece-style BPE ``tokenizer.json`` (spaces made ``▁`` by the normalizer, merges over the whole
#: text: a ``tokenizer.json`` converted from a SentencePiece model, as Gemma's) whose hash is not listed: the
#: name llama.cpp's update script gives that shape (whitespace escaped, split on newlines only).
SPM_STYLE_PRE = "gemma4"
#: A WordPiece vocabulary whose hash is not listed: llama.cpp splits WordPiece text itself whatever the
#: name, so the name only records that no listed pre-tokenizer matched.
WORDPIECE_PRE = "default"


def tokenizer_vocab(folder: Path, config: Config) -> tuple[list[str], list[TokenType], str]:
    """(tokens, token types, pre-tokenizer name) of the folder's tokenizer: read from ``tokenizer.json``
    directly when that is the tokenizer transformers would load and the pre-tokenizer's name cannot depend
    on which of the two reads it, else through transformers (``tokenizer_read``)."""
    direct = direct_tokenizer(folder)
    if direct is not None and _same_name_either_way(direct):
        return _listed(direct, folder, config)
    return _listed(TransformersTokenizer(folder), folder, config)


def _same_name_either_way(tokenizer: TokenizerReader) -> bool:
    """The direct read's hash is listed (the name is the listed one), or neither it nor the hash of the
    same ids with a special token added or dropped at either end is (the name then comes from
    ``tokenizer.json``'s shape, the same file for both reads): transformers differs from the direct read in
    which special tokens it adds, so a tokenizer it could move onto a listed hash is left to it."""
    if _digest(tokenizer) in PRE_TOKENIZERS:
        return True
    core = tokenizer.encode(CHECK_TEXT, add_special_tokens=False)
    specials = sorted(i for i, token in tokenizer.added().items() if token.special)
    if len(specials) > _MOST_SPECIALS_TRIED:
        return False
    ends: list[list[int]] = [[], *([i] for i in specials)]
    return not any(_digest_of(head + core + tail) in PRE_TOKENIZERS for head in ends for tail in ends)


#: Past this many special tokens the variants are not tried (their number grows as its square).
_MOST_SPECIALS_TRIED = 64


def _listed(tokenizer: TokenizerReader, folder: Path, config: Config) -> tuple[list[str], list[TokenType], str]:
    import gguf

    vocab = tokenizer.vocab()
    vocab_size = config.get("vocab_size", len(vocab))
    if max(vocab.values()) >= vocab_size:
        raise Unsupported(f"the tokenizer has ids past config.json's vocab_size {vocab_size}")
    pre = pre_tokenizer_name(tokenizer, folder)
    by_id = {token_id: token for token, token_id in vocab.items()}
    decoder = tokenizer.added()
    added = {token.content for token in decoder.values()}
    tokens: list[str] = []
    types: list[TokenType] = []
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
    return tokens, types, pre


def _digest(tokenizer: TokenizerReader) -> str:
    """The converter's hash of the tokenizer's pre-tokenizer: its token ids of one fixed text."""
    return _digest_of(tokenizer.encode(CHECK_TEXT))


def _digest_of(ids: list[int]) -> str:
    return sha256(str(ids).encode()).hexdigest()


def pre_tokenizer_name(tokenizer: TokenizerReader, folder: Path) -> str:
    """llama.cpp's name of the tokenizer's pre-tokenizer: by the converter's hash, else by its shape."""
    digest = _digest(tokenizer)
    if digest in PRE_TOKENIZERS:
        return PRE_TOKENIZERS[digest]
    tokenizer_json = read_json(folder / "tokenizer.json") or {}
    regex = _split_regex(tokenizer_json)
    if regex in PRE_TOKENIZER_REGEXES:
        log.info("pre-tokenizer hash %s not listed; its split regex is %s's", digest, PRE_TOKENIZER_REGEXES[regex])
        return PRE_TOKENIZER_REGEXES[regex]
    if (tokenizer_json.get("model") or {}).get("type") == "WordPiece":
        log.info("WordPiece pre-tokenizer hash %s not listed: %s", digest, WORDPIECE_PRE)
        return WORDPIECE_PRE
    if _spm_style_bpe(tokenizer_json):
        log.info("SentencePiece-style BPE pre-tokenizer hash %s not listed: %s", digest, SPM_STYLE_PRE)
        return SPM_STYLE_PRE
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


def _spm_style_bpe(tokenizer_json: dict) -> bool:
    """A BPE model whose normalizer turns spaces into ``▁`` (a Replace, alone or after a Prepend) and whose
    pre-tokenizer is none or a split on spaces (which finds none once they are ``▁``)."""
    if (tokenizer_json.get("model") or {}).get("type") != "BPE":
        return False
    normalizer = tokenizer_json.get("normalizer") or {}
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    kinds = [step.get("type") for step in steps]
    if kinds not in (["Replace"], ["Prepend", "Replace"]):
        return False
    replace = steps[-1]
    if (replace.get("pattern") or {}).get("String") != " " or replace.get("content") != "\u2581":
        return False
    pre = tokenizer_json.get("pre_tokenizer")
    return pre is None or (pre.get("type") == "Split" and (pre.get("pattern") or {}).get("String") == " ")


def write_gpt2(writer, folder: Path, config: Config) -> None:
    """A GPT-2 style BPE vocabulary (``tokenizer.ggml.model`` gpt2)."""
    tokens, types, pre = tokenizer_vocab(folder, config)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)


def write_wordpiece(writer, folder: Path, config: Config) -> int:
    """A WordPiece vocabulary (``tokenizer.ggml.model`` bert) in llama.cpp's phantom-space form: a word's
    first piece gets a leading ``▁``, a continuation (``##``) piece loses its marks, control tokens stay as
    they are. Returns the number of tokens."""
    import gguf

    tokens, types, pre = tokenizer_vocab(folder, config)
    writer.add_token_type_count(config.get("type_vocab_size", 1))
    phantom = [token if kind == gguf.TokenType.CONTROL else token[2:] if token.startswith("##") else "\u2581" + token
               for token, kind in zip(tokens, types)]
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(phantom)
    writer.add_token_types(types)
    return len(phantom)
