"""model.gguf of a split GGUF set through a real mount, checked with gguf-py's reader; hf/ of a split set.

The set is written by gguf-py's splitting writer (gguf-split's layout). gguf-py's GGUFReader opens the
mount's model.gguf: the key/value pairs are the first shard's without split.*, and every tensor (name, type,
shape, stored bytes) equals the set's, in order. transformers loads both model.gguf (gguf_file=) and hf/.
"""

from __future__ import annotations

import pytest
from gguf import GGUFReader
from hf_models import sentencepiece_vocab, split_copy, write_model
from multifile_sets import gguf_tensors, write_split_gguf
from multifile_sets import check_merged
from multifile_sets import _fields, _tensors  # noqa: F401








def test_model_gguf_of_a_split_set(mounted, tmp_path):
    shards = write_split_gguf(tmp_path / "set", gguf_tensors(count=9), per_shard=2)
    assert len(shards) >= 4
    for name in (shards[0], shards[-1]):  # any shard opens the set
        mnt = mounted(str(name))
        check_merged(GGUFReader(str(mnt / "model.gguf")), shards)


def test_small_first_shard(mounted, tmp_path):
    """gguf-split --no-tensor-first-split: shard 1 holds only the metadata."""
    shards = write_split_gguf(tmp_path / "set", gguf_tensors(count=5), per_shard=2, small_first_shard=True)
    mnt = mounted(str(shards[1]))
    check_merged(GGUFReader(str(mnt / "model.gguf")), shards)


def test_no_model_gguf_for_a_single_file_or_an_incomplete_set(mounted, tmp_path):
    shards = write_split_gguf(tmp_path / "set", gguf_tensors(count=6), per_shard=2)
    shards[-1].unlink()
    assert not (mounted(str(shards[0])) / "model.gguf").exists()
    single = write_model(tmp_path / "one.gguf", "llama", sentencepiece_vocab(tmp_path / "spm", gemma=False))
    assert not (mounted(str(single.path)) / "model.gguf").exists()


def test_split_llama_model_gguf_and_hf_folder_load_in_transformers(mounted, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    single = write_model(tmp_path / "llama.gguf", "llama", sentencepiece_vocab(tmp_path / "spm", gemma=False)).path
    shards = split_copy(single, tmp_path / "split", per_shard=6)
    assert len(shards) == 4
    mnt = mounted(str(shards[2]), "--hf", "--hf-dtype", "float32")
    check_merged(GGUFReader(str(mnt / "model.gguf")), shards)

    ids = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="llama.gguf")("Hello naïve 日本",
                                                                                return_tensors="pt")["input_ids"]
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="llama.gguf").eval()
    merged = AutoModelForCausalLM.from_pretrained(str(mnt), gguf_file="model.gguf").eval()
    from_hf = AutoModelForCausalLM.from_pretrained(str(mnt / "hf")).eval()
    with torch.no_grad():
        expected = reference(ids).logits
        assert torch.equal(merged(ids).logits, expected)
        assert torch.equal(from_hf(ids).logits, expected)
