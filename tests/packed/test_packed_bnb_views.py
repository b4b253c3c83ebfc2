"""bitsandbytes views where a tensor goes: ``ckptfs.open`` (the view in the codes' name, the stored codes by
``ck.stored``), row picks, ``ckptfs.load``'s dense state dict, the skip list, hostile layers served as stored,
a small read that reads only its blocks, and a real FUSE mount, against bitsandbytes' own dequantization."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
from bnb_fixtures import (as_numpy, bnb_config, dequantize_4bit, dequantize_int8, quantize_4bit, quantize_int8,
                          saved_by_transformers, stored_layers, write_folder)
from counting import Counting
from packed_fixtures import check_shared, require_package, same_bits

import ckptfs
from ckptfs.checkpoint.api import Checkpoint
from ckptfs.formats.multi import read_checkpoint

torch = pytest.importorskip("torch")

Q, K, V = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj"
UP = "model.layers.0.mlp.up_proj"


@pytest.fixture(autouse=True)
def _bitsandbytes():
    require_package("bitsandbytes")  # the oracle (test-oracles extra): skipped here, a failure in CI


def nf4_folder(tmp_path, skip=None, change=None):
    """q_proj: nf4 with double quantization, [37, 100] (blocks straddle rows); k_proj: nf4 [48, 96];
    lm_head: stored dense (bfloat16), as transformers leaves a skipped module."""
    torch.manual_seed(3)
    layers = {Q: quantize_4bit(torch.randn(37, 100).to(torch.bfloat16), "nf4", 64, True),
              K: quantize_4bit(torch.randn(48, 96).to(torch.bfloat16), "nf4", 64, False)}
    if change is not None:
        change(layers)
    lm_head = torch.randn(16, 100).to(torch.bfloat16)
    folder = write_folder(tmp_path / "m", layers, bnb_config(4, "nf4", True, skip or ["lm_head"]),
                          extra={"lm_head.weight": lm_head})
    return folder, layers, lm_head


def test_views_through_the_api(tmp_path):
    folder, layers, lm_head = nf4_folder(tmp_path)
    with ckptfs.open(folder) as ck:
        for prefix, tensors in layers.items():
            oracle = as_numpy(dequantize_4bit(tensors, torch.float32))
            view = ck[prefix + ".weight"]
            assert view.virtual and view.shape == oracle.shape and view.dtype == np.float32
            assert same_bits(view.numpy(), oracle)
            assert same_bits(view[5:9], oracle[5:9]) and same_bits(view[-1], oracle[-1])
            stored = ck.stored(prefix + ".weight")
            assert not stored.virtual and stored.storage_type == "U8"
            assert stored.raw() == tensors["weight"].numpy().tobytes()
            meta = view.meta
            assert meta["scheme"] == "bitsandbytes-4bit" and meta["stored"]["storage_type"] == "U8"
            assert meta["stored"]["shape"] == list(tensors["weight"].shape)
            assert meta["parameters"]["quant_type"] == "nf4" and meta["parameters"]["blocksize"] == 64
            assert meta["parameters"]["double_quant"] is (prefix == Q)
            assert set(meta["parts"]) >= {"weight", "weight.absmax", "weight.quant_map",
                                          "weight.quant_state.bitsandbytes__nf4"}
        assert not ck["lm_head.weight"].virtual
    state = ckptfs.load(folder)
    assert set(state) == {Q + ".weight", K + ".weight", "lm_head.weight"}
    assert same_bits(state[Q + ".weight"].numpy(), as_numpy(dequantize_4bit(layers[Q], torch.float32)))
    assert torch.equal(state["lm_head.weight"], lm_head)


def test_int8_and_fp4_views(tmp_path):
    torch.manual_seed(4)
    int8 = quantize_int8(torch.randn(40, 72) * 2)
    fp4 = quantize_4bit(torch.randn(30, 50).to(torch.float16), "fp4", 128, True)
    folder8 = write_folder(tmp_path / "i8", {UP: int8}, bnb_config(8))
    folder4 = write_folder(tmp_path / "f4", {UP: fp4}, bnb_config(4, "fp4", True))
    with ckptfs.open(folder8) as ck:
        view = ck[UP + ".weight"]
        assert view.meta["scheme"] == "bitsandbytes-int8" and view.meta["stored"]["storage_type"] == "I8"
        assert same_bits(view.numpy(), as_numpy(dequantize_int8(int8)))
        assert same_bits(view[7:8], as_numpy(dequantize_int8(int8))[7:8])
        assert ck.stored(UP + ".weight").raw() == int8["weight"].numpy().tobytes()
    state = ckptfs.load(folder8)  # the release's dense state dict: no SCB, no weight_format
    assert set(state) == {UP + ".weight"} and same_bits(state[UP + ".weight"].numpy(), as_numpy(dequantize_int8(int8)))
    with ckptfs.open(folder4) as ck:
        assert same_bits(ck[UP + ".weight"].numpy(), as_numpy(dequantize_4bit(fp4, torch.float32)))


def test_skip_list_keeps_the_stored_tensors(tmp_path):
    """A layer named by ``llm_int8_skip_modules`` gets no view even when 4-bit parts are stored: its codes are
    served as stored, with the reason."""
    folder, layers, _ = nf4_folder(tmp_path, skip=["lm_head", "k_proj"])
    with ckptfs.open(folder) as ck:
        codes = ck[K + ".weight"]
        assert not codes.virtual and codes.storage_type == "U8"
        assert codes.raw() == layers[K]["weight"].numpy().tobytes()
        note = codes.meta["packed_view"]
        assert note["present"] is False and "llm_int8_skip_modules" in note["reason"] and "k_proj" in note["reason"]
        assert ck[Q + ".weight"].virtual


def _bad_state(layers):
    layers[K]["weight.quant_state.bitsandbytes__nf4"] = torch.tensor(list(b"{oops"), dtype=torch.uint8)


def _short_absmax(layers):
    layers[K]["weight.absmax"] = layers[K]["weight.absmax"][:-1].clone()


@pytest.mark.parametrize("change,reason", [(_bad_state, "is not a JSON quant state"),
                                           (_short_absmax, "expects 72 values")])
def test_hostile_layer_is_served_as_stored(tmp_path, change, reason, caplog):
    folder, layers, _ = nf4_folder(tmp_path, change=change)
    with caplog.at_level(logging.WARNING, logger="ckptfs.packed"), ckptfs.open(folder) as ck:
        codes = ck[K + ".weight"]
        assert not codes.virtual and codes.raw() == layers[K]["weight"].numpy().tobytes()
        note = codes.meta["packed_view"]
        assert note["present"] is False and reason in note["reason"] and "\n" not in note["reason"]
        assert same_bits(ck[Q + ".weight"].numpy(), as_numpy(dequantize_4bit(layers[Q], torch.float32)))
        for role in layers[K]:
            assert ck[f"{K}.{role}"].raw() == layers[K][role].numpy().tobytes()
    assert sum(reason in r.getMessage() for r in caplog.records) == 1


def test_a_small_read_reads_only_its_blocks(tmp_path):
    """4 KiB of a [2048, 512] NF4 view (double quantization) read through the API: the source bytes read are
    the codes and block scales of the one tile (rows) under the read and the small per-layer parts, a small
    fraction of the layer's 512 KiB of codes."""
    torch.manual_seed(6)
    tensors = quantize_4bit(torch.randn(2048, 512), "nf4", 64, True)
    folder = write_folder(tmp_path / "m", {UP: tensors}, bnb_config(4, "nf4", True))
    reads: list[tuple[int, int]] = []
    with Checkpoint(read_checkpoint(str(folder)), str(folder), source_wrapper=lambda s: Counting(s, reads)) as ck:
        view = ck[UP + ".weight"]
        codes, absmax = ck.stored(UP + ".weight").info, ck[UP + ".weight.absmax"].info
        reads.clear()                                              # what the open read
        start = 1000 * 512 + 100                                   # an element inside row 1000
        values = view.data.read(start, start + 1024)               # 4 KiB of float32
        assert same_bits(values, as_numpy(dequantize_4bit(tensors, torch.float32)).reshape(-1)[start:start + 1024])
        rows = view.data.rows_per_tile
        tile = 1000 // rows
        e0, e1 = tile * rows * 512, (tile + 1) * rows * 512
        in_codes = [(o, s) for o, s in reads if codes.offset <= o < codes.offset + codes.stored_nbytes]
        in_absmax = [(o, s) for o, s in reads if absmax.offset <= o < absmax.offset + absmax.stored_nbytes]
        assert in_codes == [(codes.offset + e0 // 2, (e1 - e0) // 2)]
        assert in_absmax == [(absmax.offset + e0 // 64, (e1 - e0) // 64)]
        small = sum(s for o, s in reads) - (e1 - e0) // 2 - (e1 - e0) // 64
        assert small <= 64 + 1024 + 4 * 64                         # quant_map, nested map, nested scales
        assert sum(s for o, s in reads) < codes.stored_nbytes // 8


def test_the_mount_serves_views_codes_and_parts(tmp_path, mounted):
    """Through a real FUSE mount: ``X.weight.npy`` is bitsandbytes' float32 values (and with ``--dtype
    float16`` those rounded), reads at any offset agree, ``X.weight.raw`` is the stored codes, every part's
    ``.raw`` and every file of the folder unchanged."""
    from mount_expect import npy_bytes

    folder, layers, lm_head = nf4_folder(tmp_path)
    mnt = mounted(folder)
    for prefix, tensors in layers.items():
        oracle = as_numpy(dequantize_4bit(tensors, torch.float32))
        expected = npy_bytes(oracle)
        path = mnt / (prefix + ".weight.npy")
        assert path.read_bytes() == expected
        with open(path, "rb") as f:
            for offset in (0, 130, len(expected) // 2 + 3, len(expected) - 1000):
                f.seek(offset)
                assert f.read(4096) == expected[offset: offset + 4096], offset
        assert (mnt / (prefix + ".weight.raw")).read_bytes() == tensors["weight"].numpy().tobytes()
        for role, value in tensors.items():
            if role != "weight":
                assert (mnt / f"{prefix}.{role}.raw").read_bytes() == value.numpy().tobytes()
        meta = json.loads((mnt / (prefix + ".weight.meta.json")).read_text())
        assert meta["virtual"] is True and meta["scheme"] == "bitsandbytes-4bit"
        assert meta["stored"]["storage_type"] == "U8" and meta["shape"] == list(oracle.shape)
    for file in folder.iterdir():
        assert (mnt / file.name).read_bytes() == file.read_bytes()
    half = mounted(folder, "--dtype", "float16")
    assert (half / (Q + ".weight.npy")).read_bytes() == npy_bytes(
        as_numpy(dequantize_4bit(layers[Q], torch.float32)).astype(np.float16))


def test_the_mount_of_a_folder_saved_by_transformers(tmp_path, mounted):
    """A tiny Llama saved by transformers in 4-bit NF4 with double quantization: every quantized layer's
    ``.npy`` is bitsandbytes' dequantization of what was saved; the skipped ``down_proj`` is served as stored."""
    pytest.importorskip("transformers")
    from mount_expect import npy_bytes

    folder = saved_by_transformers(tmp_path, 4, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16, llm_int8_skip_modules=["lm_head", "down_proj"])
    mnt = mounted(folder)
    layers = stored_layers(folder)
    assert len(layers) == 12
    for prefix, tensors in layers.items():
        assert (mnt / (prefix + ".weight.npy")).read_bytes() == npy_bytes(
            as_numpy(dequantize_4bit(tensors, torch.float32))), prefix
    meta = json.loads((mnt / "model.layers.0.mlp.down_proj.weight.meta.json").read_text())
    assert "virtual" not in meta or meta["virtual"] is False
    names = os.listdir(mnt)
    assert "model.layers.0.mlp.down_proj.weight.npy" in names


def test_prefetch_and_shared(tmp_path):
    """``ckptfs prefetch FOLDER --cache-dir DIR`` stores an NF4 view's tiles, which a later open reads without
    decoding anything; ``Tensor.shared()`` maps one decoded copy of the view."""
    from cli_runs import run_cli

    torch.manual_seed(8)
    tensors = quantize_4bit(torch.randn(300, 600).to(torch.bfloat16), "nf4", 64, True)
    expected = as_numpy(dequantize_4bit(tensors, torch.float32))
    folder = write_folder(tmp_path / "m", {UP: tensors}, bnb_config(4, "nf4", True))
    cache_dir = tmp_path / "cache"
    result = run_cli("prefetch", str(folder), "--cache-dir", str(cache_dir))
    assert result.returncode == 0 and "failed" not in result.stdout, result.stdout + result.stderr
    with ckptfs.open(folder, cache_dir=str(cache_dir)) as ck:
        view = ck[UP + ".weight"]
        assert view.data.n_blocks > 2
        assert same_bits(view[0:300], expected)
        assert ck.cache.decoded_bytes == 0
    check_shared(folder, UP + ".weight", expected, tmp_path / "shared")


def test_a_remote_folder_on_s3(tmp_path):
    """The same folder uploaded to S3 (moto's server on loopback): the views equal bitsandbytes' values and the
    stored codes their bytes, read through ``s3://``."""
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto")
    from loopback.servers import MotoS3, environment

    folder, layers, _ = nf4_folder(tmp_path)
    with MotoS3() as server, environment(server.env()):
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket="models")
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), "models", f"bnb/{path.name}")
        with ckptfs.open("s3://models/bnb/", timeout=10) as ck:
            for prefix, tensors in layers.items():
                assert same_bits(ck[prefix + ".weight"].numpy(), as_numpy(dequantize_4bit(tensors, torch.float32)))
                assert ck.stored(prefix + ".weight").raw() == tensors["weight"].numpy().tobytes()


def test_info_counts_the_views_per_scheme(tmp_path):
    from cli_runs import run_cli

    folder, _, _ = nf4_folder(tmp_path, skip=["lm_head", "k_proj"])
    result = run_cli("info", str(folder))
    assert result.returncode == 0, result.stderr
    assert "packed views (bitsandbytes-4bit 1): 1, absent: 1" in result.stdout, result.stdout
    assert "llm_int8_skip_modules" in result.stdout
