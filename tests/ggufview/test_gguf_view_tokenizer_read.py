"""Which reader builds gguf/'s vocabulary (ckptfs/ggufview/tokenizer_read.py): ``tokenizer.json`` read with the
``tokenizers`` library directly when transformers would read the same tokens from the folder — transformers
(and the torch it imports) is then never loaded — and transformers' AutoTokenizer otherwise. Both give the
converter's file: a folder whose ``tokenizer_config.json`` names a special token that ``tokenizer.json`` holds
as a plain one goes through transformers, as the converter does, and still equals the converter's output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env
from gguf_view_models import assert_same_gguf, convert, make_causal
from gguf_view_models import converter, mounted_gguf  # noqa: F401 - fixtures

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("gguf")


def imported_modules(folder: Path) -> set[str]:
    """The top-level modules ``ckptfs info --gguf FOLDER`` (which builds the header as a mount does) imports,
    from ``python -X importtime``'s report."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "ckptfs.commands.cli", "info", "--gguf",
                             str(folder)], env=cli_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "gguf/: available" in result.stdout, (result.stdout, result.stderr[-2000:])
    lines = [line.split("|")[-1] for line in result.stderr.splitlines() if line.startswith("import time:")]
    return {line.strip().split(".")[0] for line in lines}


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory) -> Path:
    return make_causal(tmp_path_factory.mktemp("hf") / "tiny-qwen2", "qwen2")


def test_a_tokenizer_json_that_transformers_reads_alike_is_read_without_transformers(qwen2):
    modules = imported_modules(qwen2)
    assert "tokenizers" in modules
    assert "transformers" not in modules and "torch" not in modules


def test_a_folder_transformers_reads_differently_goes_through_transformers_and_equals_the_converter(
        qwen2, tmp_path, mounted_gguf, converter):
    folder = tmp_path / "tiny-qwen2-config"
    subprocess.run(["cp", "-r", str(qwen2), str(folder)], check=True)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    assert "!" in vocab
    config["pad_token"] = "!"  # a plain token of the vocabulary named special: transformers makes it one
    config_path.write_text(json.dumps(config, indent=2))
    assert "transformers" in imported_modules(folder)
    reference = convert(folder, tmp_path / "converted.gguf", "auto", pre="qwen2")
    assert_same_gguf(mounted_gguf(folder, "auto"), reference)
