"""``quant_method: fp8`` folders (DeepSeek-V3 / Qwen3-FP8 layouts): the view ``X.weight`` stands in the
stored F8_E4M3 codes' name and is bit for bit the float32 formula ``e4m3(w) * s[i // bh, j // bw]``
(computed in fp8_fixtures from ml_dtypes, independently of ckptfs) and compressed-tensors'
``FP8BlockDequantizer`` (the oracle), partial edge tiles included; rounded to bfloat16 it is the oracle's
bfloat16 result."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
from counting import Counting
from fp8_fixtures import BF16, E4M3, E8M0, block_quantize, expected_blocks, round_bits, write_model
from packed_fixtures import check_shared, same_bits

import ckptfs
from ckptfs.checkpoint.api import Checkpoint
from ckptfs.formats.multi import read_checkpoint

P = "model.layers.0.self_attn.kv_a_proj_with_mqa"
Q = "model.layers.0.mlp.down_proj"


def fp8_config(block=(128, 128), **more):
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": list(block) if block else None, **more}


def oracle(codes: np.ndarray, scales: np.ndarray, block, dtype: str) -> np.ndarray:
    """compressed-tensors' FP8BlockDequantizer on the stored tensors, as float32."""
    torch = pytest.importorskip("torch")
    converters = pytest.importorskip("compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer")
    weight = torch.from_numpy(codes.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    if scales.dtype == E8M0:
        scale = torch.from_numpy(scales.view(np.uint8).copy()).view(torch.float8_e8m0fnu)
    elif scales.dtype == BF16:
        scale = torch.from_numpy(scales.view(np.uint16).copy()).view(torch.bfloat16)
    else:
        scale = torch.from_numpy(scales.copy())
    dequantizer = converters.FP8BlockDequantizer(weight_block_size=tuple(block), dtype=getattr(torch, dtype),
                                                 targets=("Linear",))
    out = dequantizer.process({"m.weight": weight, "m.weight_scale_inv": scale})
    assert set(out) == {"m.weight"}
    return out["m.weight"].float().numpy()


@pytest.mark.parametrize("shape,block,scale_dtype", [
    ((576, 7168), (128, 128), np.float32),     # DeepSeek-V3 kv_a_proj_with_mqa: a 5 x 56 grid
    ((300, 200), (128, 128), BF16),            # Qwen3-FP8: rows and columns not a multiple of the block
    ((257, 130), (64, 32), E8M0),              # scale_fmt ue8m0 stored as E8M0
    ((3, 5), (128, 128), np.float32),          # smaller than one block
])
def test_block_fp8_is_the_formula_and_the_oracle(tmp_path, shape, block, scale_dtype):
    rng = np.random.default_rng(shape[0])
    codes, scales = block_quantize(rng, shape, block, scale_dtype, nonfinite=True)
    norm = rng.standard_normal(shape[1]).astype(np.float32)
    config = fp8_config(block, **({"scale_fmt": "ue8m0"} if scale_dtype == E8M0 else {}))
    folder = write_model(tmp_path / "m", {P + ".weight": codes, P + ".weight_scale_inv": scales,
                                          "model.norm.weight": norm}, config)
    expected = expected_blocks(codes, scales, block)
    with ckptfs.open(folder) as ck:
        view = ck[P + ".weight"]
        assert view.virtual and view.shape == shape
        got = view.numpy()
        assert same_bits(got, expected)
        assert same_bits(view[1:3], expected[1:3]) and same_bits(view[[2, 0]], expected[[2, 0]])
        stored = ck.stored(P + ".weight")
        assert stored.storage_type == "F8_E4M3" and stored.raw() == codes.tobytes()
        assert view.meta["scheme"] == "fp8" and view.meta["parameters"]["block"] == list(block)
        assert view.meta["stored"]["storage_type"] == "F8_E4M3" and view.meta["stored"]["shape"] == list(shape)
        assert same_bits(ck["model.norm.weight"].numpy(), norm)   # a plain tensor is untouched
    want = oracle(codes, scales, block, "float32")
    assert np.array_equal(got, want, equal_nan=True)
    want_bf16 = oracle(codes, scales, block, "bfloat16")
    assert np.array_equal(round_bits(got, BF16), want_bf16, equal_nan=True)
    import torch   # ckptfs.load in the release's dtype is the oracle's bfloat16 result; a pickled view reopens

    loaded = ckptfs.load(folder, [P + ".weight"], dtype=torch.bfloat16)[P + ".weight"]
    assert np.array_equal(loaded.float().numpy(), want_bf16, equal_nan=True)
    with ckptfs.open(folder) as ck:
        again = pickle.loads(pickle.dumps(ck[P + ".weight"]))
        assert again.virtual and same_bits(again[0:2], expected[0:2])


def test_per_tensor_fp8_and_experts(tmp_path):
    """No weight_block_size: one scale per tensor; experts stored together ``[E, out, in]`` with a scale
    grid per expert."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 24)).astype(np.float32)
    scale = np.array([0.0123], np.float32)
    codes = (w / scale[0]).astype(E4M3)
    folder = write_model(tmp_path / "t", {Q + ".weight": codes, Q + ".weight_scale_inv": scale}, fp8_config(None))
    with ckptfs.open(folder) as ck:
        assert same_bits(ck[Q + ".weight"].numpy(), codes.astype(np.float32) * np.float32(0.0123))
    experts, escales = block_quantize(rng, (3, 200, 136), (128, 128), np.float32)
    name = "model.layers.1.mlp.experts.gate_up_proj"
    folder = write_model(tmp_path / "e", {name + ".weight": experts, name + ".weight_scale_inv": escales},
                         fp8_config())
    with ckptfs.open(folder) as ck:
        view = ck[name + ".weight"]
        assert view.shape == (3, 200, 136)
        assert same_bits(view.numpy(), expected_blocks(experts, escales, (128, 128)))
        assert same_bits(view[2], expected_blocks(experts, escales, (128, 128))[2])


def test_modules_to_not_convert_and_load(tmp_path):
    """A layer the config leaves unquantized keeps its stored tensor (even when stored as F8_E4M3), with the
    reason; ckptfs.load gives the release's dense state dict: views under their names, no scale parts."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    codes, scales = block_quantize(rng, (130, 260), (128, 128), BF16)
    skipped, skipped_scales = block_quantize(rng, (16, 16), (128, 128), np.float32)
    folder = write_model(tmp_path / "m", {Q + ".weight": codes, Q + ".weight_scale_inv": scales,
                                          "lm_head.weight": skipped, "lm_head.weight_scale_inv": skipped_scales},
                         fp8_config(modules_to_not_convert=["lm_head"]))
    with ckptfs.open(folder) as ck:
        assert not ck["lm_head.weight"].virtual
        note = ck["lm_head.weight"].meta["packed_view"]
        assert note["present"] is False and note["reason"] == "layer is in the config's modules_to_not_convert list (lm_head)"
    state = ckptfs.load(folder)
    assert set(state) == {Q + ".weight", "lm_head.weight", "lm_head.weight_scale_inv"}
    assert state[Q + ".weight"].dtype == torch.float32
    assert same_bits(state[Q + ".weight"].numpy(), expected_blocks(codes, scales, (128, 128)))


@pytest.mark.parametrize("change,reason", [
    (lambda t, c: t.update({Q + ".weight_scale_inv": t[Q + ".weight_scale_inv"][:1]}),
     f"{Q}.weight_scale_inv has shape [1, 3], weight_block_size block 128x128 of {Q}.weight [130, 260] "
     "expects [2, 3]"),
    (lambda t, c: t.pop(Q + ".weight_scale_inv"), f"part {Q}.weight_scale_inv is missing"),
    (lambda t, c: c.update(weight_block_size=[0, 128]),
     "quantization setting weight_block_size=[0, 128] is not a block size"),
    (lambda t, c: c.update(quant_method="fp9"),
     "unknown quantization scheme 'fp9' in config.json quantization_config"),
    (lambda t, c: c.update(scale_fmt="ue5m3"), "fp8 scale_fmt 'ue5m3' is not supported (float or ue8m0)"),
])
def test_bad_input_serves_the_stored_tensors(tmp_path, change, reason, caplog):
    rng = np.random.default_rng(7)
    codes, scales = block_quantize(rng, (130, 260), (128, 128), np.float32)
    good, good_scales = block_quantize(rng, (64, 64), (128, 128), np.float32)
    tensors = {Q + ".weight": codes, Q + ".weight_scale_inv": scales,
               P + ".weight": good, P + ".weight_scale_inv": good_scales}
    config = fp8_config()
    change(tensors, config)
    folder = write_model(tmp_path / "m", tensors, config)
    with caplog.at_level("WARNING", logger="ckptfs.packed"), ckptfs.open(folder) as ck:
        weight = ck[Q + ".weight"]
        assert not weight.virtual and weight.storage_type == "F8_E4M3"
        assert weight.meta["packed_view"] == {"name": Q + ".weight", "scheme": "fp8" if "fp9" not in reason
                                              else "fp9", "present": False, "reason": reason}
        assert weight.raw() == codes.tobytes()
        assert same_bits(weight.numpy(), codes.astype(np.float32))   # the stored codes, as stored
        if Q in reason:  # a layer's own fault: the other layer keeps its view
            assert same_bits(ck[P + ".weight"].numpy(), expected_blocks(good, good_scales, (128, 128)))
        else:            # a config setting: no layer has a view, and the reason is logged once
            assert ck[P + ".weight"].meta["packed_view"]["reason"] == reason
    lines = [r for r in caplog.records if "no view" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0].getMessage()


def test_the_mount_serves_the_view_in_the_codes_name(tmp_path, mounted):
    """``X.weight.npy`` is the view, ``X.weight.raw`` the stored codes byte for byte, ``X.weight.meta.json``
    the view's (with ``stored``); every file of the folder is served unchanged."""
    from mount_expect import npy_bytes

    rng = np.random.default_rng(8)
    codes, scales = block_quantize(rng, (300, 520), (128, 128), BF16)
    folder = write_model(tmp_path / "m", {Q + ".weight": codes, Q + ".weight_scale_inv": scales}, fp8_config(),
                         shards=2)
    mnt = mounted(folder)
    names = os.listdir(mnt)
    assert sorted(n for n in names if n.startswith(Q)) == sorted(
        [Q + ".weight.npy", Q + ".weight.raw", Q + ".weight.meta.json", Q + ".weight_scale_inv.npy",
         Q + ".weight_scale_inv.raw", Q + ".weight_scale_inv.meta.json"])
    expected = npy_bytes(expected_blocks(codes, scales, (128, 128)))
    path = mnt / (Q + ".weight.npy")
    assert os.path.getsize(path) == len(expected) and path.read_bytes() == expected
    with open(path, "rb") as f:
        f.seek(len(expected) // 3)
        assert f.read(4096) == expected[len(expected) // 3: len(expected) // 3 + 4096]
    assert (mnt / (Q + ".weight.raw")).read_bytes() == codes.tobytes()
    assert (mnt / (Q + ".weight_scale_inv.raw")).read_bytes() == scales.tobytes()
    meta = json.loads((mnt / (Q + ".weight.meta.json")).read_text())
    assert meta["scheme"] == "fp8" and meta["virtual"] is True and meta["shape"] == [300, 520]
    assert meta["stored"]["storage_type"] == "F8_E4M3" and meta["parameters"]["scale_grid"] == [3, 5]
    assert set(meta["parts"]) == {"weight", "weight_scale_inv"}
    for file in folder.iterdir():
        assert (mnt / file.name).read_bytes() == file.read_bytes()


def test_the_c_kernel_equals_the_numpy_path(tmp_path):
    """``_kernels.scaled_rows`` and the numpy reference give the same bits, float32 and float16 (overflow to
    infinity, subnormals), NaN codes and an E8M0 scale of 255 (NaN) included, with and without zero points."""
    from ckptfs.packed.native import available

    if not available():
        pytest.skip("the C kernel is not built")
    rng = np.random.default_rng(9)
    codes, scales = block_quantize(rng, (300, 260), (64, 128), E8M0, nonfinite=True)
    scales.reshape(-1)[1] = np.array(np.nan, np.float32).astype(E8M0)        # byte 255
    scales.reshape(-1)[2] = np.array(2.0 ** 12, np.float32).astype(E8M0)     # products beyond float16
    scales.reshape(-1)[3] = np.array(2.0 ** -20, np.float32).astype(E8M0)    # float16 subnormals
    folder = write_model(tmp_path / "m", {Q + ".weight": codes, Q + ".weight_scale_inv": scales},
                         fp8_config((64, 128), scale_fmt="ue8m0"))
    expected = expected_blocks(codes, scales, (64, 128))
    assert np.isnan(expected[:64, 128:256]).all()
    for dtype in ("float32", "float16"):
        values = {}
        for backend in ("numpy", "native"):
            with ckptfs.open(folder, dtype=dtype) as ck:
                data = ck[Q + ".weight"].data
                data.backend = backend
                values[backend] = data.read(0, data.n_elements).reshape(300, 260)
        assert same_bits(values["numpy"], values["native"]), dtype
        with np.errstate(over="ignore"):
            assert same_bits(values["native"], expected.astype(dtype)), dtype


def test_a_small_read_reads_only_its_rows(tmp_path):
    """4 KiB of a [7168, 2048] block-scaled view read through the API: the source bytes read are the codes of
    the one tile of rows under the read and the (small, whole) scale grid, not the layer's 14 MiB of codes."""
    rng = np.random.default_rng(10)
    codes = rng.integers(0, 0x7E, (7168, 2048), dtype=np.uint8).view(E4M3)
    scales = rng.uniform(1e-4, 1e-2, (56, 16)).astype(np.float32)
    folder = write_model(tmp_path / "m", {Q + ".weight": codes, Q + ".weight_scale_inv": scales}, fp8_config())
    reads: list[tuple[int, int]] = []
    with Checkpoint(read_checkpoint(str(folder)), str(folder), source_wrapper=lambda s: Counting(s, reads)) as ck:
        view = ck[Q + ".weight"]
        stored, scale = ck.stored(Q + ".weight").info, ck[Q + ".weight_scale_inv"].info
        reads.clear()                                              # what the open read
        start = 5000 * 2048 + 300                                  # an element inside row 5000
        values = view.data.read(start, start + 1024)               # 4 KiB of float32
        row = expected_blocks(codes[5000:5001], scales[5000 // 128: 5000 // 128 + 1], (128, 128))
        assert same_bits(values, row.reshape(-1)[300:1324])
        rows = view.data.rows_per_tile
        tile = 5000 // rows
        assert sorted(reads) == sorted([(stored.offset + tile * rows * 2048, rows * 2048),
                                        (scale.offset, scale.stored_nbytes)])
        assert sum(size for _, size in reads) < stored.stored_nbytes // 50


def test_prefetch_shared_and_experts_row_picks(tmp_path):
    """``ckptfs prefetch FOLDER --cache-dir DIR`` stores the view's tiles (a later open decodes nothing);
    ``Tensor.shared()`` maps one decoded copy; row picks of an ``[E, out, in]`` experts view are its experts."""
    from cli_runs import run_cli

    rng = np.random.default_rng(12)
    codes, scales = block_quantize(rng, (3, 300, 200), (128, 128), BF16)
    expected = expected_blocks(codes, scales, (128, 128))
    folder = write_model(tmp_path / "m", {Q + ".weight": codes, Q + ".weight_scale_inv": scales}, fp8_config())
    cache_dir = tmp_path / "cache"
    result = run_cli("prefetch", str(folder), "--cache-dir", str(cache_dir))
    assert result.returncode == 0 and "failed" not in result.stdout, result.stdout + result.stderr
    with ckptfs.open(folder, cache_dir=str(cache_dir)) as ck:
        view = ck[Q + ".weight"]
        assert view.data.n_blocks > 2
        assert same_bits(view.data.read(0, view.size).reshape(view.shape), expected)
        assert ck.cache.decoded_bytes == 0
        assert same_bits(view[[1, 0]], expected[[1, 0]]) and same_bits(view[1, 299], expected[1, 299])
    check_shared(folder, Q + ".weight", expected, tmp_path / "shared")


def test_info_counts_views_per_scheme(tmp_path):
    """``ckptfs info`` (the real CLI) counts the views per scheme and names the layer without one."""
    import subprocess

    from conftest import ckptfs_cli, cli_env

    rng = np.random.default_rng(13)
    codes, scales = block_quantize(rng, (130, 260), (128, 128), np.float32)
    good, good_scales = block_quantize(rng, (64, 64), (128, 128), np.float32)
    folder = write_model(tmp_path / "m", {Q + ".weight": codes, Q + ".weight_scale_inv": scales[:1],
                                          P + ".weight": good, P + ".weight_scale_inv": good_scales}, fp8_config())

    def run(*args: str) -> str:
        return subprocess.run([*ckptfs_cli(), "info", str(folder), *args], env=cli_env(), capture_output=True,
                              text=True, timeout=120, check=True).stdout

    data = json.loads(run("--json"))["packed_views"]
    assert data["per_scheme"] == {"fp8": {"views": 1, "absent": 1}} and data["views"] == 1
    assert [row["name"] for row in data["absent"]] == [Q + ".weight"]
    text = run().splitlines()
    assert "packed views (fp8 1): 1, absent: 1" in text
    assert any(line.startswith(f"  no view '{Q}.weight': {Q}.weight_scale_inv has shape [1, 3]") for line in text)
