"""``ckptfs verify hf://...``: without a manifest each Hub file is hashed and compared with its LFS oid (the
sha256 the Hub sends as X-Linked-Etag); with one, a tensor changed on the CDN is named. Against the loopback
Hub stand-in (loopback/servers.py) with nginx as the CDN."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

pytest.importorskip("urllib3")

from conftest import ckptfs_cli, cli_env
from fixtures import write_mixed_gguf
from integrity_fixtures import flip, reference_tensors
from loopback.servers import HubStandIn, Nginx

import ckptfs
from ckptfs.integrity.manifest import build_manifest

URL = "hf://org/model/mixed.gguf"


@pytest.fixture
def hub(tmp_path):
    if not os.path.exists("/usr/sbin/nginx"):
        pytest.skip("nginx is not installed")
    repo, cdn = tmp_path / "repo", tmp_path / "cdn"
    repo.mkdir()
    cdn.mkdir()
    write_mixed_gguf(repo / "mixed.gguf")
    with Nginx(cdn) as cdn_server, HubStandIn({"org/model": repo}, cdn, cdn_server.url) as stand_in:
        yield stand_in, repo, cdn


def run_verify(stand_in, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ckptfs_cli(), "verify", *args], env=cli_env(HF_ENDPOINT=stand_in.url),
                          capture_output=True, text=True, timeout=120)


def test_hub_file_checked_against_its_lfs_oid(hub):
    stand_in, repo, cdn = hub
    oid = hashlib.sha256((repo / "mixed.gguf").read_bytes()).hexdigest()
    good = run_verify(stand_in, URL)
    assert good.returncode == 0, good.stderr
    served = cdn / oid  # the CDN's copy, which the Hub's redirect points at
    offset = {n: o for n, o, _ in reference_tensors(served)}["q8_0.mat"]
    flip(served, offset + 1)  # size and mtime kept: nginx's ETag does not change
    bad = run_verify(stand_in, URL)
    assert bad.returncode == 3, bad.stderr
    actual = hashlib.sha256(served.read_bytes()).hexdigest()
    assert bad.stdout.splitlines() == [f"mixed.gguf: sha256 {actual}, the source's recorded sha256 (LFS oid) is {oid}"]


def test_hub_file_against_a_manifest_names_the_tensor(hub, tmp_path):
    stand_in, repo, cdn = hub
    with ckptfs.open(repo / "mixed.gguf") as ck:
        (tmp_path / "m.json").write_text(build_manifest(ck).dumps())
    served = cdn / hashlib.sha256((repo / "mixed.gguf").read_bytes()).hexdigest()
    offset = {n: o for n, o, _ in reference_tensors(served)}["q6_k.cube"]
    flip(served, offset + 7)
    result = run_verify(stand_in, URL, "--manifest", str(tmp_path / "m.json"))
    assert result.returncode == 3, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[1].startswith("mixed.gguf: tensor 'q6_k.cube': stored bytes differ")
