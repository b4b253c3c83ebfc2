"""Running the real CLI from a test and checking what it says.

- ``run_cli(*args, env=None, timeout=90, address_space=None, **extra_env)``: ``python -m ckptfs.commands.cli
  ARGS`` from this checkout (``env``: the whole environment; default ``cli_env(**extra_env)``), output
  captured as text; ``address_space``: held to that many bytes (``RLIMIT_AS``), a daemon it forks too.
- ``one_error_line(result, code, *words)``: the single stderr line of a failed command, checked.
- ``mounts_at(path)``: how many mounts the mount table has at ``path`` (a stacked one counts twice).
- ``mountpoint`` (a fixture, registered by conftest): an empty folder for tests that run the CLI themselves;
  every mount made there, stacked ones too, is undone at teardown and its daemon waited for.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ckptfs_cli, cli_env, force_unmount, is_mounted, mount_stats, pid_alive, require_fuse, wait_until


#: Settings a user's environment may hold that would change what a command does; a test names them itself.
_USER_SETTINGS = ("CKPTFS_CACHE_DIR", "CKPTFS_CACHE_KEY_FILE")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 90,
            address_space: int | None = None, **extra_env: str) -> subprocess.CompletedProcess:
    """The real ``ckptfs`` command (this checkout's code), its output captured; ``extra_env`` added to the
    environment, from which an inherited ``$CKPTFS_CACHE_DIR``/``$CKPTFS_CACHE_KEY_FILE`` is dropped.
    ``address_space``: the command (and a mount daemon it forks) held to that many bytes (``RLIMIT_AS``)."""
    if env is None:
        env = cli_env(**extra_env)
        for name in _USER_SETTINGS:
            if name not in extra_env:
                env.pop(name, None)

    def limited() -> None:
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    return subprocess.run([*ckptfs_cli(), *args], env=env, stdin=subprocess.DEVNULL, preexec_fn=limited,
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(result: subprocess.CompletedProcess, code: int | tuple[int, ...], *words: str) -> str:
    """The single stderr line of a failed command, checked for its exit code (or one of several) and words:
    the one check of the project's "bad input is one clear line" rule that every test uses."""
    err = result.stderr.strip()
    assert result.returncode in (code if isinstance(code, tuple) else (code,)), (result.returncode, err)
    assert err and "\n" not in err and "Traceback" not in err and err.startswith("ckptfs: "), err
    for word in words:
        assert word in err, err
    return err


def mounts_at(path) -> int:
    """How many mounts the mount table has at ``path`` (a stacked one counts twice)."""
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in fh]
    return points.count(real)


@pytest.fixture
def mountpoint(tmp_path) -> Iterator[Path]:
    """An empty directory for tests that run the CLI themselves; every mount there undone at the end."""
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    yield mnt
    for _ in range(4):  # stacked mounts, if a test made some
        if not is_mounted(mnt):
            break
        try:
            pid = mount_stats(mnt)["pid"]
        except OSError:
            pid = None
        force_unmount(mnt)
        if pid is not None and not wait_until(lambda: not pid_alive(pid), timeout=10):
            os.kill(pid, signal.SIGKILL)
