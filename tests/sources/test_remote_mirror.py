"""Mirrors (``--mirror``, ``mirrors=[...]``): byte-identical copies read when the primary fails — a truncated
local download, a failing or stalled server — and refused at open when they are not the same checkpoint.

Primaries and mirrors are real: local files, and Debian's nginx on loopback (through the fault proxy when
the primary has to fail). Values are compared with what gguf-py / safetensors read from a complete file.
"""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest

pytest.importorskip("urllib3")

import ckptfs
from ckptfs.core.errors import CheckpointError
from ckptfs.core.runtime import runtime
from ckptfs.sources.netstats import SOURCE_COUNTERS
from loopback.faultproxy import FaultProxy
from fixtures import quantized, write_gguf
from multifile_sets import safetensors_tensors, write_safetensors_set
from safetensors.numpy import load_file
from loopback.servers import Nginx
from conftest import require_nginx

MiB = 1 << 20


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    require_nginx()
    root = tmp_path_factory.mktemp("www")
    rng = np.random.default_rng(11)
    write_gguf(root / "model.gguf", {"w.q8": (quantized("Q8_0", (1024, 2048), rng), "Q8_0"),
                                     "w.f32": (rng.standard_normal((300, 700)).astype(np.float32), "F32")})
    write_gguf(root / "other.gguf", {"w.q8": (quantized("Q8_0", (1024, 2048), rng), "Q8_0"),
                                     "w.f32": (rng.standard_normal((300, 700)).astype(np.float32), "F32")})
    write_safetensors_set(root / "folder", safetensors_tensors(2, per_shard=3, seed=3))
    with Nginx(root) as server:
        yield server, root


def _reference(path) -> dict[str, np.ndarray]:
    with ckptfs.open(path) as ck:
        return {t.name: np.asarray(t) for t in ck.tensors}


def test_truncated_local_primary_is_completed_from_a_mirror(site, tmp_path):
    server, root = site
    full = (root / "model.gguf").read_bytes()
    part = tmp_path / "model.gguf"
    part.write_bytes(full[: len(full) * 6 // 10])  # an interrupted download
    with ckptfs.open(part) as alone:
        assert alone.damaged()  # without a mirror, the missing tensors are damaged
    before = runtime().get(SOURCE_COUNTERS).snapshot()["failovers"]
    with ckptfs.open(part, mirrors=[server.url + "/model.gguf"], timeout=5, stall_timeout=1) as ck:
        assert not ck.damaged()
        want = _reference(root / "model.gguf")
        for name, values in want.items():
            np.testing.assert_array_equal(np.asarray(ck[name]), values)
    assert runtime().get(SOURCE_COUNTERS).snapshot()["failovers"] > before


@pytest.mark.parametrize("fault", ["503", "stall:30"])
def test_a_failing_or_stalled_primary_fails_over_within_the_timeout(site, fault):
    """5xx after retries, or one stalled attempt (no retry: a mirror waits): the mirror answers in time."""
    server, root = site
    with FaultProxy(server.url) as proxy:
        ck = ckptfs.open(proxy.url + "/model.gguf", mirrors=[server.url + "/model.gguf"], timeout=6,
                         stall_timeout=1)
        proxy.always(fault)
        before = runtime().get(SOURCE_COUNTERS).snapshot()["failovers"]
        start = time.monotonic()
        got = np.asarray(ck["w.q8"][1000:1024])  # past the 2 MiB fetched at open
        assert time.monotonic() - start < 6 + 6  # answered by the timeout; never a hang
        np.testing.assert_array_equal(got, _reference(root / "model.gguf")["w.q8"][1000:1024])
        assert runtime().get(SOURCE_COUNTERS).snapshot()["failovers"] > before
        proxy.always(None)
        ck.close()


def test_every_copy_failing_is_one_error(site):
    server, _ = site
    with FaultProxy(server.url) as a, FaultProxy(server.url) as b:
        ck = ckptfs.open(a.url + "/model.gguf", mirrors=[b.url + "/model.gguf"], timeout=4, stall_timeout=1)
        a.always("500")
        b.always("503")
        with pytest.raises(CheckpointError, match="every copy failed") as info:
            np.asarray(ck["w.q8"][1000:1010])
        assert "\n" not in str(info.value)
        ck.close()


def test_a_different_checkpoint_is_refused_as_mirror(site):
    server, root = site
    with pytest.raises(CheckpointError, match="refused as a mirror") as info:
        ckptfs.open(root / "model.gguf", mirrors=[server.url + "/other.gguf"])
    assert "\n" not in str(info.value)


def test_a_smaller_mirror_is_refused(site, tmp_path):
    server, root = site
    short = tmp_path / "short.gguf"
    short.write_bytes((root / "model.gguf").read_bytes()[:-4096])
    with pytest.raises(CheckpointError, match="refused as a mirror"):
        ckptfs.open(server.url + "/model.gguf", mirrors=[short])


def test_local_folder_with_a_truncated_shard_reads_it_from_the_mirror_folder(site, tmp_path):
    server, root = site
    local = tmp_path / "folder"
    shutil.copytree(root / "folder", local)
    shard = sorted(local.glob("*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-40])
    with ckptfs.open(local, mirrors=[server.url + "/folder"], timeout=5) as ck:
        assert not ck.damaged()
        for path in sorted((root / "folder").glob("*.safetensors")):
            for name, values in load_file(str(path)).items():
                np.testing.assert_array_equal(np.asarray(ck[name]), values)


def test_mount_with_a_mirror(site, mounted, tmp_path):
    server, root = site
    full = (root / "model.gguf").read_bytes()
    part = tmp_path / "part.gguf"
    part.write_bytes(full[: len(full) // 2])
    mnt = mounted(str(part), "--mirror", server.url + "/model.gguf", "--timeout", "5", "--stall-timeout", "1")
    want = _reference(root / "model.gguf")
    for name, values in want.items():
        np.testing.assert_array_equal(np.load(mnt / f"{name}.npy"), values)
