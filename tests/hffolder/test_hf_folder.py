"""hf/ in a real mount (--hf) of generated llama, qwen2 and gemma3 GGUFs, against transformers' own GGUF loader.

The oracle is ``from_pretrained(dir, gguf_file=...)`` (gguf-py's reader and dequantizer, transformers' tensor
processors): the mount's folder must give the same config, the same tokenizer ids on a varied corpus, the
same parameters and bit-identical float32 logits; every file must be readable with cat, and the weights
with safetensors' own ``safe_open``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytest.importorskip("tokenizers")
pytest.importorskip("accelerate")  # transformers needs it for gguf_file=

from conftest import REPO, skip_or_fail  # noqa: E402
from hf_models import byte_level_vocab, probe_texts, sentencepiece_vocab, write_model  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

ARCHS = ("llama", "qwen2", "gemma3")
HF_FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> (folder, file name) of each generated GGUF (one folder each, as a Hub repo would hold it)."""
    out = {}
    for arch in ARCHS:
        folder = tmp_path_factory.mktemp(f"gguf-{arch}")
        vocab = (byte_level_vocab() if arch == "qwen2"
                 else sentencepiece_vocab(folder / "spm", gemma=arch == "gemma3"))
        write_model(folder / f"{arch}.gguf", arch, vocab)
        out[arch] = (folder, f"{arch}.gguf", vocab.specials)
    return out


def _owned(model):
    """``model`` with its own copies of its parameters, made at once. In whole-suite runs (never alone) the
    logits of one side or the other came out different at the first positions (once as freed memory: 6.7e7,
    4.6e-41), as if a parameter had stayed a view of a mapping its loader does not keep alive (gguf-py's
    memmap, safetensors' mmap). The values compared are what each loader produced, copied when it did."""
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.clone()
    return model


@pytest.fixture(scope="module")
def reference(models):
    """arch -> (tokenizer, float32 model) loaded by transformers from the GGUF itself."""
    refs = {}
    for arch, (folder, name, _) in models.items():
        tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name, dtype=torch.float32)
        refs[arch] = (tok, _owned(model).eval())
    return refs


@pytest.fixture(scope="module")
def f32_mounts(module_mounted, models):
    return {arch: module_mounted(str(folder / name), "--hf", "--hf-dtype", "float32")
            for arch, (folder, name, _) in models.items()}


def _without_names(config: dict) -> dict:
    """A config without what the GGUF loader leaves unset or fills with names of its own (``architectures``
    is checked on its own: ``test_config_names_the_causal_lm_class``)."""
    return {k: v for k, v in config.items()
            if k not in ("_name_or_path", "dtype", "transformers_version", "architectures")}


