"""``ckptfs prefetch`` and ``mount --prefetch`` of a repository: a remote folder holding several checkpoints.

The Hub stand-in (``servers.HubStandIn``: its tree and resolve endpoints, LFS files on an nginx as its CDN)
and moto's S3 server hold a folder with two GGUF quantizations and a README; gguf-py reading the files
themselves is the oracle for values. What is proved:

- ``prefetch hf://ORG/REPO`` warms every checkpoint (a summary line each), and with the Hub and its CDN
  stopped the repository mounts, ``--offline`` or not, with every tensor of each equal to gguf-py's;
- ``--include GLOB`` warms only the checkpoints whose name matches (the others' bytes are not fetched), one
  that matches nothing is one line, and on a single checkpoint it is refused;
- an ``s3://`` folder of several checkpoints is warmed whole the same way, and mounts ``--offline`` with moto
  stopped;
- ``mount --prefetch`` of a repository warms each checkpoint in turn, and ``ckptfs stats`` shows each one's
  state and bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("urllib3")

from cli_runs import one_error_line, run_cli
from conftest import mount_stats, wait_until
from fixtures import quantized, write_gguf
from multifile_sets import gguf_reference
from hub_origin import hub_origin
from loopback.servers import MotoS3, environment

from ckptfs.sources.remote.store.chunks import CHUNK
from ckptfs.sources.remote.store.sparse_store import HEADER_SIZE as SPARSE_HEADER, RECORD

MEMBERS = ("model-Q8_0", "model-F32")


def _write_repo(folder: Path) -> None:
    rng = np.random.default_rng(11)
    write_gguf(folder / "model-Q8_0.gguf", {"blk.0.w": (quantized("Q8_0", (256, 4096), rng), "Q8_0"),
                                            "blk.1.w": (quantized("Q8_0", (128, 4096), rng), "Q8_0")})
    write_gguf(folder / "model-F32.gguf", {"blk.0.w": (rng.standard_normal((512, 1024)).astype(np.float32), "F32"),
                                           "blk.1.w": (rng.standard_normal((128, 1024)).astype(np.float32), "F32")})
    (folder / "README.md").write_text("two quantizations\n")


def _stored_chunks(cache: Path) -> int:
    """The chunks the folder's store holds (present records of every remote file's index)."""
    count = 0
    for index in (cache / "remote").glob("*/*.idx"):
        raw = index.read_bytes()[SPARSE_HEADER:]
        count += sum(1 for at in range(0, len(raw) - RECORD + 1, RECORD) if raw[at + 16: at + 20] != bytes(4))
    return count


def _chunks(path: Path) -> int:
    return -(-path.stat().st_size // CHUNK)


def _assert_members_served(mnt: Path, repo: Path) -> None:
    for member in MEMBERS:
        count = 0
        for name, values, _, _ in gguf_reference([str(repo / f"{member}.gguf")]):
            served = np.load(mnt / member / f"{name}.npy")
            np.testing.assert_array_equal(served, np.asarray(values, dtype=served.dtype))
            count += 1
        assert count == 2, member


@pytest.fixture
def hub(tmp_path):
    with hub_origin(tmp_path, "org/multi", _write_repo) as served:
        yield served


def test_prefetch_of_a_repository_warms_every_checkpoint_and_it_mounts_offline(hub, tmp_path, mounted):
    stand_in, server, repo = hub
    cache = tmp_path / "cache"
    result = run_cli("prefetch", "hf://org/multi", "--cache-dir", str(cache), timeout=180)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sorted(line.split(":")[1].strip() for line in lines) == sorted(MEMBERS), result.stdout
    assert all(line.startswith("prefetch: ") and " fetched " in line for line in lines), result.stdout
    assert _stored_chunks(cache) == sum(_chunks(repo / f"{m}.gguf") for m in MEMBERS)
    stand_in.stop()
    server.stop()
    mnt = mounted("hf://org/multi", "--cache-dir", str(cache), "--offline", "--cache-size", "0")
    _assert_members_served(mnt, repo)
    # without --offline: the Hub's listing and each file's probe fail once, the folder serves
    mnt = mounted("hf://org/multi", "--cache-dir", str(cache), "--cache-size", "0")
    _assert_members_served(mnt, repo)


def test_include_chooses_the_checkpoints_by_name(hub, tmp_path):
    stand_in, server, repo = hub
    cache = tmp_path / "cache"
    result = run_cli("prefetch", "hf://org/multi", "--cache-dir", str(cache), "--include", "*Q8*", timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and result.stdout.startswith("prefetch: model-Q8_0: "), result.stdout
    # the other checkpoint's header only (its open is the repository scan's), none of its tensors
    stored = _stored_chunks(cache)
    assert _chunks(repo / "model-Q8_0.gguf") <= stored < sum(_chunks(repo / f"{m}.gguf") for m in MEMBERS)

    one_error_line(run_cli("prefetch", "hf://org/multi", "--cache-dir", str(cache), "--include", "*Q4*"), 2,
                   "matches none", "model-Q8_0", "model-F32")
    one_error_line(run_cli("prefetch", "hf://org/multi/model-F32.gguf", "--cache-dir", str(cache),
                           "--include", "*"), 2, "one checkpoint")


def test_an_s3_folder_of_several_checkpoints_is_warmed_whole_and_mounts_with_moto_stopped(tmp_path, mounted):
    boto3 = pytest.importorskip("boto3")
    repo = tmp_path / "repo"
    repo.mkdir()
    _write_repo(repo)
    cache = tmp_path / "cache"
    with MotoS3() as server, environment(server.env()):
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket="models")
        for path in sorted(repo.iterdir()):
            client.upload_file(str(path), "models", f"multi/{path.name}")
        result = run_cli("prefetch", "s3://models/multi/", "--cache-dir", str(cache), timeout=180)
        env = server.env()
    assert result.returncode == 0, result.stderr
    assert sorted(line.split(":")[1].strip() for line in result.stdout.splitlines()) == sorted(MEMBERS)
    assert _stored_chunks(cache) == sum(_chunks(repo / f"{m}.gguf") for m in MEMBERS)
    # moto stopped: the listing and the files from the folder
    mnt = mounted("s3://models/multi/", "--cache-dir", str(cache), "--offline", "--cache-size", "0", env=env)
    _assert_members_served(mnt, repo)
    # without --offline: the listing and each file's probe fail once (nothing listens), the folder serves
    mnt = mounted("s3://models/multi/", "--cache-dir", str(cache), "--cache-size", "0", "--timeout", "20", env=env)
    _assert_members_served(mnt, repo)


def test_mount_prefetch_of_a_repository_warms_each_checkpoint_and_stats_show_each(hub, tmp_path, mounted):
    stand_in, server, repo = hub
    cache = tmp_path / "cache"
    mnt = mounted("hf://org/multi", "--cache-dir", str(cache), "--prefetch")
    assert wait_until(lambda: mount_stats(mnt)["warmup"]["state"] == "done", timeout=120), \
        mount_stats(mnt)["warmup"]
    status = mount_stats(mnt)["warmup"]
    assert sorted(status["checkpoints"]) == sorted(MEMBERS), status
    for member in MEMBERS:
        each = status["checkpoints"][member]
        size = (repo / f"{member}.gguf").stat().st_size
        assert each["state"] == "done" and each["stored_bytes"] == each["total_bytes"] == size, each
    assert _stored_chunks(cache) == sum(_chunks(repo / f"{m}.gguf") for m in MEMBERS)
    shown = run_cli("stats", str(mnt))
    assert shown.returncode == 0, shown.stderr
    assert "warm-up: done, " in shown.stdout and all(f"  {m}: done, " in shown.stdout for m in MEMBERS), \
        shown.stdout
    _assert_members_served(mnt, repo)
