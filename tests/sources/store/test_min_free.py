"""``--cache-dir-min-free`` holds while bytes are written, not only when the folder is pruned afterwards.

The cache folder lies on a real tmpfs of 8 MiB (root only) and the checkpoint (a 6 MB GGUF) is served by
Debian's nginx on loopback. The oracles: the file system's own free space (``statvfs``, sampled while a
mount reads), the file itself (every byte the mount serves) and nginx's access log (what was fetched).

- a mount whose store would go below the floor stores no byte past it and serves the rest from the origin;
- ``ckptfs prefetch`` of a file that cannot fit above the floor is refused before it fetches: one line, a
  non-zero exit, nothing fetched or stored; with a floor it fits under, the same run stores it all.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

pytest.importorskip("urllib3")

from cli_runs import one_error_line, run_cli
from conftest import require_nginx, tmpfs
from fixtures import write_gguf
from loopback.servers import Nginx, data_ranges

MiB = 1 << 20


@pytest.fixture
def origin(tmp_path):
    """nginx serving ``m.gguf`` (five F32 tensors, about 6 MB): (server, the file's bytes)."""
    require_nginx()
    root = tmp_path / "www"
    root.mkdir()
    rng = np.random.default_rng(5)
    written = write_gguf(root / "m.gguf", {f"t{i}": (rng.standard_normal(300_000).astype(np.float32), "F32")
                                           for i in range(5)})
    with Nginx(root) as server:
        yield server, written.path.read_bytes()


def _free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _floor(path, percent: float) -> int:
    st = os.statvfs(path)
    return int(st.f_blocks * st.f_frsize * percent / 100)


def _stored(cache) -> int:
    """Bytes the store's data files take on disk."""
    return sum(p.stat().st_blocks * 512 for p in (cache / "remote").glob("*/*.data")) if (cache / "remote").exists() \
        else 0


def test_a_mount_stores_nothing_below_the_floor_and_serves_from_the_origin(origin, tmp_path, mounted):
    server, data = origin
    with tmpfs(tmp_path / "small", "8m") as small:
        cache = small / "cache"
        floor = _floor(small, 50)  # 4 MiB kept free: room for part of the 6 MB file
        mnt = mounted(f"{server.url}/m.gguf", "--cache-dir", str(cache), "--cache-dir-min-free", "50",
                      "--cache-size", "0")
        lowest = [_free(small)]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                lowest.append(min(lowest[-1], _free(small)))
                done.wait(0.001)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            got = (mnt / "m.gguf").read_bytes()
        finally:
            done.set()
            sampler.join(10)
        assert got == data
        lowest.append(_free(small))
        # the floor held (give or take the index's and name records' pages, written beside the data)
        assert min(lowest) >= floor - 64 * 1024, (min(lowest), floor)
        assert 0 < _stored(cache) < len(data)  # it stored what fit above the floor, and no more
        assert data_ranges(server.ranges("m.gguf"), len(data))  # the rest came from the origin


def test_a_prefetch_that_cannot_fit_above_the_floor_is_refused_before_it_fetches(origin, tmp_path):
    server, data = origin
    with tmpfs(tmp_path / "small", "8m") as small:
        cache = small / "cache"
        url = f"{server.url}/m.gguf"
        before = len(server.access_log())
        refused = run_cli("prefetch", url, "--cache-dir", str(cache), "--cache-dir-min-free", "50", timeout=120)
        one_error_line(refused, 1, "do not fit", "--cache-dir-min-free 50%", str(cache))
        server.wait_idle()
        assert data_ranges(server.ranges("m.gguf", before), len(data)) == []  # the size probe alone
        assert _stored(cache) == 0
        fits = run_cli("prefetch", url, "--cache-dir", str(cache), "--cache-dir-min-free", "5", timeout=120)
        assert fits.returncode == 0, fits.stderr
        assert _stored(cache) >= len(data)
