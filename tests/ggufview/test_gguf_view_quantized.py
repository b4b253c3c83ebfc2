"""``gguf/model.gguf`` of quantized folders against llama.cpp's converter.

Tiny folders made at test time in the releases' layouts (``gguf_quantized_models``): a Qwen3 in Qwen3-FP8's
block-scaled FP8 (BF16 ``weight_scale_inv``, blocks of 48 x 32 so the edge blocks are partial) and one with
one F32 scale per tensor, a Qwen3 in compressed-tensors ``nvfp4-pack-quantized``, a Llama in ModelOpt
``NVFP4`` (its q/k rows permuted, codes and group scales together) and one in ModelOpt ``MIXED_PRECISION``
(NVFP4 attention, FP8 MLP). The converter dequantizes the FP8
layers and repacks the NVFP4 ones into GGML NVFP4 with companion ``.scale`` / ``.input_scale`` tensors;
every key and tensor of the mount's file equals its output, and llama.cpp generates the same greedy tokens
from both.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from gguf_quantized_models import (ct_fp8_folder, ct_pack_folder, fp8_folder, gptq_folder, modelopt_mixed_folder,
                                   nvfp4_compressed_folder, nvfp4_modelopt_folder)
from gguf_view_models import (assert_same_greedy, assert_same_gguf, convert, gguf_maps, make_causal, make_llama,
                              s3_gguf_copy)
from gguf_view_models import converter, mounted_gguf  # noqa: F401 - fixtures
from cli_runs import run_cli
from llama_models import probe  # noqa: F401 - fixture

pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("safetensors")

N_PREDICT = 12
#: case -> (how it is made, the name the reference run registers the test tokenizer's pre-tokenizer under)
CASES = {
    "fp8-block": (lambda p: fp8_folder(make_causal(p, "qwen3", seed=11), (48, 32)), "qwen2"),
    "fp8-tensor": (lambda p: fp8_folder(make_causal(p, "qwen3", seed=12), None), "qwen2"),
    "nvfp4-ct": (lambda p: nvfp4_compressed_folder(make_causal(p, "qwen3", seed=13)), "qwen2"),
    "nvfp4-modelopt": (lambda p: nvfp4_modelopt_folder(make_llama(p, seed=14)), "llama-bpe"),
    "modelopt-mixed": (lambda p: modelopt_mixed_folder(make_llama(p, seed=15)), "llama-bpe"),
    "ct-fp8-channel": (lambda p: ct_fp8_folder(make_causal(p, "qwen3", seed=16), None), "qwen2"),
    "ct-fp8-block": (lambda p: ct_fp8_folder(make_causal(p, "qwen3", seed=17), (48, 32)), "qwen2"),
    "gptq": (lambda p: gptq_folder(make_causal(p, "qwen3", dtype="float16", seed=19)), "qwen2"),
    "ct-int4": (lambda p: ct_pack_folder(make_causal(p, "qwen3", seed=20)), "qwen2"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hfq")
    return {case: make(root / f"tiny-{case}") for case, (make, _) in CASES.items()}


@pytest.fixture(scope="module")
def references(folders, converter, tmp_path_factory) -> Callable[[str, str], Path]:
    root = tmp_path_factory.mktemp("converted")
    made: dict[tuple[str, str], Path] = {}

    def get(case: str, outtype: str) -> Path:
        if (case, outtype) not in made:
            made[case, outtype] = convert(folders[case], root / f"{case}-{outtype}.gguf", outtype, pre=CASES[case][1])
        return made[case, outtype]

    return get


@pytest.mark.parametrize("case,outtype", [("fp8-block", "auto"), ("fp8-block", "q8_0"), ("fp8-block", "f32"),
                                          ("fp8-tensor", "auto"), ("nvfp4-ct", "auto"),
                                          ("nvfp4-modelopt", "auto"), ("nvfp4-modelopt", "q8_0"),
                                          ("modelopt-mixed", "auto"), ("ct-fp8-channel", "auto"),
                                          ("ct-fp8-block", "q8_0"), ("gptq", "auto"), ("gptq", "f16"),
                                          ("ct-int4", "auto")])
def test_equal_to_the_converter(mounted_gguf, folders, references, case, outtype):
    reference = references(case, outtype)
    _, tensors = gguf_maps(reference)
    if "fp8" in case or case in ("gptq", "ct-int4"):  # dequantized: no FP8 code or scale left, the projections in the file type
        assert not any("scale" in name for name in tensors)
    elif case == "modelopt-mixed":  # NVFP4 attention, the FP8 MLP dequantized (no scale of its own left)
        assert tensors["blk.0.attn_q.weight"][0] == "NVFP4" and tensors["blk.0.ffn_down.weight"][0] == "BF16"
        assert "blk.0.attn_q.scale" in tensors and "blk.0.ffn_down.scale" not in tensors
    else:  # repacked: NVFP4 projections with their companion scales
        assert tensors["blk.0.attn_q.weight"][0] == "NVFP4"
        assert {"blk.0.attn_q.scale", "blk.0.attn_q.input_scale", "blk.1.ffn_down.scale"} <= set(tensors)
    assert_same_gguf(mounted_gguf(folders[case], outtype), reference)


def test_fp8_as_q8_equal_to_the_converter(mounted_gguf, folders, converter, tmp_path):
    """``--gguf-fp8-as-q8`` with ``bf16``: the dequantized FP8 projections in Q8_0, the rest in BF16, as the
    converter's ``--fp8-as-q8`` writes them."""
    folder = folders["fp8-block"]
    reference = convert(folder, tmp_path / "q8.gguf", "bf16", pre="qwen2", extra=("--fp8-as-q8",))
    types = {name: value[0] for name, value in gguf_maps(reference)[1].items()}
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["token_embd.weight"] == "BF16"
    mine = mounted_gguf.mount(folder, "--gguf", "--gguf-type", "bf16", "--gguf-fp8-as-q8") / "gguf" / "model.gguf"
    assert_same_gguf(mine, reference)


