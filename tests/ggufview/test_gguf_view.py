"""``gguf/model.gguf`` of a Hugging Face folder (``ckptfs mount --gguf``) against llama.cpp's converter.

Every metadata key/value and every tensor's type, shape and bytes of the mounted file equal those of
``convert_hf_to_gguf.py`` run on the same folder with the same ``--outtype`` (compared as maps with gguf-py;
only the path-dependent ``general.name``/``basename``/``source*`` left out), for each output type, a BF16
llama, an F16 Mistral whose rows are not whole Q8_0 blocks, a sharded folder with attention biases and Llama 3.1's rope scaling
(the converter's computed ``rope_freqs`` tensor), and a SentencePiece ``tokenizer.model`` with an added token; llama.cpp generates the
same greedy tokens from both files; a read of part of a q/k tensor reads only the stored rows it maps to;
an architecture not in the table gets no ``gguf/`` and one log line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import ckptfs_cli, cli_env, mount_stats, skip_or_fail
from gguf_view_models import (LLAMA3_ROPE, convert, gguf_maps, llama_client, llama_cpp_tree, make_llama,
                              set_architecture)

pytest.importorskip("transformers")
pytest.importorskip("gguf")

N_PREDICT = 16


@pytest.fixture(scope="module")
def converter() -> Path:
    tree = llama_cpp_tree()
    if not (tree / "convert_hf_to_gguf.py").is_file():
        skip_or_fail(f"llama.cpp's converter is not there ({tree}): run bash scripts/build_llama_cpp.sh")
    return tree


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {"llama": make_llama(root / "tiny-llama"),
            "mistral": make_llama(root / "tiny-mistral", dtype="float16", arch="mistral", hidden=48, seed=1,
                                  lowercase=True),
            "sharded": make_llama(root / "tiny-sharded", dtype="float32", seed=2, shard="100KB", bias=True),
            "llama3": make_llama(root / "tiny-llama3", seed=3, rope=LLAMA3_ROPE),
            "spm": make_llama(root / "tiny-spm", dtype="float16", seed=4, tokenizer="spm")}


_MOUNTS: dict[tuple[Path, str], Path] = {}


def mounted_gguf(module_mounted, folder: Path, outtype: str, fresh: bool = False) -> Path:
    """``gguf/model.gguf`` of ``folder`` mounted with --gguf-type ``outtype`` (one mount per pair in this
    module, unless ``fresh``)."""
    key = (folder, outtype)
    if fresh or key not in _MOUNTS or not _MOUNTS[key].exists():
        _MOUNTS[key] = module_mounted(folder, "--gguf", "--gguf-type", outtype) / "gguf" / "model.gguf"
    return _MOUNTS[key]


def assert_same_gguf(mine: Path, reference: Path) -> None:
    fields, tensors = gguf_maps(mine)
    ref_fields, ref_tensors = gguf_maps(reference)
    assert sorted(fields) == sorted(ref_fields)
    for key, value in ref_fields.items():
        assert fields[key] == value, key
    assert sorted(tensors) == sorted(ref_tensors)
    for name, (qtype, shape, data) in ref_tensors.items():
        assert tensors[name][:2] == (qtype, shape), name
        assert tensors[name][2] == data, name
    assert mine.stat().st_size == reference.stat().st_size


@pytest.mark.parametrize("case,outtype", [("llama", "auto"), ("llama", "f32"), ("llama", "f16"), ("llama", "bf16"),
                                          ("llama", "q8_0"), ("mistral", "auto"), ("mistral", "q8_0"),
                                          ("sharded", "auto"), ("llama3", "auto"),
                                          ("spm", "auto")])
def test_equal_to_the_converter(module_mounted, folders, converter, tmp_path, case, outtype):
    folder = folders[case]
    reference = convert(folder, tmp_path / "converted.gguf", outtype)
    mine = mounted_gguf(module_mounted, folder, outtype)
    assert_same_gguf(mine, reference)
    whole = mine.read_bytes()  # and every byte, read in odd pieces at odd offsets, is the same file
    rng = np.random.default_rng(len(whole))
    with open(mine, "rb") as f:
        for _ in range(40):
            start = int(rng.integers(0, len(whole)))
            size = int(rng.integers(1, 70_000))
            f.seek(start)
            assert f.read(size) == whole[start:start + size]


def test_file_types_and_fallback(module_mounted, folders):
    """auto follows the stored type (BF16 -> bf16, F16 -> f16, F32 -> f16); Q8_0 rows of 48 values fall
    back to F16 as the converter's quantizer refuses them; 1-D tensors and norms stay F32."""
    from gguf import GGUFReader

    expected = {("llama", "auto"): 32, ("mistral", "auto"): 1, ("sharded", "auto"): 1, ("mistral", "q8_0"): 7}
    for (case, outtype), file_type in expected.items():
        reader = GGUFReader(mounted_gguf(module_mounted, folders[case], outtype))
        assert reader.fields["general.file_type"].contents() == file_type
        types = {t.name: t.tensor_type.name for t in reader.tensors}
        assert types["blk.0.attn_norm.weight"] == "F32"
        if (case, outtype) == ("mistral", "q8_0"):
            assert types["blk.0.attn_q.weight"] == "F16"  # 48 columns: not whole 32-value blocks


