"""Bad packed layers: the parts are still served raw, the view is absent, and meta.json and ``ckptfs info``
say why in one line. A read that finds bad stored values fails with an error naming the view, never wrong
values."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ckptfs_cli, cli_env
from packed_fixtures import compressed_config, compressed_layer, gptq_layer, write_folder
from safetensors.numpy import load_file

import ckptfs

A, B = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True}


def two_layers(tmp_path, config, edit=None, **kw):
    """A folder with layer A intact and layer B after ``edit(tensors)``; returns (folder, A's layer)."""
    rng = np.random.default_rng(0)
    good, bad = gptq_layer(rng, 64, 128, 4, 32), gptq_layer(rng, 64, 128, 4, 32)
    tensors = dict(bad.tensors)
    if edit is not None:
        edit(tensors)
    return write_folder(tmp_path / "m", {A: good.tensors, B: tensors}, config, **kw), good


def absent_reason(ck, prefix: str) -> str:
    """The reason every stored part of ``prefix`` gives in its meta.json, checked to be the same for all."""
    notes = {ck[name].meta["packed_view"]["reason"] for name in ck if name.startswith(prefix + ".")}
    assert len(notes) == 1, notes
    assert prefix + ".weight" not in ck
    return notes.pop()


def assert_parts_raw(ck, folder, prefix: str) -> None:
    stored = load_file(str(folder / "model.safetensors"))
    for name, value in stored.items():
        if name.startswith(prefix + "."):
            assert ck[name].raw() == value.tobytes() and not ck[name].virtual


def info_of(folder) -> tuple[dict, str]:
    """``ckptfs info --json`` and the text form, by the real CLI."""
    def run(*args: str) -> str:
        return subprocess.run([*ckptfs_cli(), "info", str(folder), *args], env=cli_env(), capture_output=True,
                              text=True, timeout=120, check=True).stdout

    return json.loads(run("--json")), run()


def test_scales_that_do_not_match_the_group_size(tmp_path):
    """The config says group_size 32; layer B's scales have one row too few."""
    folder, good = two_layers(tmp_path, GPTQ, lambda t: t.update(scales=t["scales"][:-1].copy()))
    with ckptfs.open(folder) as ck:
        reason = absent_reason(ck, B)
        assert reason == f"{B}.scales has shape [3, 64], bits=4 group_size=32 expects [4, 64]"
        assert_parts_raw(ck, folder, B)
        assert np.array_equal(ck[A + ".weight"].numpy(), good.expected())  # the intact layer keeps its view
    data, text = info_of(folder)
    assert data["packed_views"] == {"schemes": ["gptq"], "views": 1,
                                    "per_scheme": {"gptq": {"views": 1, "absent": 1}},
                                    "absent": [{"name": B + ".weight", "reason": reason}]}
    assert "packed views (gptq 1): 1, absent: 1" in text.splitlines()
    assert f"  no view '{B}.weight': {reason}" in text.splitlines()
    assert data["tensor_count"] == 8  # the stored tensors; the view is not one


def test_a_missing_part(tmp_path):
    folder, _ = two_layers(tmp_path, GPTQ, lambda t: t.pop("qzeros"))
    with ckptfs.open(folder) as ck:
        assert absent_reason(ck, B) == f"part {B}.qzeros is missing"
        assert_parts_raw(ck, folder, B)
        assert A + ".weight" in ck


def test_an_unknown_scheme(tmp_path):
    folder, _ = two_layers(tmp_path, {"quant_method": "hqq", "bits": 4})
    with ckptfs.open(folder) as ck:
        for prefix in (A, B):
            assert absent_reason(ck, prefix) == "unknown quantization scheme 'hqq' in config.json quantization_config"
            assert_parts_raw(ck, folder, prefix)
    data, _ = info_of(folder)
    assert data["packed_views"]["views"] == 0 and len(data["packed_views"]["absent"]) == 2


def test_unsupported_parameters_and_unreadable_config(tmp_path):
    folder, _ = two_layers(tmp_path, dict(GPTQ, bits=5))
    with ckptfs.open(folder) as ck:
        assert absent_reason(ck, A) == "GPTQ bits=5 is not supported (2, 3, 4 or 8)"
    (folder / "config.json").write_text("{not json")
    with ckptfs.open(folder) as ck:
        assert absent_reason(ck, A).startswith("config.json cannot be read: ")
        assert_parts_raw(ck, folder, A)


def test_a_stored_tensor_of_the_view_name_wins(tmp_path):
    stored = np.arange(12, dtype=np.float32).reshape(3, 4)
    folder, _ = two_layers(tmp_path, GPTQ, extra_tensors={B + ".weight": stored})
    with ckptfs.open(folder) as ck:
        assert not ck[B + ".weight"].virtual and np.array_equal(ck[B + ".weight"].numpy(), stored)
        notes = {ck[n].meta["packed_view"]["reason"] for n in ck if n.startswith(B + ".") and n != B + ".weight"}
        assert notes == {f"a stored tensor is named '{B}.weight'; it is served instead of the view"}
        assert sum(1 for t in ck.tensors if t.name == B + ".weight") == 1


def test_a_truncated_part(tmp_path):
    folder, _ = two_layers(tmp_path, GPTQ)
    path = folder / "model.safetensors"
    os.truncate(path, os.path.getsize(path) - 100)
    with ckptfs.open(folder) as ck:
        damaged = [t.name for t in ck.damaged()]
        assert len(damaged) == 1
        prefix = damaged[0].rpartition(".")[0]
        reason = absent_reason(ck, prefix)
        assert reason.startswith(f"part {damaged[0]} is damaged: ")


def test_a_group_index_out_of_range_fails_the_read(tmp_path):
    """g_idx holds a group the scales do not have: found only when read, so the read fails naming the view."""
    def edit(t):
        t["g_idx"] = t["g_idx"].copy()
        t["g_idx"][5] = 9
    folder, _ = two_layers(tmp_path, GPTQ, edit)
    with ckptfs.open(folder) as ck:
        expected = rf"tensor '{B}.weight': {B}.g_idx holds group 9, outside 0..3"
        with pytest.raises(ckptfs.CheckpointError, match=expected):
            ck[B + ".weight"].numpy()
        with pytest.raises(ckptfs.CheckpointError):
            ck[B + ".weight"][0]


def test_a_plain_file_never_imports_the_package(tmp_path):
    """Only a folder with a config file looks for packed layers: opening a plain safetensors file (even one
    holding GPTQ parts) leaves ckptfs.packed unimported, and the parts are just tensors."""
    folder, _ = two_layers(tmp_path, GPTQ)
    code = ("import sys, ckptfs; ck = ckptfs.open(sys.argv[1]); "
            f"assert {A + '.weight'!r} not in ck and {A + '.qweight'!r} in ck; "
            "print('ckptfs.packed' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code, str(folder / "model.safetensors")], env=cli_env(),
                            capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("settings,reason", [
    (dict(GPTQ, bits="4"), "quantization setting bits='4' is not an integer"),
    (dict(GPTQ, group_size=[32]), "quantization setting group_size=[32] is not an integer"),
    ({"quant_method": 7}, "config.json quantization_config names no quant_method"),
])
def test_hostile_settings_cost_the_view_only(tmp_path, settings, reason):
    folder, _ = two_layers(tmp_path, settings)
    with ckptfs.open(folder) as ck:
        assert absent_reason(ck, A) == reason
        assert_parts_raw(ck, folder, A)


def test_a_bad_target_pattern(tmp_path):
    layer = compressed_layer(np.random.default_rng(1), 32, 64, 4, "group", 32, True)
    config = compressed_config({"g": dict(layer.extra["scheme"], targets=["re:("])})
    folder = write_folder(tmp_path / "m", {A: layer.tensors}, config)
    with ckptfs.open(folder) as ck:
        assert absent_reason(ck, A) == ("target 're:(' is not a valid regular expression: "
                                        "missing ), unterminated subpattern at position 0")
        assert_parts_raw(ck, folder, A)
