"""Every mount holds the checkpoint's own files, byte for byte (docs/reference/layout.md), and a mount's
names never depend on the working directory it was made from.

A single GGUF or safetensors file mounted — local, ``https://`` (nginx), ``s3://`` (moto), ``hf://`` (the Hub
stand-in) — shows the file under its own name beside the tensor views: its sha256 through the mount equals the
original's, ranges read with O_DIRECT and through mmap equal the file's, and a remote one is fetched per range
(nginx's access log: reading 4 KiB of a 9 MiB file moves far less than the file). The file is read through the
checkpoint's own sources: the daemon holds one descriptor on it however both the tensors and the file are read.

A split set mounted by a relative path from another working directory serves its merged ``model.gguf`` (gguf-py
reads it), and the daemon's log names the source by its real absolute path.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import mount_stats, wait_until
from fixtures import quantized, write_gguf, write_mixed_gguf, write_safetensors
from gguf import GGUFReader
from mount_expect import read_direct
from multifile_sets import gguf_tensors, write_split_gguf
from multifile_sets import check_merged
from mount_expect import check_same_file, descriptors_on

MiB = 1 << 20


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MiB), b""):
            digest.update(chunk)
    return digest.hexdigest()






# ------------------------------------------------------------------------------------------ local files

def test_a_single_gguf_mount_holds_the_file(mounted, tmp_path):
    written = write_mixed_gguf(tmp_path / "mixed.gguf")
    mnt = mounted(written.path)
    names = os.listdir(mnt)
    assert "mixed.gguf" in names and "metadata.json" in names
    check_same_file(mnt / "mixed.gguf", written.path)
    name = next(n for n in names if n.endswith(".npy"))
    np.load(mnt / name)  # tensors and the file itself: one reader, one descriptor
    assert descriptors_on(mount_stats(mnt)["pid"], written.path) == 1
    # the file through the mount is a GGUF gguf-py reads as the original
    ours, theirs = GGUFReader(str(mnt / "mixed.gguf")), GGUFReader(str(written.path))
    assert [(t.name, bytes(t.data)) for t in ours.tensors] == [(t.name, bytes(t.data)) for t in theirs.tensors]


def test_a_single_safetensors_mount_holds_the_file(mounted, tmp_path):
    from safetensors.numpy import load_file

    rng = np.random.default_rng(2)
    tensors = {"a.weight": rng.standard_normal((64, 33)).astype(np.float32),
               "b.bias": rng.integers(-9, 9, 100).astype(np.int16)}
    written = write_safetensors(tmp_path / "model.safetensors", tensors)
    mnt = mounted(written.path)
    assert {"model.safetensors", "a.weight.npy", "b.bias.npy", "metadata.json"} <= set(os.listdir(mnt))
    check_same_file(mnt / "model.safetensors", written.path, seed=1)
    loaded = load_file(str(mnt / "model.safetensors"))
    assert loaded.keys() == tensors.keys() and all(np.array_equal(loaded[k], v) for k, v in tensors.items())


def test_a_file_named_like_a_tensor_file_is_numbered(mounted, tmp_path):
    """Tensor files keep their names; the checkpoint file that clashes with one gets ~2, as pass-through
    files do. A safetensors file named metadata.json clashes with the mount's own metadata.json."""
    values = np.arange(12, dtype=np.float32)
    path = write_gguf(tmp_path / "t.npy", {"t": (values, "F32")}).path
    mnt = mounted(path)
    assert np.array_equal(np.load(mnt / "t.npy"), values)  # the tensor's view keeps the name
    assert set(os.listdir(mnt)) == {"t.npy", "t.raw", "t.meta.json", "metadata.json", "t~2.npy"}
    assert (mnt / "t~2.npy").read_bytes() == path.read_bytes()

    st = write_safetensors(tmp_path / "metadata.json", {"w": values}).path
    mnt = mounted(st)
    assert set(os.listdir(mnt)) == {"w.npy", "w.raw", "w.meta.json", "metadata.json", "metadata~2.json"}
    assert (mnt / "metadata~2.json").read_bytes() == st.read_bytes()
    assert (mnt / "metadata.json").read_bytes() != st.read_bytes()


# ------------------------------------------------------------------------------------------ names from a cwd

def test_split_set_mounted_by_a_relative_path_from_another_cwd(mounted, tmp_path, monkeypatch):
    """Relative SRC, --log-file and --cache-dir: the daemon runs in / and must not depend on the cwd of
    ``ckptfs mount``. Before, every stat of model.gguf was EIO and the log said "mounted /model-...gguf"."""
    work = tmp_path / "work"
    shards = write_split_gguf(work / "split", gguf_tensors(count=7), per_shard=3)
    mnt = mounted(f"./split/{shards[1].name}", "--log-file", "daemon.log", "--cache-dir", "cache", cwd=work)
    monkeypatch.chdir("/")  # and this process reads from elsewhere
    assert os.stat(mnt / "model.gguf").st_size > 0
    check_merged(GGUFReader(str(mnt / "model.gguf")), shards)
    for shard in shards:
        assert sha256(mnt / shard.name) == sha256(shard)
    np.load(mnt / "blk.1.weight.npy")  # Q8_0: decoded, so its groups go to the disk tier
    log = (work / "daemon.log").read_text()
    assert f"mounted {work}/split/{shards[1].name} at {mnt}" in log, log
    assert "cannot open" not in log and "EIO" not in log, log
    cached = work / "cache"  # the disk tier is the cwd's cache/, not /cache
    assert wait_until(lambda: cached.is_dir() and any(p.is_file() for p in cached.rglob("*.e")), timeout=10)