@pytest.mark.parametrize("arch", ARCHS)
def test_every_file_reads_with_cat_and_safe_open(arch, f32_mounts, reference):
    hf = f32_mounts[arch] / "hf"
    assert set(p.name for p in hf.iterdir()) == HF_FILES
    listing = subprocess.run(["ls", "-la", str(hf)], capture_output=True, text=True)  # xattrs of a folder too
    assert (listing.returncode, listing.stderr) == (0, "")
    assert os.listxattr(hf) == []
    for path in hf.iterdir():
        catted = subprocess.run(["cat", str(path)], capture_output=True, check=True).stdout
        assert len(catted) == path.stat().st_size
        assert catted == path.read_bytes()
    for name in HF_FILES - {"model.safetensors"}:
        json.loads((hf / name).read_text(encoding="utf-8"))
    expected = reference[arch][1].state_dict()
    with safe_open(str(hf / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        for key in keys:
            assert torch.equal(f.get_tensor(key), expected[key]), key
    tied = {"lm_head.weight"} if reference[arch][1].config.tie_word_embeddings else set()
    assert keys == set(expected) - tied


@pytest.mark.parametrize("arch", ARCHS)
def test_config_equals_transformers_gguf_config(arch, f32_mounts, models):
    folder, name, _ = models[arch]
    mine = AutoConfig.from_pretrained(str(f32_mounts[arch] / "hf")).to_dict()
    theirs = AutoConfig.from_pretrained(str(folder), gguf_file=name).to_dict()
    assert _without_names(mine) == _without_names(theirs)
    assert mine["dtype"] == "float32"


#: The class a Hugging Face folder of each generated model names (transformers' causal-LM class for the type).
CAUSAL_LM = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}

_LLAMA_CPP_ARCH = """
import json, sys
sys.path[:0] = [sys.argv[1] + "/gguf-py", sys.argv[1]]
import gguf
from conversion import ModelType, get_model_architecture, get_model_class
arch = get_model_architecture(json.load(open(sys.argv[2])), ModelType.TEXT)
print(arch, gguf.MODEL_ARCH_NAMES[get_model_class(arch).model_arch])
"""


def _llama_cpp_source():
    """llama.cpp's source tree (its ``convert_hf_to_gguf.py`` and ``conversion`` package), built by setup."""
    if str(REPO / "scripts") not in sys.path:
        sys.path.append(str(REPO / "scripts"))
    import llama_client

    source = llama_client.probe_path().parent.parent / "src" / "llama.cpp"
    if not (source / "conversion" / "__init__.py").is_file():
        skip_or_fail(f"llama.cpp's converter is not at {source}: run bash scripts/build_llama_cpp.sh")
    return source


@pytest.mark.parametrize("arch", ARCHS)
def test_config_names_the_causal_lm_class(arch, f32_mounts, models):
    """config.json's ``architectures`` names the class transformers builds for the model type, and llama.cpp's
    converter detects it and maps it back to the GGUF's own architecture (without the key it stops with
    'Failed to detect model architecture')."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = json.loads((f32_mounts[arch] / "hf" / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == [CAUSAL_LM[arch]]
    assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config["model_type"]] == CAUSAL_LM[arch]
    assert getattr(transformers, CAUSAL_LM[arch]).config_class.model_type == config["model_type"]
    detected = subprocess.run([sys.executable, "-c", _LLAMA_CPP_ARCH, str(_llama_cpp_source()),
                               str(f32_mounts[arch] / "hf" / "config.json")],
                              capture_output=True, text=True, timeout=300)
    assert detected.returncode == 0, detected.stderr[-2000:]
    assert detected.stdout.split() == [CAUSAL_LM[arch], arch]


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_ids_equal(arch, f32_mounts, models, reference):
    ref_tok = reference[arch][0]
    tok = AutoTokenizer.from_pretrained(str(f32_mounts[arch] / "hf"))
    texts = probe_texts(models[arch][2])
    for text in texts:
        assert tok(text)["input_ids"] == ref_tok(text)["input_ids"], repr(text)
    ids = tok("\n".join(texts))["input_ids"]
    assert tok.decode(ids) == ref_tok.decode(ids)
    assert (tok.bos_token, tok.eos_token, tok.unk_token) == (ref_tok.bos_token, ref_tok.eos_token, ref_tok.unk_token)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_bit_identical_in_float32(arch, f32_mounts, models, reference):
    ref_tok, ref_model = reference[arch]
    model = _owned(AutoModelForCausalLM.from_pretrained(str(f32_mounts[arch] / "hf"))).eval()
    assert model.dtype == torch.float32
    batch = ref_tok(probe_texts(models[arch][2])[:6], return_tensors="pt", padding=True) \
        if ref_tok.pad_token is not None else None
    inputs = [ref_tok(text, return_tensors="pt")["input_ids"] for text in ("Hello world naïve 日本", "def f(x):\n\treturn x")]
    with torch.no_grad():
        for ids in inputs:
            assert torch.equal(model(ids).logits, ref_model(ids).logits)
        if batch is not None:
            assert torch.equal(model(**batch).logits, ref_model(**batch).logits)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_bfloat16_default_rounds_as_torch(arch, module_mounted, models, reference):
    """The default --hf-dtype: every parameter is the float32 reference .to(torch.bfloat16), bit for bit."""
    folder, name, _ = models[arch]
    hf = module_mounted(str(folder / name), "--hf") / "hf"
    expected = reference[arch][1].state_dict()
    with safe_open(str(hf / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            got = f.get_tensor(key)
            assert got.dtype == torch.bfloat16
            assert torch.equal(got.view(torch.int16), expected[key].to(torch.bfloat16).view(torch.int16)), key
    assert json.loads((hf / "config.json").read_text())["dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(str(hf))
    assert model.dtype == torch.bfloat16


def test_float16(module_mounted, models, reference):
    folder, name, _ = models["qwen2"]
    hf = module_mounted(str(folder / name), "--hf", "--hf-dtype", "float16") / "hf"
    expected = reference["qwen2"][1].state_dict()
    with safe_open(str(hf / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            assert torch.equal(f.get_tensor(key).view(torch.int16), expected[key].to(torch.float16).view(torch.int16))


def test_generation_config_takes_the_tokenizer_ids(f32_mounts, reference):
    hf = f32_mounts["qwen2"] / "hf"
    generation = json.loads((hf / "generation_config.json").read_text())
    tok = reference["qwen2"][0]
    assert generation["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>")
    assert generation["pad_token_id"] == tok.convert_tokens_to_ids("<|endoftext|>")


def test_api_folder_equals_the_mount(f32_mounts, models, tmp_path):
    import ckptfs

    folder, name, _ = models["llama"]
    hf = ckptfs.hf_folder(str(folder / name), dtype="float32")
    try:
        saved = hf.write_to(tmp_path / "saved")
        for file in HF_FILES:
            assert (saved / file).read_bytes() == (f32_mounts["llama"] / "hf" / file).read_bytes(), file
    finally:
        hf.close()
