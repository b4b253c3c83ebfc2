"""SentencePiece vocabularies (``tokenizer.model``) as the converter lists them: pieces, scores and token
types, ``[PADi]`` up to the config's vocabulary size, then the folder's added tokens over them by the
rules of the converter's class (the common one, or phi3's own)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ckptfs.ggufview import Config, Unsupported
from ckptfs.ggufview.files import read_json

if TYPE_CHECKING:
    from gguf import TokenType

_SPECIAL_LOOKING = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")


def looks_special(token: str) -> bool:
    """The converter's rule for added tokens that ought to be control tokens though not marked special."""
    return (token in _SPECIAL_LOOKING or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>"))
            or (token.startswith("<unused") and token.endswith(">")))


def _processor(folder: Path):
    from sentencepiece import SentencePieceProcessor

    processor = SentencePieceProcessor()
    processor.LoadFromFile(str(folder / "tokenizer.model"))
    return processor


def spm_vocab_size(folder: Path, config: Config) -> int:
    """The number of tokens the common SentencePiece export lists."""
    return config.get("vocab_size_per_layer_input", config.get("vocab_size")) or _processor(folder).vocab_size()


def _pieces(folder: Path, vocab_size: int) -> tuple[list[bytes], list[float], list[TokenType]]:
    import gguf

    kind = gguf.TokenType
    processor = _processor(folder)
    tokens = [f"[PAD{i}]".encode() for i in range(vocab_size)]
    scores = [-10000.0] * vocab_size
    types = [kind.UNUSED] * vocab_size
    for i in range(min(processor.vocab_size(), vocab_size)):
        tokens[i], scores[i] = processor.IdToPiece(i).encode(), processor.GetScore(i)
        types[i] = (kind.UNKNOWN if processor.IsUnknown(i) else kind.CONTROL if processor.IsControl(i)
                    else kind.UNUSED if processor.IsUnused(i) else kind.BYTE if processor.IsByte(i) else kind.NORMAL)
    for text, i in (read_json(folder / "added_tokens.json") or {}).items():
        if i < vocab_size:
            tokens[i], scores[i], types[i] = text.encode(), -1000.0, kind.USER_DEFINED
    return tokens, scores, types


def spm_vocab(folder: Path, config: Config) -> tuple[list[bytes], list[float], list[TokenType]]:
    """The common export: ``tokenizer_config.json``'s ``added_tokens_decoder`` typed control when special or
    special-looking, else user-defined with SentencePiece's space mark as a space."""
    import gguf

    vocab_size = spm_vocab_size(folder, config)
    tokens, scores, types = _pieces(folder, vocab_size)
    tokenizer_config = read_json(folder / "tokenizer_config.json") or {}
    for key, data in tokenizer_config.get("added_tokens_decoder", {}).items():
        i, text = int(key), data["content"]
        if i >= vocab_size:
            continue
        if data.get("special") or looks_special(text):
            types[i] = gguf.TokenType.CONTROL
        else:
            text = text.replace("\u2581", " ")
            types[i] = gguf.TokenType.USER_DEFINED
        tokens[i], scores[i] = text.encode(), -1000.0
    return tokens, scores, types


def phi3_spm_vocab(folder: Path, config: Config) -> tuple[list[bytes], list[float], list[TokenType]]:
    """phi3's export: the config's ``vocab_size`` alone sizes it; ``added_tokens_decoder`` and then
    ``tokenizer.json``'s ``added_tokens`` over the pieces, control when special, else user-defined, as
    written (no special-looking rule, no space rewriting)."""
    import gguf

    vocab_size = config.get("vocab_size") or _processor(folder).vocab_size()
    tokens, scores, types = _pieces(folder, vocab_size)
    tokenizer_config = read_json(folder / "tokenizer_config.json") or {}
    added = [(int(key), data) for key, data in tokenizer_config.get("added_tokens_decoder", {}).items()]
    added += [(int(data["id"]), data) for data in (read_json(folder / "tokenizer.json") or {}).get("added_tokens", [])]
    for i, data in added:
        if i >= vocab_size:
            raise Unsupported(f"added token {i} is past config.json's vocab_size {vocab_size}")
        tokens[i], scores[i] = data["content"].encode(), -1000.0
        types[i] = gguf.TokenType.CONTROL if data.get("special") else gguf.TokenType.USER_DEFINED
    return tokens, scores, types


def write_spm(writer, tokens: Sequence[bytes], scores: Sequence[float], types: Sequence[int]) -> None:
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
