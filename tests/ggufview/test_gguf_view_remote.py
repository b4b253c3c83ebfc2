"""``gguf/model.gguf`` of a remote Hugging Face folder: ``hf://`` (the Hub stand-in, its LFS files on an
nginx CDN) and ``s3://`` (moto). The header's tokenizer and config files are fetched through the mount's
sources; the file equals the converter's output on a local copy of the same folder (only the path-dependent
keys may differ), a BERT folder's pooling (``modules.json`` and its sub-folder's ``config.json``) included.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_view_models import assert_same_gguf, convert, make_bert, make_causal, s3_gguf_copy
from gguf_view_models import converter  # noqa: F401 - fixture
from loopback.servers import HubStandIn, Nginx, environment
from conftest import require_nginx

pytest.importorskip("transformers")
pytest.importorskip("gguf")

PRE = {"tiny-qwen2": "qwen2", "tiny-bert": "default"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {"tiny-qwen2": make_causal(root / "tiny-qwen2", "qwen2", seed=7),
            "tiny-bert": make_bert(root / "tiny-bert", seed=8)}


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-bert"])
def test_hf_folder_equal_to_the_converter(mounted, folders, converter, tmp_path, name):
    pytest.importorskip("huggingface_hub")
    require_nginx()
    cdn = tmp_path / "cdn"
    cdn.mkdir()
    reference = convert(folders[name], tmp_path / "converted.gguf", "auto", pre=PRE[name])
    with Nginx(cdn) as cdn_server, HubStandIn({f"org/{name}": folders[name]}, cdn, cdn_server.url) as hub:
        with environment({"HF_ENDPOINT": hub.url}):
            mnt = mounted(f"hf://org/{name}", "--gguf", "--timeout", "30", env={"HF_ENDPOINT": hub.url})
            assert_same_gguf(mnt / "gguf" / "model.gguf", reference)
            assert any(path.endswith("/model.safetensors") for _, path, _ in hub.requests)


def test_s3_folder_equal_to_the_converter(mounted, folders, converter, tmp_path):
    pytest.importorskip("boto3")
    folder = folders["tiny-qwen2"]
    reference = convert(folder, tmp_path / "converted.gguf", "q8_0", pre=PRE["tiny-qwen2"])
    assert_same_gguf(s3_gguf_copy(mounted, folder, tmp_path / "copy.gguf", "--gguf-type", "q8_0"), reference)
