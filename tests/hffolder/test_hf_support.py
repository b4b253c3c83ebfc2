"""hf/ around the edges: rounding as torch rounds, architectures transformers cannot map, no transformers
installed, and a mount without --hf that never loads torch."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from cli_runs import one_error_line, run_cli
from conftest import REPO, cli_env, ckptfs_cli, mount_stats
from fixtures import write_gguf
from hf_models import sentencepiece_vocab, write_model

#: runs the ckptfs CLI as if transformers were not installed
NO_TRANSFORMERS = [sys.executable, "-c",
                   "import sys; sys.modules['transformers'] = None; from ckptfs.commands.cli import main; main()"]


def test_bfloat16_and_float16_round_as_torch():
    torch = pytest.importorskip("torch")
    from ckptfs.hffolder.safetensors_view import convert

    rng = np.random.default_rng(3)
    special = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF,
                        0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x33800000,
                        0x477FF000, 0x477FEFFF, 0x38800000], np.uint32)
    bits = np.concatenate([special, rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)])
    values = bits.view(np.float32)
    for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        expected = torch.from_numpy(values.copy()).to(dtype).view(torch.int16).numpy().view(np.uint16)
        assert np.array_equal(convert(values, name).view(np.uint16), expected), name


def test_an_architecture_transformers_cannot_map(mounted, mountpoint, tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "rwkv.gguf"
    write_gguf(path, {"token_embd.weight": (np.zeros((8, 32), np.float32), "F32")}, arch="rwkv7")
    info = subprocess.run([*ckptfs_cli(), "info", "--hf", "--json", str(path)], env=cli_env(), capture_output=True,
                          text=True, check=True)
    assert json.loads(info.stdout)["hf"] == "none: transformers has no GGUF mapping for architecture 'rwkv7'"
    text = subprocess.run([*ckptfs_cli(), "info", "--hf", str(path)], env=cli_env(), capture_output=True, text=True,
                          check=True).stdout
    assert "hf/: none: transformers has no GGUF mapping for architecture 'rwkv7'" in text.splitlines()
    plain = subprocess.run([*ckptfs_cli(), "info", "--json", str(path)], env=cli_env(), capture_output=True,
                           text=True, check=True)
    assert json.loads(plain.stdout)["hf"] is None  # opt-in: the check imports transformers and torch
    refused = run_cli("mount", str(path), str(mountpoint), "--hf")
    one_error_line(refused, 1, "no hf/ folder: transformers has no GGUF mapping for architecture 'rwkv7'")
    mnt = mounted(str(path))  # without --hf, the tensors as ever
    assert (mnt / "token_embd.weight.npy").exists()


def test_a_processor_that_reshapes_is_refused_with_its_reason(tmp_path):
    pytest.importorskip("transformers")
    import ckptfs
    from ckptfs.hffolder import Unsupported

    path = tmp_path / "bloom.gguf"
    write_gguf(path, {"token_embd.weight": (np.zeros((8, 32), np.float32), "F32")}, arch="bloom")
    with ckptfs.open(str(path)) as ck:
        with pytest.raises(Unsupported, match="BloomTensorProcessor"):
            ckptfs.hf_folder(ck)


def test_without_transformers_one_line_and_no_folder(mounted, mountpoint, tmp_path):
    vocab = sentencepiece_vocab(tmp_path / "spm", gemma=False)
    path = write_model(tmp_path / "llama.gguf", "llama", vocab).path
    info = subprocess.run([*NO_TRANSFORMERS, "info", "--hf", "--json", str(path)], env=cli_env(), capture_output=True,
                          text=True, check=True)
    assert json.loads(info.stdout)["hf"] == ("none: transformers not installed: pip install 'ckptfs[hf]' "
                                             "(transformers, torch and gguf)")
    refused = subprocess.run([*NO_TRANSFORMERS, "mount", str(path), str(mountpoint), "--hf", "-f"], env=cli_env(),
                             capture_output=True, text=True, timeout=120)
    one_error_line(refused, 1, "no hf/ folder: transformers not installed: pip install 'ckptfs[hf]' "
                               "(transformers, torch and gguf)")
    mnt = mounted(str(path), cli=NO_TRANSFORMERS)
    assert (mnt / "token_embd.weight.npy").exists()


def _maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_torch_is_loaded_only_with_hf(mounted, tmp_path):
    pytest.importorskip("transformers")
    vocab = sentencepiece_vocab(tmp_path / "spm", gemma=False)
    path = write_model(tmp_path / "llama.gguf", "llama", vocab).path
    plain = mounted(str(path))
    assert "libtorch" not in _maps(mount_stats(plain)["pid"])
    with_hf = mounted(str(path), "--hf")
    assert "libtorch" in _maps(mount_stats(with_hf)["pid"])
    assert (with_hf / "hf" / "model.safetensors").stat().st_size > 0
    code = "import sys, ckptfs; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))"
    out = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_api_closes_only_what_it_opened(tmp_path):
    pytest.importorskip("transformers")
    import ckptfs

    path = write_model(tmp_path / "llama.gguf", "llama", sentencepiece_vocab(tmp_path / "spm", gemma=False)).path
    with ckptfs.open(str(path)) as ck:
        folder = ckptfs.hf_folder(ck, dtype="float32")
        folder.close()
        assert np.array_equal(ck["token_embd.weight"][0], ck["token_embd.weight"].numpy()[0])  # still open
    own = ckptfs.hf_folder(str(path))
    own.close()
    with pytest.raises(ckptfs.CheckpointError):
        own.read("model.safetensors")


def test_info_runs_the_check_the_mount_runs(mounted, mountpoint, tmp_path):
    """A GGUF whose architecture transformers maps but whose folder cannot be built (no tokenizer): info says
    so, as the mount does; --hf of that one checkpoint fails the mount (exit 1, one line); as a member of a
    repository it is served without hf/ (one line in the log) beside a member that has one."""
    pytest.importorskip("transformers")
    path = tmp_path / "no-tokenizer.gguf"
    write_gguf(path, {"token_embd.weight": (np.zeros((8, 32), np.float32), "F32")}, arch="llama")
    reason = "the GGUF holds no tokenizer (no tokenizer.ggml.tokens)"
    info = run_cli("info", "--hf", "--json", str(path))
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["hf"] == f"none: {reason}"
    one_error_line(run_cli("mount", str(path), str(mountpoint), "--hf"), 1, f"no hf/ folder: {reason}")

    repo = tmp_path / "repo"
    repo.mkdir()
    path.rename(repo / "no-tokenizer.gguf")
    write_model(repo / "llama.gguf", "llama", sentencepiece_vocab(tmp_path / "spm", gemma=False))
    log = tmp_path / "mount.log"
    mnt = mounted(str(repo), "--hf", "--log-file", str(log))
    assert (mnt / "llama" / "hf" / "config.json").exists()
    assert (mnt / "no-tokenizer" / "token_embd.weight.npy").exists()
    assert not (mnt / "no-tokenizer" / "hf").exists()
    lines = [line for line in log.read_text().splitlines() if "hf/" in line]
    assert len(lines) == 1 and f"no hf/ folder: {reason}" in lines[0], lines


def test_the_demo_gguf_info_and_mount_agree(mountpoint, tmp_path):
    """The set-up's demo GGUF (no tokenizer transformers can build): ``info --hf`` says it gets no hf/, and
    ``mount --hf`` fails with the same reason, where info said "available" and the mount exited 0 without it."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(REPO / "scripts"))
    from make_demo_gguf import write_demo

    path = tmp_path / "demo.gguf"
    write_demo(str(path))
    info = run_cli("info", "--hf", "--json", str(path), timeout=180)
    assert info.returncode == 0, info.stderr
    said = json.loads(info.stdout)["hf"]
    assert said.startswith("none: transformers cannot build its tokenizer"), said
    one_error_line(run_cli("mount", str(path), str(mountpoint), "--hf", timeout=180), 1,
                   f"no hf/ folder: {said[len('none: '):]}")


