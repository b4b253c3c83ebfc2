"""hf:// checkpoints against a loopback Hub: a stand-in answering resolve URLs with a 302 to a second
loopback host (Debian's nginx as the CDN) with ETag, X-Linked-Etag, X-Linked-Size and X-Repo-Commit, and
the tree listing. huggingface_hub's own client (list_repo_tree, hf_hub_download) is run against the
stand-in first, so the stand-in answers as the Hub does and is not shaped by ckptfs alone. Values are
compared with safetensors / gguf-py reading the local files.
"""

from __future__ import annotations

import hashlib
import os
import re

import numpy as np
import pytest

pytest.importorskip("urllib3")
huggingface_hub = pytest.importorskip("huggingface_hub")

import ckptfs  # noqa: E402
from ckptfs.core.errors import CheckpointError  # noqa: E402
from ckptfs.sources import open_source  # noqa: E402
from fixtures import write_mixed_gguf  # noqa: E402
from multifile_sets import MODEL_FILES, safetensors_tensors, write_model_files, write_safetensors_set  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from loopback.servers import HubStandIn, Nginx, environment  # noqa: E402
from conftest import require_nginx  # noqa: E402

TOKEN = "hf_loopback_secret_token"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    require_nginx()
    base = tmp_path_factory.mktemp("hub")
    gguf_repo, st_repo, cdn = base / "gguf", base / "st", base / "cdn"
    for d in (gguf_repo, st_repo, cdn):
        d.mkdir()
    write_mixed_gguf(gguf_repo / "mixed.gguf")
    (gguf_repo / "README.md").write_text("# a model card\n")
    write_safetensors_set(st_repo, safetensors_tensors(2, per_shard=3, seed=4))
    write_model_files(st_repo)
    with Nginx(cdn) as cdn_server:
        stand_in = HubStandIn({"org/gguf-model": gguf_repo, "org/st-model": st_repo}, cdn, cdn_server.url,
                              token=TOKEN)
        with stand_in, environment({"HF_ENDPOINT": stand_in.url, "HF_TOKEN": TOKEN}):
            yield stand_in, cdn_server, gguf_repo, st_repo


def test_the_stand_in_answers_huggingface_hub_itself(hub, tmp_path):
    stand_in, _, gguf_repo, st_repo = hub
    api = huggingface_hub.HfApi(endpoint=stand_in.url, token=TOKEN)
    entries = {e.path: e for e in api.list_repo_tree("org/st-model")}
    assert set(entries) == {p.name for p in st_repo.iterdir()}
    shard = next(p for p in st_repo.iterdir() if p.suffix == ".safetensors")
    assert entries[shard.name].lfs.sha256 == hashlib.sha256(shard.read_bytes()).hexdigest()
    info = api.model_info("org/st-model")
    assert info.sha == stand_in.commit and {s.rfilename for s in info.siblings} == set(entries)
    got = huggingface_hub.hf_hub_download("org/gguf-model", "mixed.gguf", cache_dir=tmp_path, token=TOKEN,
                                          endpoint=stand_in.url)
    assert open(got, "rb").read() == (gguf_repo / "mixed.gguf").read_bytes()


def test_hf_file_equals_the_local_file_and_the_token_stays_on_the_hub(hub):
    stand_in, cdn, gguf_repo, _ = hub
    cdn_before = len(cdn.access_log())
    with ckptfs.open("hf://org/gguf-model/mixed.gguf", timeout=10, stall_timeout=2) as ck, \
            ckptfs.open(gguf_repo / "mixed.gguf") as local:
        for t in local.tensors:
            assert ck[t.name].raw() == t.raw()
            if t.decodable:
                np.testing.assert_array_equal(np.asarray(ck[t.name]), np.asarray(t))
        assert ck.tensors[0].meta["source"] == "hf://org/gguf-model/mixed.gguf"
    sha = hashlib.sha256((gguf_repo / "mixed.gguf").read_bytes()).hexdigest()
    source = open_source("hf://org/gguf-model/mixed.gguf")
    assert source.content_id() == f"sha256:{sha}"  # the LFS oid from X-Linked-Etag
    cdn_lines = cdn.access_log()[cdn_before:]
    assert cdn_lines and all('auth="-"' in line for line in cdn_lines)  # never sent to the CDN host
    assert all(TOKEN not in line for line in cdn_lines)
    assert any(auth for method, path, auth in stand_in.requests if "/resolve/" in path)


