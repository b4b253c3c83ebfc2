"""The core mount checks again on libfuse 2: through fusepy, and through mfusepy loading libfuse 2.

Same references and expectations as test_mount.py; the binding is forced with CKPTFS_FUSE_BINDING (and
FUSE_LIBRARY_NAME=fuse makes mfusepy pick libfuse 2 where both are installed).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import ckptfs_cli, cli_env, is_mounted, mount_stats, pid_alive, require_fuse, wait_until
from fixtures import Written, write_all_dtypes_safetensors, write_gguf, write_mixed_gguf
from mount_expect import (WRITE_ATTEMPTS, big_tensors, check_np_load, check_tree, expected_gguf,
                        expected_safetensors, odd_ranges, read_direct)

#: (id, CKPTFS_FUSE_BINDING, extra environment, expected stats)
LIBFUSE2 = [
    ("fusepy", "fusepy", {}, {"binding": "fusepy", "libfuse": 2}),
    ("mfusepy-libfuse2", "mfusepy", {"FUSE_LIBRARY_NAME": "fuse"}, {"binding": "mfusepy", "libfuse": 2}),
]


@pytest.fixture(scope="module", params=LIBFUSE2, ids=[p[0] for p in LIBFUSE2])
def setup(request, tmp_path_factory, module_mounted):
    _, binding, env, stats = request.param
    require_fuse(binding)
    src = tmp_path_factory.mktemp("src")
    mixed = write_mixed_gguf(src / "mixed.gguf")
    st = write_all_dtypes_safetensors(src / "all.safetensors")
    big = write_gguf(src / "big.gguf", big_tensors(), {"general.name": "big"})

    def mount(written: Written, *args: str) -> Path:
        return module_mounted(str(written.path), *args, binding=binding, env=env)

    return mount, mixed, st, big, binding, env, stats


def test_binding_in_use(setup):
    mount, mixed, *_, stats = setup
    assert {k: mount_stats(mount(mixed))[k] for k in stats} == stats


def test_every_file_and_np_load(setup):
    mount, mixed, st, big, *_ = setup
    for written, build in ((mixed, expected_gguf), (st, expected_safetensors), (big, expected_gguf)):
        mnt = mount(written)
        expected = build(written, str(written.path))
        check_tree(mnt, expected)
        check_np_load(mnt, expected)


def test_float16_mode(setup):
    mount, mixed, *_ = setup
    mnt = mount(mixed, "--dtype", "float16")
    expected = expected_gguf(mixed, str(mixed.path), "float16")
    check_tree(mnt, expected)
    check_np_load(mnt, expected)


def test_odd_offsets(setup):
    mount, *_, big, _, _, _ = setup
    mnt = mount(big)
    expected = expected_gguf(big, str(big.path))
    rng = np.random.default_rng(17)
    for name in ("big.q4_k.npy", "big.bf16.npy", "big.q8_0.raw"):
        data = expected.data[name]
        header = len(data) - expected.arrays[name].nbytes if name.endswith(".npy") else 1
        ranges = odd_ranges(len(data), header, 1024, rng)
        for (offset, size), got in zip(ranges, read_direct(mnt / name, ranges)):
            assert got == data[offset: offset + size], (name, offset, size)


@pytest.mark.parametrize("attempt", ["open O_WRONLY", "create", "mkdir", "unlink", "rename", "chmod",
                                     "truncate", "setxattr"])
def test_writes_fail_with_erofs(setup, attempt):
    mount, mixed, *_ = setup
    with pytest.raises(OSError) as info:
        WRITE_ATTEMPTS[attempt](mount(mixed))
    assert info.value.errno == errno.EROFS


def test_sigterm_and_sigkill(setup, tmp_path):
    _, _, _, big, binding, env, _ = setup
    require_fuse(binding)
    mnt = tmp_path / "fg"
    mnt.mkdir()
    proc = subprocess.Popen([*ckptfs_cli(), "mount", "-f", str(big.path), str(mnt)], env=cli_env(binding, **env),
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: is_mounted(mnt) or proc.poll() is not None, timeout=60) and proc.poll() is None
        (mnt / "big.q4_k.npy").read_bytes()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert not is_mounted(mnt) and os.listdir(mnt) == []
    finally:
        if proc.poll() is None:
            proc.kill()
    daemon = tmp_path / "daemon"
    daemon.mkdir()
    result = subprocess.run([*ckptfs_cli(), "mount", str(big.path), str(daemon)], env=cli_env(binding, **env),
                            capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    pid = mount_stats(daemon)["pid"]
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not is_mounted(daemon), timeout=10)
    assert os.listdir(daemon) == [] and wait_until(lambda: not pid_alive(pid), timeout=5)