@pytest.mark.parametrize("key,value,words", [
    ("llama.block_count", 10**9, "num_hidden_layers is 1000000000, more than the"),
    ("llama.block_count", 9, "no tensor belongs to a block 8"),
    ("llama.embedding_length", 10**9, "hidden_size 1000000000 is larger than any tensor dimension"),
    ("llama.attention.head_count", 10**9, "num_attention_heads 1000000000 is larger than any tensor dimension"),
])
def test_a_hostile_count_in_the_metadata_is_one_line(mounted, mountpoint, tmp_path, key, value, words):
    """A count in a GGUF's metadata that its tensors do not bear out: ``mount --hf`` under RLIMIT_AS 1 GiB is
    one line (a block count of 10**9 had transformers size its config by it: a MemoryError after 40 s), and
    the plain mount serves the tensors as gguf-py reads them."""
    pytest.importorskip("transformers")
    from gguf import GGUFReader
    from gguf.quants import dequantize

    vocab = sentencepiece_vocab(tmp_path / "spm", gemma=False)
    path = write_model(tmp_path / "hostile.gguf", "llama", vocab, extra={key: value}).path
    refused = run_cli("mount", str(path), str(mountpoint), "--hf", address_space=1 << 30, timeout=120)
    one_error_line(refused, 1, "no hf/ folder: the GGUF's", words)
    mnt = mounted(str(path))
    tensor = next(t for t in GGUFReader(path).tensors if t.name == "token_embd.weight")
    assert np.array_equal(np.load(mnt / "token_embd.weight.npy"), dequantize(tensor.data, tensor.tensor_type))
