"""A remote checkpoint in the ``--cache-dir`` folder mounts and serves without its origin.

Debian's nginx serves generated GGUF files on loopback (its access log is what the origin saw); the Hub
stand-in (``servers.HubStandIn``, LFS files on an nginx as its CDN) stands for ``hf://``. gguf-py reading
the files themselves is the oracle for values. What is proved:

- after ``ckptfs prefetch``, with nginx stopped, a mount with the same ``--cache-dir`` serves every tensor
  equal to gguf-py's, and its log says once which version it serves and when it was fetched;
- the open sends one probe to the dead origin, not retries for ``--timeout`` (the request counters, in
  process: one failed request);
- ``--offline`` sends nothing, even with the origin up (nginx's access log), and needs the folder;
- an ``hf://`` repository (its listing too) mounts offline;
- a file replaced at the origin is read as the new version while the origin answers, never mixed with the
  stored one;
- offline, a read of bytes the folder lacks fails with EIO at once, one log line for each failed read.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("urllib3")

from cli_runs import run_cli
from fixtures import quantized, write_gguf
from multifile_sets import gguf_reference
from hub_origin import hub_origin
from loopback.servers import Nginx, data_ranges
from conftest import require_nginx

import ckptfs
from ckptfs.core.runtime import runtime
from ckptfs.sources.netstats import SOURCE_COUNTERS


def _write_model(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    write_gguf(path, {
        "blk.0.q8": (quantized("Q8_0", (128, 4096), rng), "Q8_0"),
        "blk.0.q4k": (quantized("Q4_K", (128, 4096), rng), "Q4_K"),
        "blk.1.f32": (rng.standard_normal((256, 1024)).astype(np.float32), "F32"),
    })


def _assert_served_as(mnt: Path, mount_name: str, path: Path) -> int:
    """Every tensor of the mount equal to gguf-py's reading of ``path``, and the file itself byte for byte."""
    count = 0
    for name, values, _, _ in gguf_reference([str(path)]):
        served = np.load(mnt / f"{name}.npy")
        np.testing.assert_array_equal(served, np.asarray(values, dtype=served.dtype))
        count += 1
    assert (mnt / mount_name).read_bytes() == path.read_bytes()
    return count


def _prefetch(url: str, cache: Path) -> None:
    result = run_cli("prefetch", url, "--cache-dir", str(cache), timeout=120)
    assert result.returncode == 0, result.stderr


def _failed_requests() -> int:
    snap = runtime().get(SOURCE_COUNTERS).snapshot()["by_scheme"]
    return sum(n for entry in snap.values() for outcome, n in entry["requests"].items() if outcome != "ok")


@pytest.fixture
def origin(tmp_path):
    require_nginx()
    root = tmp_path / "www"
    root.mkdir()
    _write_model(root / "model.gguf", 5)
    server = Nginx(root).start()
    try:
        yield server, root
    finally:
        server.stop()


def test_a_prefetched_checkpoint_is_served_with_its_origin_stopped(origin, tmp_path, mounted):
    server, root = origin
    url, cache, log = f"{server.url}/model.gguf", tmp_path / "cache", tmp_path / "mount.log"
    _prefetch(url, cache)
    server.stop()
    mnt = mounted(url, "--cache-dir", str(cache), "--cache-size", "0", "--log-file", str(log))
    assert _assert_served_as(mnt, "model.gguf", root / "model.gguf") == 3
    said = [line for line in log.read_text().splitlines() if "the origin did not answer" in line]
    assert len(said) == 1, log.read_text()
    assert "serving validator" in said[0] and "fetched 20" in said[0], said[0]  # its ETag, fetched <date>


def test_the_dead_origin_gets_one_probe_not_retries(origin, tmp_path):
    server, root = origin
    url, cache = f"{server.url}/model.gguf", tmp_path / "cache"
    _prefetch(url, cache)
    server.stop()  # its port now refuses connections
    before = _failed_requests()
    with ckptfs.open(url, cache_dir=str(cache), timeout=30) as ck:
        got = {t.name: np.asarray(t) for t in ck.tensors}
    assert _failed_requests() - before == 1  # one attempt: without a stored copy it retries for --timeout
    for name, values, _, _ in gguf_reference([str(root / "model.gguf")]):
        np.testing.assert_array_equal(got[name], np.asarray(values, dtype=got[name].dtype))

    before = _failed_requests()
    with pytest.raises(ckptfs.CheckpointError):  # a file the folder never held: the normal open, retried
        ckptfs.open(f"{server.url}/other.gguf", cache_dir=str(cache), timeout=1.5)
    assert _failed_requests() - before > 1


