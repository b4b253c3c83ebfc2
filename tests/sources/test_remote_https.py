"""``https://`` checkpoints from nginx on loopback with a certificate from a CA generated at test time
(loopback/servers.py ``TestCA``: the openssl CLI; subjectAltName IP:127.0.0.1 and DNS:localhost).

A private CA is trusted through the environment (docs/remote.md, "TLS"): ``SSL_CERT_FILE`` for the mount,
``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` when OpenSSL's own variables are unset. Through a trusted mount
every tensor's ``.npy`` equals gguf-py's decoding and the mount's ``mixed.gguf`` is the file byte for byte.
A certificate that is not trusted, or that names another host, fails the mount at once with one line, no
traceback, a non-zero exit, and nothing left mounted. Every check runs the CLI as its own process, so each
reads the environment afresh (a process builds its connection pool once). llama.cpp through an ``https://``
mount: tests/clients/test_clients_remote.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("urllib3")

import ckptfs
from conftest import ckptfs_cli, cli_env, is_mounted, require_fuse, require_nginx
from fixtures import write_mixed_gguf
from ckptfs.sources.remote import curl
from loopback.servers import Nginx, TestCA

TLS_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """One CA; nginx with its certificate for 127.0.0.1, and a second nginx whose certificate (same CA) names
    only elsewhere.example; another CA that signed neither."""
    require_nginx()
    root = tmp_path_factory.mktemp("www")
    written = write_mixed_gguf(root / "mixed.gguf")
    ca = TestCA(tmp_path_factory.mktemp("ca"))
    other = TestCA(tmp_path_factory.mktemp("other-ca"), name="another CA")
    with Nginx(root, tls=ca) as server, Nginx(root, tls=ca, tls_names=("DNS:elsewhere.example",)) as misnamed:
        yield {"server": server, "misnamed": misnamed, "root": root, "written": written, "ca": ca.ca_file,
               "other": other.ca_file}


def tls_env(**values: str) -> dict[str, str]:
    """The CLI's environment with exactly ``values`` among the TLS trust variables."""
    env = {k: v for k, v in cli_env().items() if k not in TLS_VARIABLES}
    return {**env, **values}


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*ckptfs_cli(), *args], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_an_https_mount_with_the_ca_trusted_via_ssl_cert_file(site, mounted):
    server, written = site["server"], site["written"]
    assert server.url.startswith("https://127.0.0.1:")
    url = f"{server.url}/mixed.gguf"
    mnt = mounted(url, "--timeout", "10", "--stall-timeout", "2", env={"SSL_CERT_FILE": str(site["ca"])})
    names = os.listdir(mnt)
    npys = sorted(n for n in names if n.endswith(".npy"))
    checked = 0
    with ckptfs.open(site["root"] / "mixed.gguf") as local:
        assert len(npys) == sum(1 for t in local.tensors if t.decodable)
        for name in npys:
            meta = json.loads((mnt / (name[:-4] + ".meta.json")).read_text())
            assert meta["source"] == url
            got = np.load(mnt / name)
            reference = written.tensors[meta["name"]].array  # gguf-py's decoding (None: it has no decoder)
            if reference is not None:
                np.testing.assert_array_equal(got, reference.astype(got.dtype))
                checked += 1
            else:
                np.testing.assert_array_equal(got, np.asarray(local[meta["name"]]))
    assert checked >= len(npys) - 2, (checked, len(npys))
    assert (mnt / "mixed.gguf").read_bytes() == (site["root"] / "mixed.gguf").read_bytes()
    assert any(" 206 " in line for line in server.access_log())  # fetched per range over TLS


def failed_mount(site, url: str, tmp_path: Path, **env: str) -> str:
    """``ckptfs mount`` that must fail: its one stderr line; nothing is left mounted."""
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = cli("mount", url, str(mnt), "--timeout", "20", env=tls_env(**env))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert not is_mounted(mnt) and os.listdir(mnt) == []  # no dead mount left behind
    assert "attempts" not in lines[0] and "timed out" not in lines[0]  # refused at once, not retried
    return lines[0]


def test_an_untrusted_certificate_fails_the_mount_in_one_line(site, tmp_path):
    line = failed_mount(site, f"{site['server'].url}/mixed.gguf", tmp_path, SSL_CERT_FILE=str(site["other"]))
    assert "certificate verify failed: unable to get local issuer certificate" in line
    assert f"trusted: SSL_CERT_FILE={site['other']}" in line


@pytest.mark.parametrize("client", ["libcurl", "urllib3"])
@pytest.mark.parametrize("host, words", [("127.0.0.1", "IP address mismatch"), ("localhost", "Hostname mismatch")])
def test_a_certificate_for_another_host_fails_the_mount_in_one_line(site, tmp_path, host, words, client):
    """The open's GET goes through libcurl where it is built, through urllib3 with ``CKPTFS_CURL=0``: either
    refuses in one line that names the host and says the certificate names another (in its TLS library's
    words: OpenSSL's through libcurl, Python's ``ssl`` through urllib3)."""
    if client == "libcurl" and not curl.enabled(site["misnamed"].url):
        pytest.skip("the libcurl extension is not built here")
    url = f"https://{host}:{site['misnamed'].port}/mixed.gguf"
    line = failed_mount(site, url, tmp_path, SSL_CERT_FILE=str(site["ca"]),
                        **({"CKPTFS_CURL": "0"} if client == "urllib3" else {}))
    assert "TLS certificate verify failed: " in line and f"'{host}'" in line
    if client == "urllib3":
        assert f"certificate verify failed: {words}, certificate is not valid for '{host}'" in line
    assert "names another host" in line


def test_the_certificate_names_localhost_too(site):
    done = cli("info", "--timeout", "20", f"https://localhost:{site['server'].port}/mixed.gguf",
               env=tls_env(SSL_CERT_FILE=str(site["ca"])))
    assert done.returncode == 0, done.stderr


def test_an_untrusted_certificate_fails_open_in_one_line(site):
    done = cli("info", "--timeout", "20", f"{site['server'].url}/mixed.gguf", env=tls_env())
    assert done.returncode != 0 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "certificate verify failed" in line and "the system's CA store" in line and "SSL_CERT_FILE" in line


@pytest.mark.parametrize("variable", ["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def test_a_ca_bundle_named_as_for_requests_is_trusted(site, variable):
    done = cli("info", "--json", "--timeout", "20", f"{site['server'].url}/mixed.gguf",
               env=tls_env(**{variable: str(site["ca"])}))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tensor_count"] == len(site["written"].tensors)


def test_ssl_cert_file_wins_over_a_requests_bundle(site):
    done = cli("info", "--timeout", "20", f"{site['server'].url}/mixed.gguf",
               env=tls_env(SSL_CERT_FILE=str(site["other"]), REQUESTS_CA_BUNDLE=str(site["ca"])))
    assert done.returncode != 0 and "certificate verify failed" in done.stderr


def test_an_empty_bundle_variable_never_turns_verification_off(site):
    done = cli("info", "--timeout", "20", f"{site['server'].url}/mixed.gguf", env=tls_env(CURL_CA_BUNDLE=""))
    assert done.returncode != 0 and "certificate verify failed" in done.stderr


def test_a_missing_ca_bundle_is_one_line(site, tmp_path):
    missing = tmp_path / "no-such-ca.pem"
    done = cli("info", "--timeout", "20", f"{site['server'].url}/mixed.gguf",
               env=tls_env(REQUESTS_CA_BUNDLE=str(missing)))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"cannot load the trusted CA certificates (REQUESTS_CA_BUNDLE={missing})" in line
