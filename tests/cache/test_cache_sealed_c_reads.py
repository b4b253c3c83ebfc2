"""A remote file the ``--cache-dir`` store holds complete (sealed) is served like a local file: once the
daemon has checked its MACs (in the background, Python serving meanwhile), opens of the checkpoint's own
file, of its ``.raw`` files and of the ``.npy`` of a type served as stored are registered with the C read path (``ckptfs/fs/direct.py``), which reads
the store's file at the remote file's own offsets.

Debian's nginx serves a generated GGUF on loopback; ``ckptfs prefetch`` fills the folder, then a real mount
of the URL with the same folder is read. The oracles: the file itself (and its tensors' stored bytes), the
mount's ``c_reads`` counters (what the C path served), and nginx's access log (no byte of data asked for).
A damaged sealed file fails the check and is never served from C.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

pytest.importorskip("urllib3")

from cli_runs import run_cli  # noqa: E402
from conftest import mount_stats, wait_until  # noqa: E402
from fixtures import write_mixed_gguf  # noqa: E402
from mount_expect import read_direct  # noqa: E402
from servers import Nginx, data_ranges, require_nginx  # noqa: E402

from ckptfs.cache.sparse_store import CHUNK, SparseStore  # noqa: E402
from ckptfs.fs import direct  # noqa: E402

pytestmark = pytest.mark.skipif(direct._direct is None, reason="the C helper ckptfs.fs._direct is not built")


def _c_served(mnt, kind: str) -> int:
    return mount_stats(mnt)["c_reads"]["by_kind"].get(kind, {}).get("reads", 0)


def test_a_sealed_remote_file_and_its_raw_files_are_read_in_c_exactly(mounted, tmp_path):
    require_nginx()
    root = tmp_path / "www"
    root.mkdir()
    written = write_mixed_gguf(root / "mixed.gguf")
    data = written.path.read_bytes()
    cache = tmp_path / "cache"
    with Nginx(root) as server:
        url = f"{server.url}/mixed.gguf"
        warmed = run_cli("prefetch", url, "--cache-dir", str(cache), timeout=120)
        assert warmed.returncode == 0, warmed.stderr
        mnt = mounted(url, "--cache-dir", str(cache))
        own = mnt / "mixed.gguf"
        # the first open starts the daemon's check of the sealed file; an open after it is read in C (O_DIRECT:
        # each read reaches the daemon, not the page cache)
        assert wait_until(lambda: read_direct(own, [(0, len(data))]) == [data] and _c_served(mnt, "file") > 0,
                          timeout=60)
        server.wait_idle()
        before = len(server.access_log())
        ranges = [(0, 1), (7, 4093), (CHUNK - 3, 10), (len(data) // 2, 300_000), (len(data) - 1, 10), (0, len(data))]
        for (offset, size), got in zip(ranges, read_direct(own, ranges)):
            assert got == data[offset:offset + size], (offset, size)
        assert own.read_bytes() == data
        for name, ref in written.tensors.items():
            assert (mnt / f"{name}.raw").read_bytes() == ref.raw, name
        npy = io.BytesIO()
        np.save(npy, written.tensors["f32.mat"].array)
        assert (mnt / "f32.mat.npy").read_bytes() == npy.getvalue()  # a type served as stored: header + bytes
        served = mount_stats(mnt)["c_reads"]
        assert served["handed_back"] == 0
        assert served["by_kind"]["npy"]["reads"] > 0
        assert served["by_kind"]["raw"]["reads"] >= len(written.tensors)
        assert served["by_kind"]["file"]["bytes"] >= sum(min(s, len(data) - o) for o, s in ranges)
        server.wait_idle()
        assert data_ranges(server.ranges("mixed.gguf", before), len(data)) == []  # nothing fetched


def test_a_sealed_file_that_fails_its_check_is_evicted_not_served(tmp_path):
    store = SparseStore(tmp_path / "cache", 1 << 30)
    content = "test:sealed-check:" + os.urandom(8).hex()
    payload = os.urandom(3 * CHUNK + 5)
    parts = [payload[i: i + CHUNK] for i in range(0, len(payload), CHUNK)]
    store.put_chunks(content, 0, parts, len(parts))
    path = store.sealed_path(content)
    good = content + ":good"
    store.put_chunks(good, 0, parts, len(parts))
    with open(path, "r+b") as fh:  # one byte of the sealed copy changed under the store
        fh.seek(CHUNK + 17)
        fh.write(bytes([payload[CHUNK + 17] ^ 1]))
    for name in (content, good):
        assert store.sealed_copy(name, len(payload)) is None  # the check starts; Python serves meanwhile
    assert wait_until(lambda: store.sealed_copy(good, len(payload)) is not None, timeout=30)
    fd, size, _ = store.sealed_copy(good, len(payload))
    assert size == len(payload) and os.pread(fd, size, 0) == payload
    assert wait_until(lambda: not os.path.exists(path), timeout=30)  # evicted whole: fetched again
    assert store.sealed_copy(content, len(payload)) is None and store.stored_chunks(content, range(4)) == set()
