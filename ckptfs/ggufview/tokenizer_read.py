"""The folder's tokenizer as the vocabulary export reads it: transformers' ``AutoTokenizer`` (what the
converter loads), or ``tokenizer.json`` through the ``tokenizers`` library directly when that is the same
tokenizer.

``AutoTokenizer`` costs a mount seconds (transformers, torch with it, and its own tokenizer set-up) while
the Rust tokenizer it wraps loads in a fraction of that. The direct read is taken only where transformers
would add nothing to ``tokenizer.json``: every added token ``tokenizer_config.json`` declares and every
special token it or ``special_tokens_map.json`` names is already one of ``tokenizer.json``'s added tokens,
alike, and decoding leaves no text transformers' clean-up would change. The caller also requires the
pre-tokenizer hash of the direct read to be a listed one (``pre_hashes``): a tokenizer class that rebuilds
the pipeline or adds special tokens its own way gives another hash, and then transformers decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ckptfs.ggufview import Unsupported
from ckptfs.ggufview.files import read_json


@dataclass(frozen=True)
class AddedToken:
    content: str
    special: bool
    normalized: bool


class TokenizerReader(Protocol):
    """What the export asks of a tokenizer."""

    def vocab(self) -> dict[str, int]:
        """Every token (added ones too) and its id."""

    def added(self) -> dict[int, AddedToken]:
        """The added tokens by id."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``."""

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens kept."""


class TransformersTokenizer:
    """transformers' ``AutoTokenizer`` for the folder (what the converter reads)."""

    def __init__(self, folder: Path):
        from transformers import AutoTokenizer

        try:
            self._tokenizer = AutoTokenizer.from_pretrained(folder)
        except (OSError, ValueError) as exc:
            raise Unsupported(f"transformers cannot read the tokenizer: {' '.join(str(exc).split())}") from None

    def vocab(self) -> dict[str, int]:
        return dict(self._tokenizer.vocab)

    def added(self) -> dict[int, AddedToken]:
        return {i: AddedToken(token.content, bool(token.special), bool(token.normalized))
                for i, token in self._tokenizer.added_tokens_decoder.items()}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int]) -> str:
        text = self._tokenizer.decode(ids)
        if not isinstance(text, str):  # a batch's decode answers a list; one sequence's, a str
            raise Unsupported("transformers decoded one sequence into several")
        return text


class RustTokenizer:
    """``tokenizer.json`` read by the ``tokenizers`` library, without its ``padding`` and ``truncation``.

    Those two sections are settings for batching model inputs (sentence-transformers folders such as
    all-MiniLM-L6-v2 pad to 128 and truncate at 128). transformers resets them on every call that does not
    ask for them, so the converter's tokenizer never applies them; read as they are, they would pad each
    special token's text with ``[PAD]`` and cut the pre-tokenizer's check text, naming another
    pre-tokenizer."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()

    def vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def added(self) -> dict[int, AddedToken]:
        return {i: AddedToken(token.content, bool(token.special), bool(token.normalized))
                for i, token in self._tokenizer.get_added_tokens_decoder().items()}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)


#: transformers' ``clean_up_tokenization``: the replacements its decode makes when clean-up is on
_CLEAN_UP = (" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're")


def direct_tokenizer(folder: Path) -> RustTokenizer | None:
    """``tokenizer.json`` read directly when transformers would read the same tokens from the folder
    (None when it might not, or there is no ``tokenizer.json``, or the library is missing)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        import tokenizers  # noqa: F401 - installed? (imported for its answer, not its names)
    except ImportError:
        return None
    config = read_json(folder / "tokenizer_config.json") or {}
    if not isinstance(config, dict):
        return None
    tokenizer = RustTokenizer(path)
    added = tokenizer.added()
    by_content = {token.content: token for token in added.values()}
    for key, data in (config.get("added_tokens_decoder") or {}).items():
        token = added.get(int(key))
        if (token is None or token.content != data.get("content")
                or token.special != bool(data.get("special", False))
                or token.normalized != bool(data.get("normalized", not data.get("special", False)))):
            return None
    special_map = read_json(folder / "special_tokens_map.json") or {}
    for named in (*_named_special(config), *_named_special(special_map)):
        token = by_content.get(named)
        if token is None or not token.special:
            return None
    if config.get("clean_up_tokenization_spaces", False) is not False:
        texts = [tokenizer.decode(tokenizer.encode(token.content, add_special_tokens=False))
                 for token in added.values() if not token.normalized]
        if any(mark in text for text in texts for mark in _CLEAN_UP):
            return None
    return tokenizer


def _named_special(config: Any) -> list[str]:
    """The special tokens a ``tokenizer_config.json`` or ``special_tokens_map.json`` names (``*_token``
    keys and the lists of additional ones), as text."""
    if not isinstance(config, dict):
        return []
    named: list[Any] = [value for key, value in config.items() if key.endswith("_token")]
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra = config.get(key)
        named += list(extra.values()) if isinstance(extra, dict) else list(extra or [])
    out = []
    for value in named:
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out.append(value)
    return out