@pytest.mark.parametrize("case", ["llama", "llama3", "spm"])
def test_llama_cpp_greedy_tokens(module_mounted, folders, converter, tmp_path, case):
    probe = llama_client.probe_path()
    if not probe.exists():
        skip_or_fail(f"llama.cpp is not built ({probe} is missing): run bash scripts/build_llama_cpp.sh")
    reference = convert(folders[case], tmp_path / "converted.gguf", "auto")
    expected = llama_client.run(reference, "mmap", N_PREDICT, probe=probe)
    assert len(expected["tokens"]) == N_PREDICT and len(set(expected["tokens"])) >= 3, expected
    mine = mounted_gguf(module_mounted, folders[case], "auto")
    for mode in llama_client.MODES:
        result = llama_client.run(mine, mode, N_PREDICT, probe=probe)
        assert result["tokens"] == expected["tokens"], mode
        assert result["text"] == expected["text"], mode
        if mode == "dio":
            assert not result["dio_fallback"], result["warnings"]


def test_unsupported_architecture_gets_no_gguf(mounted, folders, tmp_path):
    folder = tmp_path / "other"
    shutil.copytree(folders["llama"], folder)
    set_architecture(folder, "FalconForCausalLM")
    log = tmp_path / "mount.log"
    mnt = mounted(folder, "--gguf", "--log-file", str(log))
    assert not (mnt / "gguf").exists()
    assert (mnt / "config.json").exists()
    lines = [line for line in log.read_text().splitlines() if "gguf/" in line]
    assert len(lines) == 1, lines
    assert "FalconForCausalLM is not served (supported: LLaMAForCausalLM, LlamaForCausalLM, MistralForCausalLM)" \
        in lines[0]


def test_a_folder_without_a_tokenizer_gets_one_line(mounted, folders, tmp_path):
    folder = tmp_path / "weights-only"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folders["llama"] / name, folder / name)
    log = tmp_path / "mount.log"
    mnt = mounted(folder, "--gguf", "--log-file", str(log))
    assert not (mnt / "gguf").exists()
    lines = [line for line in log.read_text().splitlines() if "gguf/" in line]
    assert len(lines) == 1 and "WARNING" in lines[0], lines
    assert "the folder has no tokenizer (tokenizer.model, tokenizer.json or vocab.json)" in lines[0]


def test_info_says_why(folders, tmp_path):
    folder = tmp_path / "other"
    shutil.copytree(folders["llama"], folder)
    set_architecture(folder, "FalconForCausalLM")
    for src, expected in ((folder, "none: architecture FalconForCausalLM is not served (supported: "
                                   "LLaMAForCausalLM, LlamaForCausalLM, MistralForCausalLM)"),
                          (folders["llama"], "available (mount with --gguf)")):
        done = subprocess.run([*ckptfs_cli(), "info", "--gguf", "--json", str(src)], env=cli_env(),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["gguf"].startswith(expected)


def io_counter(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith(f"{name}:")).split()[1])


def test_the_daemon_writes_nothing(module_mounted, folders):
    """Reading the whole file of a fresh mount (nothing of it in the page cache yet) writes no byte to any
    disk: the daemon's write_bytes does not move."""
    for outtype in ("auto", "q8_0"):
        path = mounted_gguf(module_mounted, folders["llama"], outtype, fresh=True)
        pid = mount_stats(path.parent.parent)["pid"]
        written, read = io_counter(pid, "write_bytes"), io_counter(pid, "rchar")
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
        stored = sum(p.stat().st_size for p in folders["llama"].glob("*.safetensors"))
        assert io_counter(pid, "rchar") - read > stored // 2  # the daemon read the weights to serve the file
        assert io_counter(pid, "write_bytes") == written
