"""``gguf/model.gguf`` of the architectures past llama (qwen2, qwen3, gemma3 text, phi3, BERT) against
llama.cpp's converter.

Tiny folders are made at test time (transformers configs, random weights as safetensors, tokenizers trained
with ``tokenizers`` or ``sentencepiece``): a qwen2 and a qwen3 with Qwen's split regex and special tokens
(no BOS), a gemma3 with a SentencePiece ``tokenizer.model`` (its norms served as ``weight + 1``) and one with
a ``tokenizer.json`` in F16 (the ``+ 1`` in float16, as the converter adds it to an F16 tensor), a phi3
(fused qkv and gate/up projections, its own SentencePiece rules; once with LongRoPE factors, which the
converter writes as two F32 tensors and an attention factor) and a BERT sentence-embedding folder
(WordPiece, mean pooling in ``modules.json``). Every key and tensor equals the converter's output (compared
as maps with gguf-py); llama.cpp generates the same greedy tokens from both files for the causal models, and
computes the same BERT sentence embedding (mean-pooled, float for float) from both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf_view_models import (PHI3_LONGROPE, assert_same_greedy, assert_same_gguf, convert, llama_client,
                              make_bert, make_causal)
from gguf_view_models import converter, mounted_gguf  # noqa: F401 - fixtures
from llama_models import probe  # noqa: F401 - fixture

pytest.importorskip("transformers")
pytest.importorskip("gguf")

N_PREDICT = 16
EMBED_TEXT = "The quick brown fox jumps over the lazy dog."
#: case -> (how it is made, the name the reference run registers the test tokenizer's pre-tokenizer under)
CASES = {
    "qwen2": (lambda path: make_causal(path, "qwen2"), "qwen2"),
    "qwen3": (lambda path: make_causal(path, "qwen3", dtype="float16", seed=1, kv_heads=4), "qwen2"),
    "gemma3": (lambda path: make_causal(path, "gemma3", tokenizer="spm", seed=2), "default"),
    "gemma3-f16": (lambda path: make_causal(path, "gemma3", dtype="float16", seed=3, hidden=48, heads=2,
                                            kv_heads=1), "llama-bpe"),
    "phi3": (lambda path: make_causal(path, "phi3", tokenizer="spm", seed=4), "default"),
    "phi3-longrope": (lambda path: make_causal(path, "phi3", tokenizer="spm", seed=6, rope=PHI3_LONGROPE),
                      "default"),
    "bert": (lambda path: make_bert(path, seed=5), "default"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {case: make(root / f"tiny-{case}") for case, (make, _) in CASES.items()}


@pytest.mark.parametrize("case,outtype", [("qwen2", "auto"), ("qwen2", "q8_0"), ("qwen3", "auto"),
                                          ("gemma3", "auto"), ("gemma3", "bf16"), ("gemma3-f16", "q8_0"),
                                          ("phi3", "auto"), ("phi3", "f32"), ("phi3-longrope", "auto"),
                                          ("bert", "auto"), ("bert", "q8_0")])
def test_equal_to_the_converter(mounted_gguf, folders, converter, tmp_path, case, outtype):
    reference = convert(folders[case], tmp_path / "converted.gguf", outtype, pre=CASES[case][1])
    assert_same_gguf(mounted_gguf(folders[case], outtype), reference)


def test_gemma_norms_are_stored_plus_one(mounted_gguf, folders):
    """The shift itself, against the stored tensor read with safetensors: F32 norm = stored + 1 in float32."""
    import torch
    from gguf import GGUFReader
    from safetensors import safe_open

    reader = GGUFReader(mounted_gguf(folders["gemma3"], "auto"))
    served = {t.name: np.array(t.data) for t in reader.tensors}
    with safe_open(folders["gemma3"] / "model.safetensors", "pt") as f:
        stored = f.get_tensor("model.layers.1.self_attn.q_norm.weight")
    assert stored.dtype == torch.bfloat16
    expected = (stored.float() + 1).numpy()
    assert np.array_equal(served["blk.1.attn_q_norm.weight"], expected)


def test_bert_keeps_embeddings_in_f32(mounted_gguf, folders):
    """Position and token-type embeddings stay F32 in q8_0 (llama.cpp reads them so); the pooler is gone."""
    from gguf import GGUFReader

    reader = GGUFReader(mounted_gguf(folders["bert"], "q8_0"))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["position_embd.weight"] == "F32" and types["token_types.weight"] == "F32"
    assert types["blk.0.attn_q.weight"] == "Q8_0"
    assert not any("pooler" in name for name in types)
    assert reader.fields["bert.pooling_type"].contents() == 1  # mean, from modules.json


def embedding(probe: Path, model: Path, mode: str = "mmap") -> np.ndarray:
    """llama.cpp's mean-pooled embedding of EMBED_TEXT, not normalized, as float32 (the probe prints each
    float with the digits that read back as the same float32)."""
    result = llama_client.run_embedding(model, EMBED_TEXT, mode, normalize=-1, probe=probe)
    assert result["pooling"] == "mean" and len(result["embedding"]) == result["n_embd"], result
    assert None not in result["embedding"], "llama.cpp computed a NaN or an infinity"
    if mode == "dio":
        assert not result["dio_fallback"], result["warnings"]
    return np.array(result["embedding"], dtype=np.float32)


@pytest.mark.parametrize("outtype", ["auto", "q8_0"])
def test_llama_cpp_bert_embedding(mounted_gguf, folders, converter, probe, tmp_path, outtype):
    """BERT makes no tokens to compare: llama.cpp's sentence embedding from the mount's file, in every load
    mode, is the one from the converter's file bit for bit (the same bytes, the same arithmetic)."""
    reference = convert(folders["bert"], tmp_path / "converted.gguf", outtype, pre="default")
    expected = embedding(probe, reference)
    assert np.isfinite(expected).all() and len(np.unique(expected)) > len(expected) // 2, expected
    served = mounted_gguf(folders["bert"], outtype)
    for mode in llama_client.MODES:
        assert embedding(probe, served, mode).view(np.uint32).tolist() == expected.view(np.uint32).tolist(), mode


