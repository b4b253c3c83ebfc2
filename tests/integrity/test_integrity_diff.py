"""``ckptfs diff A B [--values]``: tensors only in one side, shape/type/byte changes, and the largest absolute and
relative difference of dequantized values, against gguf-py's own dequantization."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from conftest import ckptfs_cli, cli_env
from fixtures import write_gguf


def run_diff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ckptfs_cli(), "diff", *args], env=cli_env(), capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("diff")
    rng = np.random.default_rng(8)
    values = rng.standard_normal((4, 64)).astype(np.float32)
    changed = rng.standard_normal(32).astype(np.float32)
    changed_b = changed.copy()
    changed_b[5] += 0.5
    grid = rng.standard_normal((4, 8)).astype(np.float32)
    same = rng.standard_normal(16).astype(np.float32)
    a = write_gguf(folder / "a.gguf", {"same": (same, "F32"), "requant": (values, "Q8_0"), "reshaped": (grid, "F32"),
                                       "changed": (changed, "F32"), "gone": (same, "F32")})
    b = write_gguf(folder / "b.gguf", {"same": (same, "F32"), "requant": (values, "Q4_0"),
                                       "reshaped": (grid.reshape(8, 4), "F32"), "changed": (changed_b, "F32"),
                                       "new": (same, "F32")})
    return a.path, b.path


def reference_values(path, name) -> np.ndarray:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    (t,) = [t for t in GGUFReader(str(path)).tensors if t.name == name]
    return dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)


def max_differences(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    delta = np.abs(x - y)
    scale = np.maximum(np.abs(x), np.abs(y))
    rel = np.divide(delta, scale, out=np.zeros_like(delta), where=scale > 0)
    return float(delta.max()), float(rel.max())


def test_diff_names_every_kind_of_change(pair):
    a, b = pair
    result = run_diff(str(a), str(b), "--json")
    assert result.returncode == 3, result.stderr
    data = json.loads(result.stdout)
    assert (data["only_in_a"], data["only_in_b"], data["same"]) == (["gone"], ["new"], 1)
    changed = {c["name"]: c for c in data["changed"]}
    assert set(changed) == {"requant", "reshaped", "changed"}
    assert changed["requant"]["what"] == ["type", "size", "bytes"]
    assert "type Q8_0 -> Q4_0" in changed["requant"]["detail"]
    assert changed["reshaped"]["what"] == ["shape"] and changed["reshaped"]["detail"] == ["shape [4, 8] -> [8, 4]"]
    assert changed["changed"]["what"] == ["bytes"]
    assert all(c["max_abs"] is None for c in data["changed"])  # values only with --values


def test_values_match_gguf_py_dequantization(pair):
    a, b = pair
    result = run_diff(str(a), str(b), "--values", "--json")
    assert result.returncode == 3, result.stderr
    changed = {c["name"]: c for c in json.loads(result.stdout)["changed"]}
    for name in ("requant", "changed"):
        expected = max_differences(reference_values(a, name), reference_values(b, name))
        assert (changed[name]["max_abs"], changed[name]["max_rel"]) == pytest.approx(expected, rel=1e-12, abs=0)
    assert changed["changed"]["max_abs"] == pytest.approx(0.5, rel=1e-6)
    assert changed["reshaped"]["max_abs"] is None  # other shape: nothing to compare element by element


def test_text_output_and_identical_checkpoints(pair):
    a, b = pair
    text = run_diff(str(a), str(b))
    lines = text.stdout.splitlines()
    assert lines[:2] == ["only in A: 'gone'", "only in B: 'new'"]
    assert lines[-1] == "1 tensor identical, 3 changed, 1 only in A, 1 only in B"
    same = run_diff(str(a), str(a))
    assert same.returncode == 0 and same.stdout.splitlines() == ["5 tensors identical, 0 changed, 0 only in A, 0 only in B"]


def test_against_a_manifest(tmp_path, pair):
    a, b = pair
    manifest = tmp_path / "b.json"
    made = subprocess.run([*ckptfs_cli(), "manifest", str(b), "-o", str(manifest)], env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    data = json.loads(run_diff(str(a), str(manifest), "--json").stdout)
    assert (data["only_in_a"], data["only_in_b"], data["same"]) == (["gone"], ["new"], 2)  # shapes not in a manifest
    assert {c["name"]: c["what"] for c in data["changed"]} == {"requant": ["size", "bytes"], "changed": ["bytes"]}
    reordered = tmp_path / "reordered.json"  # another writer's key order: "format" last, no line layout
    reordered.write_text(json.dumps(dict(reversed(list(json.loads(manifest.read_text()).items())))))
    assert json.loads(run_diff(str(a), str(reordered), "--json").stdout) == data
    usage = run_diff(str(a), str(manifest), "--values")
    assert usage.returncode == 2 and "--values needs two checkpoints" in usage.stderr