def test_offline_sends_no_request_even_with_the_origin_up(origin, tmp_path, mounted):
    server, root = origin
    url, cache = f"{server.url}/model.gguf", tmp_path / "cache"
    _prefetch(url, cache)
    server.wait_idle()
    before = len(server.access_log())
    mnt = mounted(url, "--cache-dir", str(cache), "--offline", "--cache-size", "0")
    assert _assert_served_as(mnt, "model.gguf", root / "model.gguf") == 3
    with ckptfs.open(url, cache_dir=str(cache), offline=True) as ck:
        assert sorted(t.name for t in ck.tensors) == ["blk.0.q4k", "blk.0.q8", "blk.1.f32"]
    server.wait_idle()
    assert server.access_log()[before:] == []

    refused = run_cli("info", url, "--offline")  # nothing to serve from: one line
    assert refused.returncode != 0 and "--cache-dir" in refused.stderr, refused.stderr
    refused = run_cli("info", f"{server.url}/never.gguf", "--offline", "--cache-dir", str(cache))
    assert refused.returncode != 0 and "not in the cache folder" in refused.stderr, refused.stderr


def test_bytes_the_folder_lacks_fail_with_eio_offline(origin, tmp_path, mounted):
    server, root = origin
    url, cache, log = f"{server.url}/big.gguf", tmp_path / "cache", tmp_path / "mount.log"
    rng = np.random.default_rng(8)
    write_gguf(root / "big.gguf", {"w": (rng.standard_normal((1024, 4096)).astype(np.float32), "F32")})  # 16 MiB
    with ckptfs.open(url, cache_dir=str(cache)) as ck:  # the header only: no tensor read
        assert len(ck.tensors) == 1
    mnt = mounted(url, "--cache-dir", str(cache), "--offline", "--cache-size", "0", "--log-file", str(log))
    with pytest.raises(OSError) as failed:
        (mnt / "w.npy").read_bytes()
    assert failed.value.errno == errno.EIO
    said = [line for line in log.read_text().splitlines() if "not in the cache folder" in line]
    assert said and all(" EIO: /w.npy " in line for line in said), said  # one line per failed read


def test_a_file_replaced_at_the_origin_is_never_mixed_with_the_stored_one(origin, tmp_path, mounted):
    server, root = origin
    url, cache = f"{server.url}/model.gguf", tmp_path / "cache"
    _prefetch(url, cache)
    old_size = (root / "model.gguf").stat().st_size
    _write_model(root / "new.gguf", 6)  # same layout, other values: the same size
    assert (root / "new.gguf").stat().st_size == old_size
    os.replace(root / "new.gguf", root / "model.gguf")
    os.utime(root / "model.gguf", (1_900_000_000, 1_900_000_000))  # another ETag
    server.wait_idle()
    before = len(server.access_log())
    mnt = mounted(url, "--cache-dir", str(cache), "--cache-size", "0")
    assert _assert_served_as(mnt, "model.gguf", root / "model.gguf") == 3  # the new version's values
    server.wait_idle()
    fetched = data_ranges(server.ranges("model.gguf", before), old_size)
    assert sum(b - a for a, b in fetched) >= old_size - 4096  # fetched afresh, none from the old copy


def _write_hub_repo(repo: Path) -> None:
    _write_model(repo / "model-Q8.gguf", 7)
    (repo / "README.md").write_text("a model\n")


def test_an_hf_repository_mounts_offline(tmp_path, mounted):
    cache = tmp_path / "cache"
    with hub_origin(tmp_path, "org/model", _write_hub_repo) as (stand_in, server, repo):
        result = run_cli("prefetch", "hf://org/model", "--cache-dir", str(cache), timeout=120)
        assert result.returncode == 0, result.stderr
        stand_in.stop()
        server.stop()
        asked = len(stand_in.requests)
        mnt = mounted("hf://org/model", "--cache-dir", str(cache), "--offline", "--cache-size", "0")
        assert _assert_served_as(mnt, "model-Q8.gguf", repo / "model-Q8.gguf") == 3
        assert len(stand_in.requests) == asked
        shutil.rmtree(cache / "remote")  # nothing stored: offline has nothing to open
        refused = run_cli("info", "hf://org/model", "--cache-dir", str(cache), "--offline")
        assert refused.returncode != 0 and "cache folder" in refused.stderr, refused.stderr
