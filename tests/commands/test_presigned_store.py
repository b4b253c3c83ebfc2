"""A presigned URL in the ``--cache-dir`` store: the store keys the file without its signing parameters, so a
URL re-signed later is served from the bytes stored under the first (nginx on 127.0.0.1 ignores the query;
its access log counts what the origin sent), a parameter that selects content (S3's ``versionId``) still
tells versions apart, and no query string is written into any file of the store."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("urllib3")

from cli_runs import mountpoint, run_cli  # noqa: F401
from conftest import ckptfs_cli, cli_env, nginx_origin
from fixtures import write_gguf
from loopback.servers import Nginx

VALUES = np.random.default_rng(5).standard_normal((2048, 2048)).astype(np.float32)  # 16 MiB
SIZE = VALUES.nbytes
_SENT = re.compile(r'"GET /m\.gguf\S* [^"]*" 20[06] (?P<bytes>\d+) ')
#: words of the signatures and queries used below; none may be found in any file of the store
IN_QUERIES = (b"SIGAAAA", b"SIGBBBB", b"SIGCCCC", b"versionId", b"sig=", b"X-Amz", b"VERSION1", b"VERSION2")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with nginx_origin(tmp_path_factory, lambda root: write_gguf(root / "m.gguf", {"w": (VALUES, "F32")})) as made:
        yield made[0]


def sent_since(server: Nginx, before: int) -> int:
    """Body bytes nginx sent for m.gguf (any query) in the log lines after the first ``before``."""
    return sum(int(m["bytes"]) for line in server.access_log()[before:] if (m := _SENT.search(line)))


def prefetch(server: Nginx, query: str, cache: Path) -> int:
    """``ckptfs prefetch`` of m.gguf with ``query`` (by stdin: no signature in the command line); the body
    bytes the origin sent for it."""
    before = len(server.access_log())
    result = subprocess.run([*ckptfs_cli(), "prefetch", "--src-file", "-", "--cache-dir", str(cache), "-q"],
                            env=cli_env(), input=f"{server.url}/m.gguf?{query}\n", capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr
    server.wait_idle()
    return sent_since(server, before)


def test_a_resigned_url_is_served_from_the_store_and_no_query_is_written(site, tmp_path, mountpoint):
    cache = tmp_path / "cache"
    first = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=SIGAAAA1&X-Amz-Expires=60&sig=SIGAAAA2&versionId=VERSION1"
    assert prefetch(site, first, cache) >= SIZE

    # re-signed: other signatures and expiry, the same version: the origin sends no more than the open's
    # first bytes and tail check, and a mount of it serves the values from the store
    resigned = "versionId=VERSION1&X-AMZ-SIGNATURE=SIGBBBB1&x-amz-expires=120&Signature=SIGBBBB2&se=SIGBBBB3&token=SIGBBBB4"
    assert prefetch(site, resigned, cache) < SIZE // 8
    before = len(site.access_log())
    mounted = run_cli("mount", str(mountpoint), "--cache-dir", str(cache),
                      CKPTFS_SRC=f"{site.url}/m.gguf?sig=SIGBBBB5&versionId=VERSION1")
    assert mounted.returncode == 0, mounted.stderr
    np.testing.assert_array_equal(np.load(mountpoint / "w.npy"), VALUES)
    run_cli("umount", str(mountpoint))
    site.wait_idle()
    assert sent_since(site, before) < SIZE // 8

    # another version (a parameter not on the signing list) is other content: fetched whole
    assert prefetch(site, "versionId=VERSION2&sig=SIGCCCC", cache) >= SIZE

    files = [p for p in cache.rglob("*") if p.is_file()]
    names = [p for p in files if p.suffix == ".name"]
    assert names, sorted(str(p.relative_to(cache)) for p in files)
    for path in files:
        data = path.read_bytes()
        for word in IN_QUERIES:
            assert word not in data, (word, str(path.relative_to(cache)))
    for path in names:  # a name record: JSON, then its 32-byte MAC
        record = json.loads(path.read_bytes()[:-32])
        strings = [v for v in record.values() if isinstance(v, str)]
        assert strings and not any("?" in v for v in strings), record
