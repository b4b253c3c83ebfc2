"""``--hf`` of a quantized safetensors folder: ``hf/`` is the unquantized release, through real FUSE mounts.

Each scheme's folder is written by its producer (or with numpy + ml_dtypes in its release layout) beside a
tokenizer, a generation config and a chat template; ``hf/`` must hold the release: ``config.json`` without
``quantization_config`` and with the served dtype, no quantization settings files, the other files byte for
byte, and safetensors whose tensors are exactly the release's names and shapes, each value the oracle's float32
value rounded once to bfloat16 (ml_dtypes' round-to-nearest-even, torch's), with no scheme part left.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path

import numpy as np
import pytest
from cli_runs import one_error_line, run_cli
from counting import Counting
from fp4_fixtures import (GPT_OSS_CONFIG, as_numpy, ct_config, ct_layer, gptoss_experts, gptoss_formula,
                          modelopt_nvfp4_layer, nvfp4_formula, write_torch_folder)
from fp8_fixtures import BF16, E4M3, block_quantize, expected_blocks, write_model
from packed_fixtures import awq_gemm_layer, gptq_layer, write_folder

import ckptfs
from ckptfs.checkpoint.api import Checkpoint
from ckptfs.formats.multi import read_checkpoint

LINEAR = "model.layers.0.mlp.down_proj"
NORM = "model.norm.weight"
#: the files a release keeps byte for byte (a tokenizer, generation settings, a chat template)
KEPT = {"tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}\n',
        "tokenizer_config.json": b'{"model_max_length": 128}',
        "generation_config.json": b'{"bos_token_id": 1, "eos_token_id": 2}',
        "chat_template.jinja": "{% for m in messages %}{{ m['content'] }} \u00e9{% endfor %}".encode()}


def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (dtype, shape, bytes) of a safetensors file, parsed here (not by ckptfs)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {name: (h["dtype"], h["shape"], data[8 + n + h["data_offsets"][0]: 8 + n + h["data_offsets"][1]])
            for name, h in header.items()}


def bf16_of(values: np.ndarray) -> bytes:
    """float32 values rounded once to bfloat16 (ml_dtypes: nearest, ties to even), NaN as torch writes it."""
    bits = np.asarray(values, np.float32).astype(BF16).view(np.uint16).copy()
    bits[np.isnan(values)] = 0xFFFF
    return bits.tobytes()


def with_kept_files(folder: Path) -> Path:
    for name, data in KEPT.items():
        (folder / name).write_bytes(data)
    return folder


def fp8_block(root: Path):
    rng = np.random.default_rng(1)
    codes, scales = block_quantize(rng, (200, 136), (128, 128), np.float32)   # partial tiles both ways
    norm = rng.standard_normal(136).astype(np.float32)
    folder = write_model(root, {LINEAR + ".weight": codes, LINEAR + ".weight_scale_inv": scales,
                                NORM: norm.astype(BF16)},
                         {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                          "weight_block_size": [128, 128]})
    return folder, {LINEAR + ".weight": expected_blocks(codes, scales, (128, 128)),
                    NORM: norm.astype(BF16).astype(np.float32)}


def fbgemm(root: Path):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((72, 40)).astype(np.float32)
    scale = (np.abs(w).max(axis=1, keepdims=True) / np.float32(448)).astype(np.float32)
    codes = (w / scale).astype(E4M3)
    norm = rng.standard_normal(40).astype(BF16)
    folder = write_model(root, {LINEAR + ".weight": codes, LINEAR + ".weight_scale": scale, NORM: norm},
                         {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                          "modules_to_not_convert": ["lm_head"]})
    return folder, {LINEAR + ".weight": codes.astype(np.float32) * scale, NORM: norm.astype(np.float32)}


def ct_nvfp4(root: Path):
    config, tensors = ct_layer("NVFP4", 48, 128, seed=3, edge_scales=False)
    a = {k: as_numpy(v) for k, v in tensors.items()}
    folder = write_torch_folder(root, {f"{LINEAR}.{k}": v for k, v in tensors.items()},
                                {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                 "torch_dtype": "bfloat16",
                                 "quantization_config": ct_config({"group_0": config}, config["format"])})
    return folder, {LINEAR + ".weight": nvfp4_formula(a["weight_packed"], a["weight_scale"],
                                                      a["weight_global_scale"], True)}


def modelopt_nvfp4(root: Path):
    layer = modelopt_nvfp4_layer(np.random.default_rng(4), 40, 96)
    a = {k: as_numpy(v) for k, v in layer.items()}
    doc = {"producer": {"name": "modelopt", "version": "0.29.0"},
           "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                            "exclude_modules": ["lm_head"]}}
    folder = write_torch_folder(root, {f"{LINEAR}.{k}": v for k, v in layer.items()},
                                {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
                                {"hf_quant_config.json": doc})
    return folder, {LINEAR + ".weight": nvfp4_formula(a["weight"], a["weight_scale"], a["weight_scale_2"],
                                                      divide=False)}


def gpt_oss(root: Path):
    rng = np.random.default_rng(5)
    parts = gptoss_experts(rng, 2, 64, 64)
    experts = "model.layers.0.mlp.experts.gate_up_proj"
    stored = {f"{experts}_{role}": value for role, value in parts.items()}
    router = rng.standard_normal((2, 64)).astype(np.float32)
    stored["model.layers.0.mlp.router.weight"] = router
    folder = write_folder(root, {}, GPT_OSS_CONFIG, extra_tensors=stored)
    return folder, {experts: gptoss_formula(parts["blocks"], parts["scales"]), experts + "_bias": parts["bias"],
                    "model.layers.0.mlp.router.weight": router}


def bnb_nf4(root: Path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from packed.bnb_fixtures import bnb_config, dequantize_4bit, quantize_4bit
    from packed.bnb_fixtures import write_folder as write_bnb

    torch.manual_seed(6)
    weight = torch.randn(72, 100, dtype=torch.bfloat16)    # 7200 values: blocks of 64 straddle rows
    tensors = quantize_4bit(weight, "nf4", 64, double_quant=True)
    norm = torch.randn(100, dtype=torch.bfloat16)
    folder = write_bnb(root, {LINEAR: tensors}, bnb_config(4, "nf4", True), extra={NORM: norm})
    return folder, {LINEAR + ".weight": dequantize_4bit(tensors, torch.float32).numpy(),
                    NORM: norm.float().numpy()}


def ct_fp8_dynamic(root: Path):
    """compressed-tensors ``float-quantized`` per channel (``*-FP8-dynamic``): E4M3 codes, a BF16 scale per row;
    the oracle is its own ``NaiveQuantizationCompressor.decompress`` (in the scale's dtype)."""
    torch = pytest.importorskip("torch")
    from compressed_tensors.compressors.naive_quantized.base import NaiveQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    rng = np.random.default_rng(13)
    w = rng.standard_normal((56, 80)).astype(np.float32)
    scale = (np.abs(w).max(axis=1, keepdims=True) / np.float32(448)).astype(BF16)
    codes = (w / scale.astype(np.float32)).astype(E4M3)
    weights = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
    tensors = {"weight": torch.from_numpy(codes.view(np.uint8).copy()).view(torch.float8_e4m3fn),
               "weight_scale": torch.from_numpy(scale.view(np.uint16).copy()).view(torch.bfloat16)}
    scheme = QuantizationScheme(targets=["Linear"], weights=weights)
    oracle = NaiveQuantizationCompressor.decompress(dict(tensors), scheme)["weight"]
    expected = codes.astype(np.float32) * scale.astype(np.float32)
    assert bf16_of(expected) == oracle.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    group = {"targets": ["Linear"], "weights": weights, "format": "float-quantized"}
    folder = write_torch_folder(root, {f"{LINEAR}.{k}": v for k, v in tensors.items()},
                                {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                 "quantization_config": ct_config({"group_0": group}, "float-quantized")})
    return folder, {LINEAR + ".weight": expected}


def bnb_int8(root: Path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from packed.bnb_fixtures import bnb_config, dequantize_int8, quantize_int8
    from packed.bnb_fixtures import write_folder as write_bnb

    torch.manual_seed(14)
    tensors = quantize_int8(torch.randn(40, 72) * 2)
    folder = write_bnb(root, {LINEAR: tensors}, bnb_config(8))
    return folder, {LINEAR + ".weight": dequantize_int8(tensors).float().numpy()}


def gptq(root: Path):
    layer = gptq_layer(np.random.default_rng(7), 64, 128, 4, 32)
    config = {"bits": 4, "group_size": 32, "desc_act": False, "sym": True}
    folder = write_folder(root, {LINEAR: layer.tensors}, config, config_file="quantize_config.json")
    return folder, {LINEAR + ".weight": layer.expected()}


def awq(root: Path):
    layer = awq_gemm_layer(np.random.default_rng(8), 64, 128, 32)
    folder = write_folder(root, {LINEAR: layer.tensors},
                          {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"})
    return folder, {LINEAR + ".weight": layer.expected()}


SCHEMES = {"fp8": fp8_block, "fbgemm": fbgemm, "ct-nvfp4": ct_nvfp4, "modelopt-nvfp4": modelopt_nvfp4,
           "gpt-oss": gpt_oss, "bnb-nf4": bnb_nf4, "bnb-int8": bnb_int8, "ct-fp8-dynamic": ct_fp8_dynamic,
           "gptq": gptq, "awq": awq}


def check_release(hf: Path, expected: dict[str, np.ndarray], source: Path) -> None:
    names = sorted(os.listdir(hf))
    assert names == sorted([*KEPT, "config.json", "model.safetensors"]), names
    for name, data in KEPT.items():
        assert (hf / name).read_bytes() == data, name
    config = json.loads((hf / "config.json").read_text())
    own = json.loads((source / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == "bfloat16"
    assert {k: v for k, v in config.items() if k != "torch_dtype"} == {
        k: v for k, v in own.items() if k not in ("torch_dtype", "quantization_config")}
    tensors = read_safetensors(hf / "model.safetensors")
    assert sorted(tensors) == sorted(expected)   # the release's names: no scale, zero point, absmax or codes
    for name, values in expected.items():
        dtype, shape, data = tensors[name]
        assert (dtype, shape) == ("BF16", list(values.shape)), name
        assert data == bf16_of(values), name


@pytest.fixture(scope="module")
def schemes(tmp_path_factory):
    """A repository: one folder per scheme, with their expected release tensors."""
    root = tmp_path_factory.mktemp("repo")
    made = {}
    for name, make in SCHEMES.items():
        folder, expected = make(root / name)
        made[name] = (with_kept_files(folder), expected)
    return root, made


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_hf_of_each_scheme_is_the_release(schemes, mounted, scheme):
    _, made = schemes
    folder, expected = made[scheme]
    mnt = mounted(str(folder), "--hf")
    check_release(mnt / "hf", expected, folder)
    assert (mnt / "config.json").read_bytes() == (folder / "config.json").read_bytes()   # the folder's own


def test_the_release_needs_no_torch(tmp_path, mounted):
    """A quantized folder's hf/ is made without transformers or torch: the daemon maps no libtorch after the
    whole release was read."""
    from conftest import mount_stats

    folder, _ = fp8_block(tmp_path / "m")
    mnt = mounted(str(folder), "--hf")
    assert read_safetensors(mnt / "hf" / "model.safetensors")
    with open(f"/proc/{mount_stats(mnt)['pid']}/maps") as f:
        assert "libtorch" not in f.read()


def test_float32_and_float16_are_the_values_rounded_once(tmp_path, mounted):
    """``--hf-dtype float32`` serves the view's float32 bytes; float16 rounds them once, under ``--dtype float16``
    of the views too (never the float16 view rounded again)."""
    folder, expected = fp8_block(tmp_path / "m")
    values = expected[LINEAR + ".weight"]
    f32 = read_safetensors(mounted(str(folder), "--hf", "--hf-dtype", "float32") / "hf" / "model.safetensors")
    assert f32[LINEAR + ".weight"][0] == "F32" and f32[LINEAR + ".weight"][2] == values.tobytes()
    mnt = mounted(str(folder), "--hf", "--hf-dtype", "float16", "--dtype", "float16")
    assert json.loads((mnt / "hf" / "config.json").read_text())["torch_dtype"] == "float16"
    f16 = read_safetensors(mnt / "hf" / "model.safetensors")
    assert f16[LINEAR + ".weight"][2] == values.astype(np.float16).tobytes()


def test_a_release_of_scaled_codes_and_bf16_tensors_is_read_in_c(tmp_path, mounted):
    """An FP8 folder's release (the FP8 layer, a BF16 norm) is read in C, its bytes those Python serves
    (``CKPTFS_C_READS=0``) and the formula's rounded once, whole and at odd O_DIRECT offsets; a release that
    holds a tensor to convert (an F32 norm served as bfloat16) stays Python's."""
    from conftest import mount_stats
    from mount_expect import read_direct

    folder, expected = fp8_block(tmp_path / "m")
    folder = with_kept_files(folder)
    mnt = mounted(str(folder), "--hf")
    python = mounted(str(folder), "--hf", env={"CKPTFS_C_READS": "0"})
    data = (python / "hf" / "model.safetensors").read_bytes()
    check_release(mnt / "hf", expected, folder)
    assert (mnt / "hf" / "model.safetensors").read_bytes() == data
    rng = np.random.default_rng(2)
    ranges = [(0, 9), (7, 4096), (len(data) - 5, 10)] + [
        (int(rng.integers(0, len(data))), int(rng.integers(1, 9000))) for _ in range(30)]
    for (offset, size), got in zip(ranges, read_direct(mnt / "hf" / "model.safetensors", ranges)):
        assert got == data[offset:offset + size], (offset, size)
    served = mount_stats(mnt)["c_reads"]
    assert served["handed_back"] == 0 and served["bytes"] >= 2 * len(data)
    assert mount_stats(python)["c_reads"]["bytes"] == 0

    other = tmp_path / "f32norm"
    rng = np.random.default_rng(3)
    codes, scales = block_quantize(rng, (64, 64), (32, 32), np.float32)
    write_model(other, {LINEAR + ".weight": codes, LINEAR + ".weight_scale_inv": scales,
                        NORM: rng.standard_normal(64).astype(np.float32)},
                {"quant_method": "fp8", "weight_block_size": [32, 32]})
    mnt = mounted(str(other), "--hf")
    tensors = read_safetensors(mnt / "hf" / "model.safetensors")
    assert tensors[LINEAR + ".weight"][2] == bf16_of(expected_blocks(codes, scales, (32, 32)))
    assert mount_stats(mnt)["c_reads"]["bytes"] == 0


SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def sharded_fp8(folder: Path) -> dict[str, np.ndarray]:
    """Two source shards (with their index) each holding an FP8 layer; the expected release tensors."""
    from fp8_fixtures import write_safetensors

    rng = np.random.default_rng(9)
    tensors, expected = {}, {}
    for i in range(2):
        codes, scales = block_quantize(rng, (64, 96), (32, 32), np.float32)
        prefix = f"model.layers.{i}.mlp.down_proj"
        tensors.update({prefix + ".weight": codes, prefix + ".weight_scale_inv": scales})
        expected[prefix + ".weight"] = expected_blocks(codes, scales, (32, 32))
    write_model(folder, {}, {"quant_method": "fp8", "weight_block_size": [32, 32]})
    os.remove(folder / "model.safetensors")
    names = list(tensors)
    write_safetensors(folder / SHARDS[0], {n: tensors[n] for n in names[:2]})
    write_safetensors(folder / SHARDS[1], {n: tensors[n] for n in names[2:]})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: SHARDS[k // 2] for k, n in enumerate(names)}}))
    return expected


def check_sharded(hf: Path, expected: dict[str, np.ndarray]) -> None:
    assert sorted(os.listdir(hf)) == sorted(["config.json", "model.safetensors.index.json", *SHARDS])
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"model.layers.0.mlp.down_proj.weight": SHARDS[0],
                                   "model.layers.1.mlp.down_proj.weight": SHARDS[1]}
    assert index["metadata"]["total_size"] == sum(v.size * 2 for v in expected.values())
    for name, file in index["weight_map"].items():
        tensors = read_safetensors(hf / file)
        assert list(tensors) == [name] and tensors[name][2] == bf16_of(expected[name])


def test_sharded_release_has_an_index(tmp_path, mounted):
    """Two source shards each holding a layer: two release shards under their names and an index."""
    expected = sharded_fp8(tmp_path / "m")
    check_sharded(mounted(str(tmp_path / "m"), "--hf") / "hf", expected)


def test_a_repository_member_gets_its_release(tmp_path, mounted):
    """A folder holding a quantized model (index, shards, config) and another indexed checkpoint is a
    repository: the model's member folder gets its release; the other member, with no quantized layer, is
    served without hf/ (logged)."""
    expected = sharded_fp8(tmp_path / "repo")
    write_model(tmp_path / "plain", {NORM: np.ones(8, np.float32)}, None)
    os.rename(tmp_path / "plain" / "model.safetensors", tmp_path / "repo" / "extra.safetensors")
    (tmp_path / "repo" / "extra.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {NORM: "extra.safetensors"}}))
    log = tmp_path / "mount.log"
    mnt = mounted(str(tmp_path / "repo"), "--hf", "--log-file", str(log))
    check_sharded(mnt / "model" / "hf", expected)
    assert (mnt / "extra" / (NORM + ".npy")).exists() and not (mnt / "extra" / "hf").exists()
    assert "no hf/ folder" in log.read_text()


def test_a_small_read_decodes_only_the_tiles_under_it(tmp_path):
    """4 KiB in the middle of a 1024 x 2048 FP8 layer's bfloat16 bytes read the codes of the served group's
    rows only, far less than the layer's 2 MiB of codes (counted at the source)."""
    rng = np.random.default_rng(10)
    codes, scales = block_quantize(rng, (1024, 2048), (128, 128), np.float32)
    folder = write_model(tmp_path / "m", {LINEAR + ".weight": codes, LINEAR + ".weight_scale_inv": scales},
                         {"quant_method": "fp8", "weight_block_size": [128, 128]})
    calls: list[tuple[int, int]] = []
    parsed = read_checkpoint(str(folder))
    with Checkpoint(parsed, str(folder), source_wrapper=lambda s: Counting(s, calls)) as ck:
        hf = ckptfs.hf_folder(ck)
        view = hf["model.safetensors"]
        header = view.read(0, 8)
        (n,) = struct.unpack("<Q", header)
        calls.clear()
        middle = 8 + n + 1024 * 2048   # row 512's first bfloat16 value
        got = view.read(middle, 4096)
        assert got == bf16_of(expected_blocks(codes, scales, (128, 128))[512, :2048])
    read = sum(size for _, size in calls)
    assert 0 < read < codes.nbytes // 4, read


def test_a_plain_folder_gets_no_hf(tmp_path, mountpoint):
    """A folder without quantization settings is the release already: ``--hf`` of it is one line (exit 1), and
    ``info --hf`` says the same."""
    folder = write_model(tmp_path / "plain", {NORM: np.ones(8, np.float32)}, None)
    reason = "the folder is not quantized"
    one_error_line(run_cli("mount", str(folder), str(mountpoint), "--hf"), 1, "no hf/ folder:", reason)
    info = run_cli("info", "--hf", "--json", str(folder))
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["hf"].startswith(f"none: {reason}")


def test_a_layer_without_a_view_refuses_the_release(tmp_path, mountpoint):
    """A layer whose scale does not fit its weight has no view: the release would lack it, so no hf/ (one line
    naming the layer); the folder itself is still served without --hf."""
    rng = np.random.default_rng(11)
    codes, _ = block_quantize(rng, (64, 64), (32, 32), np.float32)
    folder = write_model(tmp_path / "m", {LINEAR + ".weight": codes,
                                          LINEAR + ".weight_scale_inv": np.ones((5, 5), np.float32)},
                         {"quant_method": "fp8", "weight_block_size": [32, 32]})
    result = run_cli("mount", str(folder), str(mountpoint), "--hf")   # packed/ logs the layer's reason first
    assert result.returncode == 1 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ckptfs: error:") and f"no hf/ folder: layer {LINEAR}.weight has no dense view" in last
    info = run_cli("info", "--hf", "--json", str(folder))
    assert json.loads(info.stdout)["hf"].startswith(f"none: layer {LINEAR}.weight has no dense view")


def test_info_says_the_release_is_available(schemes):
    _, made = schemes
    info = run_cli("info", "--hf", "--json", str(made["fp8"][0]))
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["hf"] == f"available (mount with --hf): {len(KEPT) + 2} files"


def test_modes_are_no_wider_than_the_inputs(tmp_path, mounted):
    """A kept file has its own mode; the config and the shards are readable only by who may read the files
    they are made of (a 0600 config.json makes them 0400)."""
    folder, _ = fp8_block(tmp_path / "m")
    with_kept_files(folder)
    os.chmod(folder / "tokenizer.json", 0o640)
    os.chmod(folder / "config.json", 0o600)
    hf = mounted(str(folder), "--hf") / "hf"
    assert stat.S_IMODE(os.stat(hf / "tokenizer.json").st_mode) == 0o440
    assert stat.S_IMODE(os.stat(hf / "config.json").st_mode) == 0o400
    assert stat.S_IMODE(os.stat(hf / "model.safetensors").st_mode) == 0o400
    assert stat.S_IMODE(os.stat(hf / "generation_config.json").st_mode) == 0o444 & os.stat(
        folder / "generation_config.json").st_mode


def test_s3_folder_release(tmp_path, mounted):
    """An FP8 folder on ``s3://`` (moto's S3 server on loopback): hf/ of its mount is the release, read range
    by range."""
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto")
    from loopback.servers import MotoS3, environment

    folder, expected = fp8_block(tmp_path / "m")
    with_kept_files(folder)
    with MotoS3() as server, environment(server.env()):
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket="hfq")
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), "hfq", f"m/{path.name}")
        mnt = mounted("s3://hfq/m/", "--hf", "--timeout", "10", "--stall-timeout", "2")
        check_release(mnt / "hf", expected, folder)


def test_hf_repository_release(tmp_path, mounted):
    """A sharded FP8 folder as an ``hf://`` repository (the Hub stand-in on loopback): its release, sharded."""
    pytest.importorskip("huggingface_hub")
    from hub_origin import hub_origin

    made: dict[str, dict[str, np.ndarray]] = {}

    def fill(repo: Path) -> None:
        made.update(sharded_fp8(repo))

    with hub_origin(tmp_path, "org/fp8", fill):
        mnt = mounted("hf://org/fp8", "--hf", "--timeout", "30")
        check_sharded(mnt / "hf", made)


def test_a_tensor_stored_in_the_served_type_is_served_as_stored(tmp_path):
    """A BF16 tensor of the release served as bfloat16 is its stored bytes (a NaN keeps its payload, where a
    round trip through float32 would write torch's 0xFFFF), and read without converting anything."""
    rng = np.random.default_rng(12)
    codes, scales = block_quantize(rng, (64, 64), (32, 32), np.float32)
    norm = rng.standard_normal(64).astype(BF16)
    norm.view(np.uint16)[:2] = [0x7FC1, 0x8000]   # a NaN with a payload, -0.0
    folder = write_model(tmp_path / "m", {LINEAR + ".weight": codes, LINEAR + ".weight_scale_inv": scales,
                                          NORM: norm}, {"quant_method": "fp8", "weight_block_size": [32, 32]})
    hf = ckptfs.hf_folder(folder)
    try:
        path = hf.write_to(tmp_path / "out") / "model.safetensors"
    finally:
        hf.close()
    assert read_safetensors(path)[NORM] == ("BF16", [64], norm.tobytes())