@pytest.mark.parametrize("case", list(CASES))
def test_same_greedy_tokens(mounted_gguf, folders, references, probe, case):
    assert_same_greedy(references(case, "auto"), mounted_gguf(folders[case], "auto"), N_PREDICT)


CT_TENSOR = {"quant_method": "compressed-tensors", "format": "float-quantized",
             "config_groups": {"group_0": {"targets": ["Linear"], "format": "float-quantized", "weights": {
                 "num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}}}}


@pytest.mark.parametrize("settings,expected", [
    (CT_TENSOR, "strategy 'tensor'"),
    ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, "quant_method 'fbgemm_fp8'")])
def test_a_method_the_converter_does_not_convert_is_one_line(folders, tmp_path, settings, expected):
    """A compressed-tensors FP8 folder of per-tensor strategy (the converter asserts channel or block) and an
    fbgemm FP8 one (a method it does not know): ``ckptfs info --gguf`` says why in one line."""
    folder = tmp_path / "tiny-refused"
    shutil.copytree(folders["fp8-tensor"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = settings
    (folder / "config.json").write_text(json.dumps(config))
    _rename_scales(folder)  # both name a weight's scale weight_scale
    result = run_cli("info", "--gguf", str(folder))
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("gguf/"))
    assert line.startswith("gguf/: none:") and expected in line, line
    assert "Traceback" not in result.stdout + result.stderr


def _rename_scales(folder: Path) -> None:
    """``weight_scale_inv`` renamed ``weight_scale``."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    save_file({name.replace("weight_scale_inv", "weight_scale"): value for name, value in tensors.items()}, path,
              metadata={"format": "pt"})


def test_s3_nvfp4_folder_equal_to_the_converter(mounted, folders, references, tmp_path):
    """An ``s3://`` (moto) copy of the ModelOpt NVFP4 folder: its parts are read through the remote sources,
    and the file equals the converter's output on the local folder."""
    pytest.importorskip("boto3")
    copy = s3_gguf_copy(mounted, folders["nvfp4-modelopt"], tmp_path / "copy.gguf")
    assert_same_gguf(copy, references("nvfp4-modelopt", "auto"))


def test_nvfp4_rows_not_whole_blocks_are_one_line(tmp_path):
    """NVFP4 weights of 96 columns (6 groups of 16, not whole 64-value GGML blocks): the converter cannot
    repack them (it fails on a reshape); ``ckptfs info --gguf`` says so in one line."""
    folder = nvfp4_modelopt_folder(make_llama(tmp_path / "tiny-nvfp4-96", seed=18, hidden=96, heads=4, kv_heads=2))
    result = run_cli("info", "--gguf", str(folder))
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("gguf/"))
    assert line.startswith("gguf/: none:") and "not whole NVFP4 blocks of 64" in line, line


def test_gptq_in_another_type_than_its_views_is_one_line(folders, tmp_path):
    """The GPTQ views round to F16 as AutoGPTQ computes; the converter writes the unrounded float32 values,
    so only an F16 file can be its output: ``mount --gguf --gguf-type q8_0`` fails with one line."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_cli("mount", str(folders["gptq"]), str(mnt), "--gguf", "--gguf-type", "q8_0")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "served in --gguf-type f16 only" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
