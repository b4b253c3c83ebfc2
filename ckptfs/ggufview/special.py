"""Special tokens, merges, ``add_*_token`` flags and the chat template: gguf-py's ``SpecialVocab`` with the
rules of the converter's own gguf-py where the pinned release reads a folder differently.

The converter's gguf-py (newer than the pinned 0.19.0 under the same version number) lets the
``tokenizer.json`` post-processor decide an ``add_*_token`` flag before ``tokenizer_config.json`` may
(0.19.0 lets the config override it), takes a ``ByteLevel`` post-processor to add neither BOS nor EOS unless
a later step says so, and writes the normalizer's lowercase and strip-accents flags. Those rules are applied
here on top of the pinned class; a template whose leading special token is neither the BOS nor the CLS token
(which the converter's gguf-py would turn into the BOS token) is refused rather than guessed.
"""

from __future__ import annotations

from pathlib import Path

import gguf

from ckptfs.ggufview import Unsupported
from ckptfs.ggufview.files import read_json

NORMALIZER_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
NORMALIZER_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"


def _special_id(step: dict) -> str | None:
    return step.get("SpecialToken", {}).get("id")


def post_processor_flags(tokenizer: dict, config: dict | None) -> dict[str, bool]:
    """The ``add_*_token`` flags the post-processor decides (bos, eos, sep), by the converter's rules."""
    config = config or {}
    bos, cls = config.get("bos_token"), config.get("cls_token")
    eos, sep = config.get("eos_token"), config.get("sep_token")
    bos = bos or cls
    eos = eos or sep
    flags: dict[str, bool] = {}
    processor = tokenizer.get("post_processor") or {}
    for step in processor.get("processors", [processor]) if processor else []:
        kind = step.get("type")
        if kind == "ByteLevel":
            flags.setdefault("bos", False)
            flags.setdefault("eos", False)
        elif kind == "RobertaProcessing":
            flags.update(bos=True, eos=True, sep=True)
        elif kind == "TemplateProcessing":
            first, last = _template_ends(step.get("single", []), flags, config, (bos, cls), eos)
            if (sep_flag := _pair_separator(step.get("pair", []), first, last, (sep, eos))) is not None:
                flags["sep"] = sep_flag
    return flags


def _template_ends(single: list, flags: dict, config: dict, leading: tuple, eos: str | None):
    """The single-sequence template's leading and trailing special tokens, and the bos/eos flags they set."""
    if len(single) <= 1:
        return None, None
    first, last = _special_id(single[0]), _special_id(single[-1])
    if first:
        if config and first not in leading:
            raise Unsupported(f"the tokenizer's template starts with {first!r}, neither its BOS nor CLS token")
        flags["bos"] = True
    if last:
        flags["eos"] = True  # the trailing token is the EOS token (the converter makes it so if it was not)
    return first, last


def _pair_separator(pair: list, first: str | None, last: str | None, separators: tuple) -> bool | None:
    """Whether the pair template puts a SEP/EOS token between A and B (None: the template does not say)."""
    if not pair:
        return None
    start = 1 if first and _special_id(pair[0]) == first else 0
    stop = -1 if last and _special_id(pair[-1]) == last else None
    pair = pair[start:stop]
    if not pair or pair[0].get("Sequence", {}).get("id") != "A" or pair[-1].get("Sequence", {}).get("id") != "B":
        return None
    middle = pair[1:-1]
    if not middle:
        return None
    between = _special_id(middle[0])
    add = bool(between) and between in separators and not last
    if len(middle) == 2 and _special_id(middle[1]) in separators:
        add = True
    return add


def normalizer_flags(normalizer: dict | None) -> dict[str, bool]:
    """lowercase / strip_accents as the normalizer (or a Sequence of them) sets them."""
    flags: dict[str, bool] = {}
    if not normalizer:
        return flags
    kind = normalizer.get("type")
    if kind == "Lowercase":
        flags["lowercase"] = True
    elif kind == "StripAccents":
        flags["strip_accents"] = True
    elif kind == "BertNormalizer":
        flags.update({key: normalizer[key] for key in ("lowercase", "strip_accents") if key in normalizer})
    elif kind == "Sequence":
        for inner in normalizer.get("normalizers", []):
            flags.update(normalizer_flags(inner))
    return flags


class SpecialVocab(gguf.SpecialVocab):
    """gguf-py's special vocabulary, read by the converter's rules (module docstring)."""

    normalizer: dict[str, bool] = {}  # noqa: RUF012 - replaced, never changed in place

    def _try_load_from_tokenizer_json(self, path: Path) -> bool:
        loaded = super()._try_load_from_tokenizer_json(path)
        self.normalizer = {}
        tokenizer = read_json(path / "tokenizer.json")
        if tokenizer:
            self.add_special_token.update(post_processor_flags(tokenizer, read_json(path / "tokenizer_config.json")))
            self.normalizer = normalizer_flags(tokenizer.get("normalizer"))
        return loaded

    def add_to_gguf(self, gw, quiet: bool = False) -> None:
        super().add_to_gguf(gw, quiet=quiet)
        if (value := self.normalizer.get("lowercase")) is not None:
            gw.add_bool(NORMALIZER_LOWERCASE, value)
        if (value := self.normalizer.get("strip_accents")) is not None:
            gw.add_bool(NORMALIZER_STRIP_ACCENTS, value)
