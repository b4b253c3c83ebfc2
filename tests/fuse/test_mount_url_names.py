"""A checkpoint file named from a URL gets a name a filesystem can hold, one per URL (docs/mount.md, "File
names").

nginx on 127.0.0.1 serves the files: a URL whose last part decodes to 300 bytes (``%2F`` in it: nginx maps it
to a sub-folder, so the file exists on disk while its URL name cannot) shows as a 200-byte stem, ``~``, 16 hex
digits of the SHA-256 of the decoded name and ``.gguf``, and ``cp -r`` copies the mount; a name that is not
UTF-8 (``%FF%FE.safetensors``) keeps its bytes as ``%XX``, so the URL whose name is literally
``%FF%FE.safetensors`` (``%25FF%25FE...``) gets another name.
"""

from __future__ import annotations

import hashlib
import os
import subprocess

import numpy as np
import pytest
from fixtures import write_gguf, write_safetensors

from ckptfs.util.names import NAME_MAX


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from loopback.servers import Nginx
    from conftest import require_nginx

    require_nginx()
    root = tmp_path_factory.mktemp("www")
    with Nginx(root) as server:
        yield server, root


def test_a_long_url_name_is_cut_with_a_hash(site, mounted, tmp_path):
    server, root = site
    first, second = "a" * 150, "b" * 145 + ".gguf"
    (root / first).mkdir()
    written = write_gguf(root / first / second, {"w": (np.arange(16, dtype=np.float32), "F32")})
    decoded = f"{first}/{second}"  # what the URL's last part decodes to: 300 bytes
    mnt = mounted(f"{server.url}/{first}%2F{second}", "--timeout", "10", "--stall-timeout", "2")
    expected = "a" * 150 + "%2F" + "b" * 47 + "~" + hashlib.sha256(decoded.encode()).hexdigest()[:16] + ".gguf"
    assert len(expected.encode()) <= NAME_MAX
    assert sorted(os.listdir(mnt)) == sorted([expected, "metadata.json", "w.npy", "w.raw", "w.meta.json"])
    assert (mnt / expected).read_bytes() == written.path.read_bytes()
    copied = subprocess.run(["cp", "-r", str(mnt), str(tmp_path / "copy")], capture_output=True, text=True,
                            timeout=60)
    assert copied.returncode == 0, copied.stderr
    assert (tmp_path / "copy" / expected).read_bytes() == written.path.read_bytes()


def test_a_url_name_that_is_not_utf8_keeps_its_bytes_escaped(site, mounted):
    server, root = site
    raw = write_safetensors(root / os.fsdecode(b"\xff\xfe.safetensors"), {"x": np.ones(4, np.float32)})
    literal = write_safetensors(root / "%FF%FE.safetensors", {"y": np.zeros(2, np.float32)})
    bad = mounted(f"{server.url}/%FF%FE.safetensors", "--timeout", "10", "--stall-timeout", "2")
    named = mounted(f"{server.url}/%25FF%25FE.safetensors", "--timeout", "10", "--stall-timeout", "2")
    assert "%FF%FE.safetensors" in os.listdir(bad)
    assert (bad / "%FF%FE.safetensors").read_bytes() == raw.path.read_bytes()
    assert "%25FF%25FE.safetensors" in os.listdir(named)
    assert (named / "%25FF%25FE.safetensors").read_bytes() == literal.path.read_bytes()
