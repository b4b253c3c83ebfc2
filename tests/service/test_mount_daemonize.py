"""The mount's fork: the daemon is forked after the checkpoint is opened, and only a process with a single
thread can fork (``service/daemon.py``). Opening a remote checkpoint with ``--cache-dir`` writes its header's
chunks into the folder, which makes a prune of the folder due; its thread must not start before the fork.

The prune is kept alive deterministically: the cache folder holds a folder that is a FUSE mount whose daemon
is stopped (SIGSTOP), so walking the cache folder blocks there until the test lets it go on (SIGCONT), as a
prune of a large folder on a slow disk does for seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("urllib3")

from cli_runs import run_cli
from conftest import ckptfs_cli, cli_env, force_unmount, is_mounted, require_nginx, wait_until
from fixtures import write_gguf
from loopback.servers import Nginx

VALUES = np.random.default_rng(5).standard_normal((256, 256)).astype(np.float32)


@pytest.fixture
def site(tmp_path):
    require_nginx()
    root = tmp_path / "www"
    root.mkdir()
    write_gguf(root / "m.gguf", {"w": (VALUES, "F32")})
    with Nginx(root) as server:
        yield server


class StuckFolder:
    """A cache folder (0700) holding ``stuck/``: a foreground ckptfs mount whose daemon is stopped, so that
    anything that walks the cache folder waits there until ``go_on()`` continues the daemon. It also holds
    2 MiB of decoded entries, more than the bound the test gives: a prune that gets to the end of its walk
    evicts what the mount stored."""

    def __init__(self, root: Path, small_path: Path):
        self.cache = root / "cache"
        self.cache.mkdir(mode=0o700)
        self.old = self.cache / "blocks" / "00" / f"{'0' * 32}.e"
        self.old.parent.mkdir(mode=0o700, parents=True)
        self.old.write_bytes(bytes(2 << 20))
        os.utime(self.old, (0, 0))
        self.stuck = self.cache / "stuck"
        self.stuck.mkdir()
        self.proc = subprocess.Popen([*ckptfs_cli(), "mount", "-f", str(small_path), str(self.stuck)],
                                     env=cli_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        assert wait_until(lambda: is_mounted(self.stuck) or self.proc.poll() is not None, timeout=60), "no mount"
        assert self.proc.poll() is None, self.proc.stderr.read().decode()
        os.listdir(self.stuck)  # init has been answered
        os.kill(self.proc.pid, signal.SIGSTOP)

    def stored(self) -> set[str]:
        """The files the mount stored in the folder (not walking ``stuck/``, which would wait)."""
        return {os.path.join(folder, name) for top in os.listdir(self.cache) if top not in ("stuck", "blocks")
                and (self.cache / top).is_dir() for folder, _, names in os.walk(self.cache / top) for name in names}

    def go_on(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.go_on()
        force_unmount(self.stuck)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()


@pytest.fixture
def stuck_folder(small, tmp_path):
    folder = StuckFolder(tmp_path, small.path)
    try:
        yield folder
    finally:
        folder.close()


def test_a_prune_made_due_by_the_open_does_not_stop_the_fork(site, stuck_folder, mountpoint):
    """The open's first write into the cache folder makes a prune due, and the prune cannot finish (it waits
    on ``stuck/``): the mount still forks its daemon and works, and the daemon runs the prune: once
    ``stuck/`` answers, the folder is brought under its bound (what the mount stored is evicted)."""
    result = run_cli("mount", f"{site.url}/m.gguf", str(mountpoint), "--cache-dir", str(stuck_folder.cache),
                     "--cache-dir-size", "1M", timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    np.testing.assert_array_equal(np.load(mountpoint / "w.npy"), VALUES)
    stored = stuck_folder.stored()
    assert stored  # the bytes the open fetched; the prune is waiting on stuck/
    stuck_folder.go_on()
    assert wait_until(lambda: not stored <= stuck_folder.stored(), timeout=30), stuck_folder.stored()


def test_a_refused_mount_in_process_leaves_prunes_running(tmp_path):
    """``run_mount`` holds prune threads back only until its fork. Called in a process that goes on (the
    Python API, this test process), a refused mount must stop holding: otherwise every store's first prune
    of that process is owed forever and its folder grows past its bound."""
    from ckptfs.cache import entry
    from ckptfs.cache.disk import DiskStore
    from ckptfs.core.errors import CheckpointError
    from ckptfs.fuse.errors import MountError
    from ckptfs.service.mount import MountRequest, run_mount

    (tmp_path / "mnt").mkdir()
    with pytest.raises((MountError, CheckpointError, OSError)):
        run_mount(MountRequest(src=str(tmp_path / "missing.gguf"), mountpoint=str(tmp_path / "mnt")))
    values = np.zeros(64 * 1024, np.float32)
    store = DiskStore(tmp_path / "cache", 8 * (entry.HEADER_SIZE + values.nbytes), "blocks")
    for k in range(60):
        store.put_array(f"key{k}", values + k)
    assert wait_until(lambda: store.usage()["blocks"]["files"] < 30, timeout=30), store.usage()
