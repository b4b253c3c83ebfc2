"""llama.cpp loading GGUFs through mounts of remote sources: the same greedy text as the file itself.

The probe, the model (scripts/make_realistic_gguf.py: 4 layers, a 4,096-token vocabulary, the Q4_K_M type
mix) and the oracle (the probe on the original file, in the same load mode) are those of
tests/clients/test_clients_llamacpp.py. The sources, all on loopback (loopback/servers.py):

- ``https://``: nginx with a certificate from a CA generated at test time, trusted by the mount through
  ``SSL_CERT_FILE`` (docs/remote.md, "TLS"); mmap and O_DIRECT (which must not fall back);
- ``s3://BUCKET/KEY.gguf``: moto's S3 server, the mount configured by the standard AWS environment;
- ``hf://ORG/REPO/FILE.gguf``: the Hub stand-in redirecting to an nginx CDN, found through ``HF_ENDPOINT``;
- repository mounts of ``s3://BUCKET/PREFIX/`` and ``hf://ORG/REPO`` holding two quantizations (the model and
  another seed's): each loads under its own name with its own file's text.

Every remote file is read per range (206 in nginx's log for https and the CDN), never downloaded whole first.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from loopback.servers import HubStandIn, MotoS3, Nginx, environment
from conftest import require_nginx
from llama_models import N_PREDICT, check_same, direct, llama_client, make_model, probe  # noqa: F401

pytest.importorskip("urllib3")

TIMEOUTS = ("--timeout", "20", "--stall-timeout", "5")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> dict[str, Path]:
    """``one``: the model (the oracle's file); ``repo``: a folder with it as ``m-Q4_K_M.gguf`` beside
    ``m-other.gguf`` (another seed, so other text)."""
    root = tmp_path_factory.mktemp("llama-remote")
    make_model(root / "one.gguf")
    repo = root / "repo"
    repo.mkdir()
    shutil.copyfile(root / "one.gguf", repo / "m-Q4_K_M.gguf")
    make_model(repo / "m-other.gguf", "--seed", "7")
    return {"one": root / "one.gguf", "repo": repo}


@pytest.fixture(scope="module")
def other(probe, model, direct) -> dict:
    """The probe on the other quantization's file: its own oracle, unlike the model's."""
    out = llama_client.run(model["repo"] / "m-other.gguf", "mmap", N_PREDICT, probe=probe)
    assert out["tokens"] != direct["mmap"]["tokens"]
    return out


def load_both(mnt: Path, direct: dict, other: dict, probe: Path, modes=("mmap",)) -> None:
    for mode in modes:
        check_same(llama_client.run(mnt / "m-Q4_K_M.gguf", mode, N_PREDICT, probe=probe), direct[mode], mode)
        check_same(llama_client.run(mnt / "m-other.gguf", mode, N_PREDICT, probe=probe), other, mode)


# ------------------------------------------------------------------------------------------------ https


@pytest.fixture(scope="module")
def https_mount(module_mounted, model):
    require_nginx()
    with Nginx(model["one"].parent, tls=True) as server:
        assert server.url.startswith("https://")
        yield module_mounted(f"{server.url}/one.gguf", *TIMEOUTS, env={"SSL_CERT_FILE": str(server.ca_file)}), server


@pytest.mark.parametrize("mode", ["mmap", "dio"])
def test_a_gguf_over_https(https_mount, direct, probe, mode):
    mnt, server = https_mount
    check_same(llama_client.run(mnt / "one.gguf", mode, N_PREDICT, probe=probe), direct[mode], mode)
    assert any(" 206 " in line for line in server.access_log())


# --------------------------------------------------------------------------------------------------- s3


@pytest.fixture(scope="module")
def s3(model):
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto")
    with MotoS3() as server, environment(server.env()):
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket="models")
        client.upload_file(str(model["one"]), "models", "gguf/one.gguf")
        for path in sorted(model["repo"].iterdir()):
            client.upload_file(str(path), "models", f"quants/{path.name}")
        yield server


@pytest.fixture(scope="module")
def s3_mount(s3, module_mounted):
    return module_mounted("s3://models/gguf/one.gguf", *TIMEOUTS, env=s3.env())


@pytest.mark.parametrize("mode", ["mmap", "dio"])
def test_a_gguf_from_s3(s3_mount, direct, probe, mode):
    mnt = s3_mount
    check_same(llama_client.run(mnt / "one.gguf", mode, N_PREDICT, probe=probe), direct[mode], mode)


def test_an_s3_repository_of_two_quantizations(s3, mounted, direct, other, probe):
    mnt = mounted("s3://models/quants/", *TIMEOUTS, env=s3.env())
    load_both(mnt, direct, other, probe, modes=("mmap", "dio"))


# --------------------------------------------------------------------------------------------------- hf


@pytest.fixture(scope="module")
def hub(model, tmp_path_factory):
    pytest.importorskip("huggingface_hub")
    require_nginx()
    single, cdn = tmp_path_factory.mktemp("hf-single"), tmp_path_factory.mktemp("cdn")
    shutil.copyfile(model["one"], single / "one.gguf")
    with Nginx(cdn) as cdn_server, HubStandIn({"org/one": single, "org/quants": model["repo"]}, cdn,
                                              cdn_server.url) as stand_in:
        with environment({"HF_ENDPOINT": stand_in.url}):
            yield stand_in, cdn_server


@pytest.fixture(scope="module")
def hf_mount(hub, module_mounted):
    return module_mounted("hf://org/one/one.gguf", *TIMEOUTS, env={"HF_ENDPOINT": hub[0].url})


@pytest.mark.parametrize("mode", ["mmap", "dio"])
def test_a_gguf_from_the_hub(hub, hf_mount, direct, probe, mode):
    mnt, cdn = hf_mount, hub[1]
    check_same(llama_client.run(mnt / "one.gguf", mode, N_PREDICT, probe=probe), direct[mode], mode)
    assert any(" 206 " in line for line in cdn.access_log())  # the CDN, per range


def test_an_hf_repository_of_two_quantizations(hub, mounted, direct, other, probe):
    stand_in, _ = hub
    mnt = mounted("hf://org/quants", *TIMEOUTS, env={"HF_ENDPOINT": stand_in.url})
    load_both(mnt, direct, other, probe, modes=("mmap", "dio"))
