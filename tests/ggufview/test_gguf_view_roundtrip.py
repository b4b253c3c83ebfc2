"""The round trip a user would try: a GGUF mount's ``hf/`` folder copied out, then mounted with ``--gguf``.

The GGUF has Gemma 3 270M's real shapes, tensor types and vocabulary size (scripts/make_realistic_gguf.py
with the skeleton in scripts/real-shapes/). Its ``hf/`` folder has a ``config.json`` naming
``Gemma3ForCausalLM``, a BF16 ``model.safetensors`` and a SentencePiece-style BPE ``tokenizer.json`` (no
``tokenizer.model``), whose hash the converter does not list: the reference run registers it under
``gemma4``, the name the converter's update script gives that shape, which ckptfs names by the same shape.
The mounted file equals the converter's output on the copy (every key and tensor, compared as maps), and
llama.cpp generates the same greedy tokens from both (random weights: the text may repeat one token).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import REPO
from gguf_view_models import assert_same_greedy, assert_same_gguf, convert
from gguf_view_models import converter  # noqa: F401 - fixture

pytest.importorskip("transformers")
pytest.importorskip("gguf")

SKELETON = REPO / "scripts" / "real-shapes" / "gemma3-270m-q4_k_m.json"


def test_hf_folder_of_a_gguf_mount_round_trips(mounted, converter, tmp_path):
    source = tmp_path / "gemma3.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_realistic_gguf.py"), str(source),
                    "--shapes", str(SKELETON)], check=True, capture_output=True, timeout=300)
    folder = tmp_path / "gemma-3-270m"
    shutil.copytree(mounted(source, "--hf") / "hf", folder)
    assert "Gemma3ForCausalLM" in (folder / "config.json").read_text()
    assert not (folder / "tokenizer.model").exists()
    reference = convert(folder, tmp_path / "converted.gguf", "auto", pre="gemma4")
    mine = mounted(folder, "--gguf") / "gguf" / "model.gguf"
    assert_same_gguf(mine, reference)
    assert_same_greedy(reference, mine, 8, distinct=1)