def test_a_path_with_dot_and_tilde_names_the_real_file(mounted, tmp_path):
    """``./m.gguf`` is logged as the real absolute path (it was "/m.gguf"); ``~`` is expanded."""
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    path = write_gguf(home / "models" / "m.gguf", {"x": (np.ones(8, np.float32), "F32")}).path
    mnt = mounted("./models/m.gguf", "--log-file", "log.txt", cwd=home)
    assert (mnt / "m.gguf").read_bytes() == path.read_bytes()
    assert f"mounted {home}/models/m.gguf at {mnt}" in (home / "log.txt").read_text()
    mnt = mounted("~/models/../models/m.gguf", env={"HOME": str(home)}, cwd="/")
    assert (mnt / "m.gguf").read_bytes() == path.read_bytes()
    source = json.loads((mnt / "x.meta.json").read_text())["source"]
    assert source == f"{home}/models/../models/m.gguf"  # absolute; a ".." after a name kept (it may be a link)


# ------------------------------------------------------------------------------------------ remote files

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """nginx serving one 9 MiB GGUF (test_remote_http's site has it among others; importing that module here
    would skip these local tests where urllib3 is missing)."""
    from loopback.servers import Nginx
    from conftest import require_nginx

    require_nginx()
    root = tmp_path_factory.mktemp("www")
    rng = np.random.default_rng(5)
    write_gguf(root / "big.gguf", {"big.q4k": (quantized("Q4_K", (4096, 4096), rng), "Q4_K"),
                                   "small.f32": (rng.standard_normal(100).astype(np.float32), "F32")})
    with Nginx(root) as server:
        yield server, root


def test_an_https_file_mount_holds_the_file_fetched_per_range(site, mounted):
    from loopback.servers import requests_since

    server, root = site
    size = (root / "big.gguf").stat().st_size
    assert size > 8 * MiB
    mnt = mounted(server.url + "/big.gguf?X-Amz-Signature=not-a-name", "--timeout", "10", "--stall-timeout", "2")
    assert "big.gguf" in os.listdir(mnt)  # the name without the query
    before = len(server.access_log())
    (got,) = read_direct(mnt / "big.gguf", [(size // 2, 4096)])
    assert got == (root / "big.gguf").read_bytes()[size // 2: size // 2 + 4096]
    fetched = sum(n for _, _, n in requests_since(server, before))
    assert 0 < fetched < size // 2, fetched  # a range, not the file
    check_same_file(mnt / "big.gguf", root / "big.gguf", seed=3)


def test_an_s3_file_mount_holds_the_file(tmp_path, mounted):
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto")
    from loopback.servers import MotoS3, environment

    written = write_mixed_gguf(tmp_path / "mixed.gguf")
    with MotoS3() as server, environment(server.env()):
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket="models")
        client.upload_file(str(written.path), "models", "q/mixed.gguf")
        mnt = mounted("s3://models/q/mixed.gguf", "--timeout", "10", "--stall-timeout", "2", env=server.env())
        assert "mixed.gguf" in os.listdir(mnt)
        check_same_file(mnt / "mixed.gguf", written.path, seed=4)


def test_an_hf_file_mount_holds_the_file(tmp_path, mounted):
    pytest.importorskip("huggingface_hub")
    from loopback.servers import HubStandIn, Nginx, environment
    from conftest import require_nginx

    require_nginx()
    repo, cdn = tmp_path / "repo", tmp_path / "cdn"
    repo.mkdir()
    cdn.mkdir()
    written = write_mixed_gguf(repo / "mixed.gguf")
    with Nginx(cdn) as cdn_server, HubStandIn({"org/m": repo}, cdn, cdn_server.url) as hub:
        with environment({"HF_ENDPOINT": hub.url}):
            mnt = mounted("hf://org/m/mixed.gguf", "--timeout", "10", env={"HF_ENDPOINT": hub.url})
            assert "mixed.gguf" in os.listdir(mnt)
            check_same_file(mnt / "mixed.gguf", written.path, seed=5)


def test_every_local_path_of_a_mount_request_is_resolved(tmp_path, monkeypatch):
    """What the daemon opens later is absolute before the fork: SRC and the log file here, the open options'
    paths (mirrors, manifest, cache folder) by OpenOptions; "." components dropped, a ".." kept, URLs as
    they are."""
    from ckptfs.core.options import OpenOptions
    from ckptfs.service.mount import MountRequest, _resolved

    monkeypatch.chdir(tmp_path)
    options = OpenOptions.build(cache_dir="c", manifest="x.json", mirrors=("mir.gguf", "https://h/m.gguf?sig=1"))
    request = _resolved(MountRequest(src="./m.gguf", mountpoint="mnt", log_file="logs/./l", open_options=options))
    assert (request.src, request.log_file) == (f"{tmp_path}/m.gguf", f"{tmp_path}/logs/l")
    assert _resolved(MountRequest(src="../a/m.gguf", mountpoint="mnt")).src == f"{tmp_path}/../a/m.gguf"
    opened = request.open_options
    assert (opened.cache_dir, opened.manifest) == (f"{tmp_path}/c", f"{tmp_path}/x.json")
    assert opened.mirrors == (f"{tmp_path}/mir.gguf", "https://h/m.gguf?sig=1")
    assert _resolved(MountRequest(src="s3://b/k.gguf", mountpoint="mnt")).src == "s3://b/k.gguf"
