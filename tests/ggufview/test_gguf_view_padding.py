"""A ``tokenizer.json`` that sets ``padding`` and ``truncation`` (sentence-transformers folders such as
all-MiniLM-L6-v2: Fixed 128 and 128) gives the same ``gguf/model.gguf`` as the converter.

transformers, which the converter tokenizes with, resets both settings on every call that does not ask for
them; the view reads ``tokenizer.json`` with the ``tokenizers`` library where that is the same tokenizer,
and must drop them too: applied, they pad each special token's text with 127 ``[PAD]`` and cut the
pre-tokenizer's check text (another hash, another ``tokenizer.ggml.pre``). Every architecture of the table
with a ``tokenizer.json`` is checked against the converter with both settings on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf_view_models import assert_same_gguf, convert, make_bert, make_causal, make_llama
from gguf_view_models import converter, mounted_gguf  # noqa: F401 - fixtures

pytest.importorskip("transformers")
pytest.importorskip("gguf")

LENGTH = 128
#: case -> (how it is made, the name the reference run registers the test tokenizer's pre-tokenizer under)
CASES = {
    "llama": (lambda path: make_llama(path, seed=11), "llama-bpe"),
    "qwen2": (lambda path: make_causal(path, "qwen2", seed=12), "qwen2"),
    "qwen3": (lambda path: make_causal(path, "qwen3", dtype="float16", seed=13, kv_heads=4), "qwen2"),
    "gemma3": (lambda path: make_causal(path, "gemma3", dtype="float16", seed=14, hidden=48, heads=2,
                                        kv_heads=1), "llama-bpe"),
    "bert": (lambda path: make_bert(path, seed=15), "default"),
}


def pad_and_truncate(folder: Path) -> None:
    """Set ``tokenizer.json``'s padding (Fixed ``LENGTH``, the pad token of the folder) and truncation
    (``LENGTH``), as sentence-transformers saves them."""
    path = folder / "tokenizer.json"
    doc = json.loads(path.read_text())
    vocab = {token["content"]: token["id"] for token in doc.get("added_tokens", [])}
    pad = "[PAD]" if "[PAD]" in vocab else next(iter(vocab))
    doc["padding"] = {"strategy": {"Fixed": LENGTH}, "direction": "Right", "pad_to_multiple_of": None,
                      "pad_id": vocab[pad], "pad_type_id": 0, "pad_token": pad}
    doc["truncation"] = {"direction": "Right", "max_length": LENGTH, "strategy": "LongestFirst", "stride": 0}
    path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-padded")
    made = {}
    for case, (make, _) in CASES.items():
        folder = make(root / f"tiny-{case}")
        pad_and_truncate(folder)
        made[case] = folder
    return made


def test_the_settings_are_in_effect_for_the_tokenizers_library(folders):
    """The fixture means what it says: read as it is, the file pads a special token's text to 128 ids."""
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(folders["bert"] / "tokenizer.json"))
    assert len(raw.encode("[SEP]", add_special_tokens=False).ids) == LENGTH


def test_the_views_reader_drops_them(folders):
    from ckptfs.ggufview.tokenizer_read import RustTokenizer

    tokenizer = RustTokenizer(folders["bert"] / "tokenizer.json")
    sep = tokenizer.vocab()["[SEP]"]
    assert tokenizer.encode("[SEP]", add_special_tokens=False) == [sep]
    assert tokenizer.decode(tokenizer.encode("[SEP]", add_special_tokens=False)) == "[SEP]"
    assert len(tokenizer.encode(" ".join(["hello"] * 300), add_special_tokens=False)) == 300


@pytest.mark.parametrize("case,outtype", [("llama", "auto"), ("qwen2", "auto"), ("qwen3", "auto"),
                                          ("gemma3", "q8_0"), ("bert", "auto"), ("bert", "f16"),
                                          ("bert", "q8_0")])
def test_equal_to_the_converter(mounted_gguf, folders, converter, tmp_path, case, outtype):
    reference = convert(folders[case], tmp_path / "converted.gguf", outtype, pre=CASES[case][1])
    assert_same_gguf(mounted_gguf(folders[case], outtype), reference)
