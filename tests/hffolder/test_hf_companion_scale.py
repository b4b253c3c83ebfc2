"""hf/ of a GGUF whose weights carry companion scales (``X.scale``, as llama.cpp's converter writes a ModelOpt
NVFP4 model's second-level scales): the parameter is the weight times its scale, as llama.cpp computes the
layer; an ``X.input_scale`` (activations) is never applied. The oracle for the weights is transformers' own GGUF
loader on the same GGUF without the scales; the product is one float32 multiply.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytest.importorskip("accelerate")  # transformers needs it for gguf_file=

from fixtures import write_gguf  # noqa: E402
from hf_models import Shape, _arch_metadata, _layer_shapes, _weights, sentencepiece_vocab  # noqa: E402
from safetensors import safe_open  # noqa: E402

SCALES = {"blk.0.attn_q": 0.37, "blk.1.ffn_down": 1.5}


def test_companion_scales_are_applied(tmp_path, mounted):
    from transformers import AutoModelForCausalLM

    vocab = sentencepiece_vocab(tmp_path / "spm", gemma=False)
    shape = Shape()
    tensors = _weights(_layer_shapes("llama", shape, vocab.size, False), np.random.default_rng(3), 1.0,
                       ("Q8_0", "F16", "F32"))
    metadata = {**_arch_metadata("llama", shape), **vocab.metadata}
    plain, folder = tmp_path / "plain", tmp_path / "m"
    plain.mkdir()
    folder.mkdir()
    # transformers' loader cannot read the file with the scales (its LLaMA processor permutes attn_q.scale too):
    # its weights come from the same GGUF without them
    write_gguf(plain / "llama.gguf", tensors, metadata, arch="llama")
    for base, value in SCALES.items():
        tensors[base + ".scale"] = (np.array([value], np.float32), "F32")
    tensors["blk.1.ffn_down.input_scale"] = (np.array([0.25], np.float32), "F32")
    write_gguf(folder / "llama.gguf", tensors, metadata, arch="llama")

    reference = AutoModelForCausalLM.from_pretrained(str(plain), gguf_file="llama.gguf", dtype=torch.float32)
    want = {k: v.detach().clone().numpy() for k, v in reference.state_dict().items()}
    scaled = {"model.layers.0.self_attn.q_proj.weight": np.float32(0.37),
              "model.layers.1.mlp.down_proj.weight": np.float32(1.5)}
    hf = mounted(str(folder / "llama.gguf"), "--hf", "--hf-dtype", "float32") / "hf"
    with safe_open(str(hf / "model.safetensors"), "np") as f:
        names = set(f.keys())
        assert not any(name.endswith(("scale", "input_scale")) for name in names)
        for name in names:
            got = f.get_tensor(name)
            expected = want[name] * scaled[name] if name in scaled else want[name]
            assert got.dtype == np.float32 and np.array_equal(got, expected), name
    assert scaled.keys() <= names
