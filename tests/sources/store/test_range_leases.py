"""One fetch per chunk per machine: concurrent warm-ups of one checkpoint share the ``--cache-dir`` store's
byte-range leases (``range_lease.py``), so the origin sends each chunk once.

Debian's nginx serves a generated GGUF on loopback, each request capped (``limit_rate``) so that the runs
overlap; its access log (the Range of every request) is the oracle for what the origin sent, and the file
itself for what the folder holds.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

pytest.importorskip("urllib3")

from conftest import ckptfs_cli, cli_env, require_nginx, wait_until
from fixtures import write_gguf
from loopback.servers import Nginx, data_ranges


def _prefetch(url: str, cache) -> subprocess.Popen:
    env = cli_env()
    env.pop("CKPTFS_CACHE_DIR", None)
    return subprocess.Popen([*ckptfs_cli(), "prefetch", url, "--cache-dir", str(cache)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _data_files(cache) -> list:
    return sorted((cache / "remote").glob("*/*.data"))


def test_two_concurrent_warm_ups_take_each_chunk_from_the_origin_once(tmp_path):
    require_nginx()
    root = tmp_path / "www"
    root.mkdir()
    rng = np.random.default_rng(5)
    write_gguf(root / "model.gguf", {"w": (rng.standard_normal((1536, 4096)).astype(np.float32), "F32")})  # 24 MiB
    data = (root / "model.gguf").read_bytes()
    cache = tmp_path / "cache"
    with Nginx(root, limit_rate="512k") as server:  # each request slow: the two runs overlap
        url = f"{server.url}/model.gguf"
        before = len(server.access_log())
        first = _prefetch(url, cache)
        try:
            # the second starts once the first is storing chunks, while most are still to come
            assert wait_until(lambda: first.poll() is not None or any(p.stat().st_blocks for p in _data_files(cache)),
                              timeout=60)
            second = _prefetch(url, cache)
            try:
                outs = [proc.communicate(timeout=240) for proc in (first, second)]
            finally:
                second.kill()
        finally:
            first.kill()
        assert [proc.returncode for proc in (first, second)] == [0, 0], outs
        server.wait_idle()
        fetched = data_ranges(server.ranges("model.gguf", before), len(data))
        taken = sum(b - a for a, b in fetched)
        assert len(data) <= taken <= 1.1 * len(data), (taken, len(data), outs)
    files = _data_files(cache)
    assert len(files) == 1 and files[0].read_bytes() == data  # the store's file is the remote file, sealed