def test_hf_folder_serves_shards_index_and_files(hub):
    _, _, _, st_repo = hub
    for src in ("hf://org/st-model", "hf://org/st-model@main"):
        with ckptfs.open(src, timeout=10) as ck:
            want = {}
            for path in sorted(st_repo.glob("*.safetensors")):
                want.update(load_file(str(path)))
            assert sorted(ck) == sorted(want)
            for name, values in want.items():
                np.testing.assert_array_equal(np.asarray(ck[name]), values)
            assert set(MODEL_FILES) | {"model.safetensors.index.json"} <= set(ck.passthrough)
            assert ck.passthrough["config.json"] == f"{src}/config.json"


def test_hf_mount_passes_the_folder_through(hub, mounted):
    _, _, _, st_repo = hub
    mnt = mounted("hf://org/st-model", "--timeout", "10", "--stall-timeout", "2")
    for name, data in MODEL_FILES.items():
        assert (mnt / name).read_bytes() == data
    index = (mnt / "model.safetensors.index.json").read_bytes()
    assert index == (st_repo / "model.safetensors.index.json").read_bytes()
    for path in sorted(st_repo.glob("*.safetensors")):
        assert (mnt / path.name).read_bytes() == path.read_bytes()
        for name, values in load_file(str(path)).items():
            np.testing.assert_array_equal(np.load(mnt / f"{name}.npy"), values)


def test_missing_token_is_named_in_one_line(hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", "/nonexistent-hf-home")  # no login file either
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(CheckpointError, match=r"access denied \(HTTP 401; sent no token") as info:
        ckptfs.open("hf://org/gguf-model/mixed.gguf", timeout=10)
    assert "\n" not in str(info.value) and TOKEN not in str(info.value)
    with pytest.raises(CheckpointError, match=r"not accessible|HTTP 401"):
        ckptfs.open("hf://org/st-model", timeout=10)


def test_wrong_token_is_named_but_not_printed(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong_value_123")
    with pytest.raises(CheckpointError, match="sent the token from HF_TOKEN") as info:
        ckptfs.open("hf://org/gguf-model/mixed.gguf", timeout=10)
    assert "hf_wrong_value_123" not in str(info.value)


def test_hf_resolve_paths_served_by_nginx(tmp_path, monkeypatch):
    """HF_ENDPOINT may be any server with the resolve layout: here nginx alone (no redirect)."""
    require_nginx()
    folder = tmp_path / "www" / "acme" / "tiny" / "resolve" / "v1"
    folder.mkdir(parents=True)
    write_mixed_gguf(folder / "mixed.gguf")
    with Nginx(tmp_path / "www") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        with ckptfs.open("hf://acme/tiny@v1/mixed.gguf", timeout=10) as ck, ckptfs.open(folder / "mixed.gguf") as local:
            for t in local.tensors:
                assert ck[t.name].raw() == t.raw()
        server.wait_idle()  # every answered request is in the log
        assert any(re.search(r'"GET /acme/tiny/resolve/v1/mixed.gguf HTTP/1.1" 206', line)
                   for line in server.access_log())


def test_an_expired_cdn_location_is_resolved_again_through_the_hub(hub, tmp_path):
    """Reads go straight to the CDN location the Hub redirected to; when it refuses (an expired signed URL)
    the resolve URL is asked again, and another CDN's ETag for the same LFS sha256 is the same file."""
    from loopback.faultproxy import FaultProxy

    stand_in, cdn, gguf_repo, _ = hub
    data = os.urandom(6 << 20)
    (gguf_repo / "weights.bin").write_bytes(data)
    stand_in._add("org/gguf-model", "weights.bin", gguf_repo / "weights.bin")
    other_cdn = tmp_path / "cdn2"
    other_cdn.mkdir()
    sha = hashlib.sha256(data).hexdigest()
    (other_cdn / sha).write_bytes(data)
    os.utime(other_cdn / sha, (1_000_000_000, 1_000_000_000))  # another mtime: nginx gives another ETag
    original = stand_in.cdn_url
    with FaultProxy(cdn.url) as first_cdn, Nginx(other_cdn) as second_cdn:
        stand_in.cdn_url = first_cdn.url
        try:
            source = open_source("hf://org/gguf-model/weights.bin")
            assert source.pread(3 << 20, 1000) == data[3 << 20:(3 << 20) + 1000]
            first_cdn.always("403")
            stand_in.cdn_url = second_cdn.url
            assert source.pread(5 << 20, 1000) == data[5 << 20:(5 << 20) + 1000]
            assert second_cdn.access_log(expect=1)
        finally:
            stand_in.cdn_url = original
