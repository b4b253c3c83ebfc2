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
from cli_runs import one_error_line, run_cli
from conftest import ckptfs_cli, cli_env, mount_stats
from gguf_view_models import LLAMA3_ROPE, assert_same_greedy, assert_same_gguf, convert, make_llama, set_architecture
from gguf_view_models import converter, mounted_gguf  # noqa: F401 - fixtures

pytest.importorskip("transformers")
pytest.importorskip("gguf")

N_PREDICT = 16
SUPPORTED = ("BertForMaskedLM, BertModel, Gemma3ForCausalLM, GptOssForCausalLM, LLaMAForCausalLM, LlamaForCausalLM, "
             "MistralForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {"llama": make_llama(root / "tiny-llama"),
            "mistral": make_llama(root / "tiny-mistral", dtype="float16", arch="mistral", hidden=48, seed=1,
                                  lowercase=True),
            "sharded": make_llama(root / "tiny-sharded", dtype="float32", seed=2, shard="100KB", bias=True),
            "llama3": make_llama(root / "tiny-llama3", seed=3, rope=LLAMA3_ROPE),
            "spm": make_llama(root / "tiny-spm", dtype="float16", seed=4, tokenizer="spm")}


@pytest.mark.parametrize("case,outtype", [("llama", "auto"), ("llama", "f32"), ("llama", "f16"), ("llama", "bf16"),
                                          ("llama", "q8_0"), ("mistral", "auto"), ("mistral", "q8_0"),
                                          ("sharded", "auto"), ("llama3", "auto"),
                                          ("spm", "auto")])
def test_equal_to_the_converter(mounted_gguf, folders, converter, tmp_path, case, outtype):
    folder = folders[case]
    reference = convert(folder, tmp_path / "converted.gguf", outtype)
    mine = mounted_gguf(folder, outtype)
    assert_same_gguf(mine, reference)
    whole = mine.read_bytes()  # and every byte, read in odd pieces at odd offsets, is the same file
    rng = np.random.default_rng(len(whole))
    with open(mine, "rb") as f:
        for _ in range(40):
            start = int(rng.integers(0, len(whole)))
            size = int(rng.integers(1, 70_000))
            f.seek(start)
            assert f.read(size) == whole[start:start + size]


def test_file_types_and_fallback(mounted_gguf, folders):
    """auto follows the stored type (BF16 -> bf16, F16 -> f16, F32 -> f16); Q8_0 rows of 48 values fall
    back to F16 as the converter's quantizer refuses them; 1-D tensors and norms stay F32."""
    from gguf import GGUFReader

    expected = {("llama", "auto"): 32, ("mistral", "auto"): 1, ("sharded", "auto"): 1, ("mistral", "q8_0"): 7}
    for (case, outtype), file_type in expected.items():
        reader = GGUFReader(mounted_gguf(folders[case], outtype))
        assert reader.fields["general.file_type"].contents() == file_type
        types = {t.name: t.tensor_type.name for t in reader.tensors}
        assert types["blk.0.attn_norm.weight"] == "F32"
        if (case, outtype) == ("mistral", "q8_0"):
            assert types["blk.0.attn_q.weight"] == "F16"  # 48 columns: not whole 32-value blocks


@pytest.mark.parametrize("case", ["llama", "llama3", "spm"])
def test_llama_cpp_greedy_tokens(mounted_gguf, folders, converter, tmp_path, case):
    reference = convert(folders[case], tmp_path / "converted.gguf", "auto")
    assert_same_greedy(reference, mounted_gguf(folders[case], "auto"), N_PREDICT)


def test_unsupported_architecture_refuses_gguf_in_one_line(mounted, mountpoint, folders, tmp_path):
    """--gguf asked of a folder that cannot have it: the mount fails with the reason; without --gguf the
    folder mounts as ever."""
    folder = tmp_path / "other"
    shutil.copytree(folders["llama"], folder)
    set_architecture(folder, "FalconForCausalLM")
    refused = run_cli("mount", str(folder), str(mountpoint), "--gguf")
    one_error_line(refused, 1, "no gguf/ folder", f"FalconForCausalLM is not served (supported: {SUPPORTED})")
    mnt = mounted(folder)
    assert (mnt / "config.json").exists()


def test_a_folder_without_a_tokenizer_gets_one_line(mountpoint, folders, tmp_path):
    folder = tmp_path / "weights-only"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folders["llama"] / name, folder / name)
    refused = run_cli("mount", str(folder), str(mountpoint), "--gguf")
    one_error_line(refused, 1, "the folder has no tokenizer (tokenizer.model, tokenizer.json or vocab.json)")


def test_info_says_why(folders, tmp_path):
    folder = tmp_path / "other"
    shutil.copytree(folders["llama"], folder)
    set_architecture(folder, "FalconForCausalLM")
    for src, expected in ((folder, f"none: architecture FalconForCausalLM is not served (supported: {SUPPORTED})"),
                          (folders["llama"], "available (mount with --gguf)")):
        done = subprocess.run([*ckptfs_cli(), "info", "--gguf", "--json", str(src)], env=cli_env(),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["gguf"].startswith(expected)


def io_counter(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith(f"{name}:")).split()[1])


def test_the_daemon_writes_nothing(mounted_gguf, folders):
    """Reading the whole file of a fresh mount (nothing of it in the page cache yet) writes no byte to any
    disk: the daemon's write_bytes does not move."""
    for outtype in ("auto", "q8_0"):
        path = mounted_gguf(folders["llama"], outtype, fresh=True)
        pid = mount_stats(path.parent.parent)["pid"]
        written, read = io_counter(pid, "write_bytes"), io_counter(pid, "rchar")
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
        stored = sum(p.stat().st_size for p in folders["llama"].glob("*.safetensors"))
        assert io_counter(pid, "rchar") - read > stored // 2  # the daemon read the weights to serve the file
        assert io_counter(pid, "write_bytes") == written