def test_bert_embedding_sees_one_changed_weight(folders, converter, probe, tmp_path):
    """The comparison above can fail: the converter's file with one F16 weight of one FFN changed (a
    mantissa bit of its high byte) gives another embedding."""
    from gguf import GGUFReader

    reference = convert(folders["bert"], tmp_path / "converted.gguf", "auto", pre="default")
    tensor = next(t for t in GGUFReader(reference).tensors if t.name == "blk.0.ffn_up.weight")
    changed = tmp_path / "changed.gguf"
    data = bytearray(reference.read_bytes())
    data[tensor.data_offset + 1] ^= 0x01
    changed.write_bytes(bytes(data))
    assert not np.array_equal(embedding(probe, changed), embedding(probe, reference))


@pytest.mark.parametrize("case", ["qwen2", "qwen3", "gemma3", "phi3", "phi3-longrope"])
def test_llama_cpp_greedy_tokens(mounted_gguf, folders, converter, tmp_path, case):
    reference = convert(folders[case], tmp_path / "converted.gguf", "auto", pre=CASES[case][1])
    assert_same_greedy(reference, mounted_gguf(folders[case], "auto"), N_PREDICT)


def test_the_mount_command_prints_nothing(folders, tmp_path):
    """gguf-py's lines while the header is built (here: a post-processor's pair template naming an unknown
    separator, Gemma 3's keys written twice) go to the mount's debug log, not to the terminal."""
    import subprocess

    from conftest import ckptfs_cli, cli_env, force_unmount, require_fuse

    require_fuse(None)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run([*ckptfs_cli(), "mount", str(folders["gemma3-f16"]), str(mnt), "--gguf"], env=cli_env(),
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    try:
        assert done.returncode == 0, done.stderr
        assert (mnt / "gguf" / "model.gguf").exists()
        assert done.stderr == "" and done.stdout == ""
    finally:
        force_unmount(mnt)
