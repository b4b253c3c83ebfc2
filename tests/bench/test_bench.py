"""``ckptfs bench`` smoke tests: on tiny generated checkpoints it mounts, runs every workload, prints the table
or JSON with the documented keys, finds the reference library's values equal to the mount's, and leaves no
mount or temporary directory behind (also when stopped with SIGTERM). No timing is asserted anywhere."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from cli_runs import run_cli
from conftest import ckptfs_cli, cli_env, is_mounted, require_fuse
from fixtures import quantized, write_gguf, write_safetensors

pytest.importorskip("gguf")
pytest.importorskip("safetensors")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    rng = np.random.default_rng(6)
    path = tmp_path_factory.mktemp("bench") / "tiny.gguf"
    tokens = [f"tok{i}" for i in range(300)]
    write_gguf(path, {
        "token_embd.weight": (quantized("Q8_0", (300, 64), rng), "Q8_0"),
        "blk.0.ffn_down.weight": (quantized("Q4_K", (64, 256), rng), "Q4_K"),
        "blk.0.attn_q.weight": (quantized("Q5_0", (64, 64), rng), "Q5_0"),
        "output_norm.weight": (rng.standard_normal(64).astype(np.float32), "F32"),
    }, {"tokenizer.ggml.tokens": tokens})
    return path


def run_bench(src: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ckptfs_cli(), "bench", str(src), "--cache-size", "4M", *args], capture_output=True,
                          text=True, env=cli_env(TMPDIR=str(tmp)), timeout=240)


def assert_clean(tmp: Path) -> None:
    assert not [p for p in tmp.iterdir() if p.name.startswith("ckptfs-bench-")], "temporary directory left"


def test_table(tiny_gguf: Path, tmp_path: Path):
    require_fuse()
    result = run_bench(tiny_gguf, tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for label in ("mount ready + os.listdir", "first 4 KiB read, fresh daemon (misses 0->", "random 4 KiB read p50",
                  "np.load(mmap_mode='r')", ".npy stream", ".raw stream", "decode-ahead off", "daemon peak RssAnon",
                  "gguf-py", "targets:", "by storage type", "  Q4_K ", "by size class", "  small <64 KiB "):
        assert label in out, f"{label!r} missing from:\n{out}"
    assert "values vs gguf-py" in out and ": equal (4 tensors)" in out
    assert_clean(tmp_path)


def test_json_gguf(tiny_gguf: Path, tmp_path: Path):
    require_fuse()
    result = run_bench(tiny_gguf, tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["format"] == "gguf" and data["tensors"] == 4 and data["cache_size"] == 4 << 20
    m = data["mount"]
    for key in ("ready_s", "listdir_s", "metadata_json_first_s", "stat_all_s", "first_read_s", "random_read_p50_s",
                "random_read_p99_s", "tensor_cold_s", "tensor_warm_s", "mmap_open_s", "mmap_row_p50_s", "npy_mbs",
                "raw_mbs", "npy_no_decode_ahead_mbs", "daemon_peak_rss_anon"):
        assert isinstance(m[key], (int, float)) and m[key] > 0, key
    assert m["files"] == 4 * 3 + 2  # .npy, .raw, .meta.json per tensor, metadata.json and the file itself
    before, after = m["first_read_cache_misses"]
    assert before == 0 and after >= 1  # the first read was a real decode in a fresh daemon
    expected_npy = 300 * 64 * 4 + 64 * 256 * 4 + 64 * 64 * 4 + 64 * 4
    assert m["npy_bytes"] - m["npy_no_decode_ahead_bytes"] == 0
    assert expected_npy < m["npy_bytes"] < expected_npy + 4 * 4096  # data plus four .npy headers
    ref = data["reference"]
    assert ref["library"].startswith("gguf-py") and ref["bytes_equal"] is True
    assert ref["compared"] == 4 and ref["mismatches"] == [] and ref["all_bytes"] == expected_npy
    assert set(data["ratios"]) >= {"open", "first_read", "random_read_p50", "stream", "npy_over_raw", "decode_ahead_gain"}
    assert len(data["targets"]) == 4 and all(isinstance(t["met"], bool) for t in data["targets"])
    groups = m["groups"]
    types = groups["storage_type"]
    assert sorted(types) == ["F32", "Q4_K", "Q5_0", "Q8_0"] and all(g["count"] == 1 for g in types.values())
    assert types["Q8_0"]["npy_bytes"] > 300 * 64 * 4 and types["Q8_0"]["raw_bytes"] == 300 * 64 // 32 * 34
    # decoded sizes: 76,800 and 65,536 bytes are medium, 16,384 and 256 small (< 64 KiB)
    assert {k: g["count"] for k, g in groups["size_class"].items()} == {"small <64 KiB": 2, "medium": 2}
    for axis in groups.values():
        assert sum(g["npy_bytes"] for g in axis.values()) == m["npy_bytes"]
        assert sum(g["raw_bytes"] for g in axis.values()) == m["raw_bytes"]
        assert sum(g["reference_bytes"] for g in axis.values()) == ref["all_bytes"]
        assert all(g["npy_mbs"] > 0 and g["raw_mbs"] > 0 and g["stream"] > 0 for g in axis.values())
    assert_clean(tmp_path)


def test_json_safetensors_bf16(tmp_path: Path):
    """BF16 is compared through the bytes (safetensors' numpy API has no bfloat16), F16/F32 via get_tensor."""
    require_fuse()
    rng = np.random.default_rng(7)
    bf16 = (rng.standard_normal((128, 64)).astype(np.float32).view("<u4") >> 16).astype("<u2").tobytes()
    src = tmp_path / "tiny.safetensors"
    write_safetensors(src, {"embed": (bf16, "BF16", (128, 64)),
                            "proj": rng.standard_normal((32, 64)).astype(np.float16),
                            "norm": rng.standard_normal(64).astype(np.float32)})
    result = run_bench(src, tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    ref = data["reference"]
    assert data["format"] == "safetensors" and ref["library"].startswith("safetensors")
    assert ref["bytes_equal"] is True and ref["compared"] == 3
    assert [t["name"] for t in data["targets"]] == ["daemon peak RssAnon <= cache + 100 MiB"]
    assert_clean(tmp_path)


def test_sigterm_unmounts(tiny_gguf: Path, tmp_path: Path):
    require_fuse()
    process = subprocess.Popen([*ckptfs_cli(), "bench", str(tiny_gguf)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=cli_env(TMPDIR=str(tmp_path)))
    deadline, mountpoint = time.monotonic() + 60, None
    while mountpoint is None and time.monotonic() < deadline and process.poll() is None:
        found = [d / "mnt" for d in tmp_path.glob("ckptfs-bench-*") if is_mounted(d / "mnt")]
        mountpoint = found[0] if found else None
        time.sleep(0.01)
    assert mountpoint is not None, "the bench never mounted"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "interrupted" in err
    assert not is_mounted(mountpoint)
    assert_clean(tmp_path)


def test_bench_serves_what_is_intact_and_marks_what_is_damaged(tmp_path):
    pytest.importorskip("gguf")
    rng = np.random.default_rng(5)
    path = tmp_path / "dmg.gguf"
    write_gguf(path, {"a": (rng.standard_normal((64, 256)).astype(np.float32), "Q8_0"),
                      "b": (rng.standard_normal((64, 256)).astype(np.float32), "Q8_0")})
    os.truncate(path, path.stat().st_size - 3000)  # cuts into b
    result = run_cli("bench", str(path), "--json", "--cache-size", "8M", timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [d["name"] for d in data["damaged"]] == ["b"] and "truncated" in data["damaged"][0]["reason"]
    assert data["mount"]["npy_bytes"] > 0 and data["mount"]["files"] == 8  # a, b: 3 each; metadata.json; dmg.gguf
    text = run_cli("bench", str(path), "--cache-size", "8M", timeout=300)
    assert text.returncode == 0 and "damaged tensors, left out of every read: 1" in text.stdout, text.stderr


def test_bench_names_the_file_and_tensor_when_a_read_fails(small, monkeypatch, capsys):
    """A read failing anyway (a file changed under the mount) names the phase, the file and the tensor."""
    require_fuse()
    from ckptfs import bench

    def failing_scan(paths, progress, *more):
        raise OSError(errno.EIO, "Input/output error", paths[0])

    monkeypatch.setattr(bench.run, "scan", failing_scan)  # the run looks scan up in its own module
    monkeypatch.setenv("PYTHONPATH", cli_env()["PYTHONPATH"])
    assert bench.run_bench(str(small.path), cache_size=8 << 20) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("ckptfs: error: scan every .npy: reading ") and "Input/output error" in err, err
    assert "(tensor " in err and ".npy" in err, err
