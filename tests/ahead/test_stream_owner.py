"""One stream, one read-ahead decision (``ckptfs.ahead.detect``), over loopback nginx.

A mount's handle that tracks its stream decides it: the remote source below never runs its own sequential
detection for those reads, yet its bytes arrive ahead of the reader in few large requests (the source
follows the handle's advice and its reader's position). A handle that does not track its stream (read-ahead
off) leaves the decision to the source, which then detects the stream itself. The FUSE operations are
driven by hand (``on_read``, then the read with the scope ``scope`` gives it), as ``ckptfs.fuse.operations`` calls
them.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("urllib3")
pytest.importorskip("gguf")

import ckptfs
from ckptfs.core.reads import NOTHING_SAID
from ckptfs.ahead.decode import DecodeAhead
from ckptfs.ahead.detect import SequentialRun
from ckptfs.ahead import fetch as remote_readahead
from ckptfs.tree.mount_tree import MountTree
from fixtures import quantized, write_gguf
from loopback.servers import Nginx
from conftest import require_nginx

STEP = 128 * 1024  # what the kernel asks per request
ROWS, COLS = 2048, 4096  # Q8_0: 8.5 MiB stored, 32 MiB served as float32


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    require_nginx()
    root = tmp_path_factory.mktemp("owner-www")
    rng = np.random.default_rng(5)
    for name in ("handle.gguf", "source.gguf"):  # a file per test: each reads its own lines of the log
        write_gguf(root / name, {"w": (quantized("Q8_0", (ROWS, COLS), rng), "Q8_0")})
    with Nginx(root) as server:
        yield server, root


@pytest.fixture
def source_runs(monkeypatch):
    """Every read a remote source's own detector observes (sources opened from now on)."""
    seen: list[tuple[int, int]] = []

    class Recording(SequentialRun):
        __slots__ = ()

        def observe(self, offset: int, size: int, slack: int | None = None) -> int:
            seen.append((offset, size))
            return super().observe(offset, size, slack)

    monkeypatch.setattr(remote_readahead, "SequentialRun", Recording)
    return seen


def _stream(origin, name: str, tracked: bool) -> tuple[int, int]:
    """Read ``w.npy`` of the remote ``name`` as a mount's handle does, checking every byte against the local
    file's: (the reads made, the requests nginx served for the file while they were made)."""
    server, root = origin
    with ckptfs.open(root / name) as local:
        expected = MountTree(local).view("w.npy").read(0, 1 << 40)
    before = len(server.access_log())
    with ckptfs.open(f"{server.url}/{name}", timeout=30, stall_timeout=5) as ck:
        view = MountTree(ck).view("w.npy")
        prefetcher = DecodeAhead(ck.sources, ck.cache.capacity, enabled=tracked)
        prefetcher.opened(1, view)
        got = bytearray()
        reads = 0
        for offset in range(0, view.size, STEP):
            prefetcher.on_read(1, offset, STEP)
            got += view.read(offset, STEP, scope=prefetcher.scope(1, NOTHING_SAID))
            reads += 1
        prefetcher.close(wait=True)
    assert bytes(got) == expected
    return reads, len(server.ranges(name, before))


def test_a_tracked_handle_decides_and_the_source_follows(origin, source_runs):
    reads, requests = _stream(origin, "handle.gguf", tracked=True)
    assert source_runs == []  # the source never detected on its own
    assert requests < reads // 8, (requests, reads)  # yet its bytes came ahead, in few large requests


def test_an_untracked_handle_leaves_the_decision_to_the_source(origin, source_runs):
    reads, requests = _stream(origin, "source.gguf", tracked=False)
    assert len(source_runs) >= reads // 4  # the source watched the reads itself
    assert requests < reads // 8, (requests, reads)
