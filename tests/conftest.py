"""Shared test plumbing: real FUSE mounts that are always unmounted, and FUSE availability checks.

- ``require_fuse(binding=None)``: skip the test when FUSE cannot work here (no /dev/fuse, no libfuse, no
  fusermount3, no binding) — but under ``CI=true`` fail instead: CI must run every FUSE test.
- ``skip_or_fail(reason)``: the same rule for any other must-run-in-CI test (fusepy, fuzzing).
- fixtures ``mounted`` (per test) and ``module_mounted`` (per module, for read-only checks that can share a
  mount): each yields ``mount(src, *cli_args, binding=None, foreground=False) -> Path``, which mounts ``src``
  with the real CLI (``python -m ckptfs.commands.cli mount``; as a daemon, or ``-f`` in a child process), returns
  once the mount is ready, and unmounts at teardown whatever happened in the test.
- ``mount_stats(mnt)`` (the root's ``user.ckptfs.stats`` xattr: cache counters, daemon pid, binding),
  ``is_mounted(path)``, ``force_unmount(path)``, ``wait_until(predicate, timeout)`` (loopback/polling.py),
  ``ckptfs_cli()``, ``cli_env()``.
- fixture ``libcurl``: the libcurl range client on (its extension built: else a skip, a failure in CI).
- ``require_nginx()`` and ``nginx_origin(...)``: the remote tests' nginx (loopback/servers.py) as a module's
  origin; a server's program that is not installed (``MissingTool``) skips the test, or fails it under CI.
- the fixtures of the helper modules ``cli_runs`` (``mountpoint``) and ``model_fixtures`` (``small``,
  ``index_gguf``), registered here as plugins so that every test module can ask for them by name.
- ``tmpfs(path, size)``: a real tmpfs mounted at ``path`` for a with block (root only, else skipped): a file
  system that fills up or is remounted read-only under a cache tier.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckptfs.util import procinfo
from loopback.polling import wait_until
from loopback.servers import MissingTool, Nginx, nginx_missing

REPO = Path(__file__).resolve().parents[1]
pytest_plugins = ("cli_runs", "model_fixtures")
READY_TIMEOUT = 60.0


def skip_or_fail(reason: str) -> None:
    """pytest.skip — or pytest.fail under CI=true, where nothing may be silently skipped."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A loopback server's missing program (``MissingTool``, in a fixture or the test) is a skip, as
    :func:`skip_or_fail` would make it; under CI=true it stays the failure it is."""
    outcome = yield
    report = outcome.get_result()
    if (call.excinfo is not None and call.excinfo.errisinstance(MissingTool)
            and os.environ.get("CI", "").lower() != "true"):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {call.excinfo.value}")


@pytest.fixture
def libcurl(monkeypatch) -> None:
    """libcurl carries the remote range GETs (``ckptfs.sources.remote.curl``): the extension is built (else
    the test skips, or fails under CI=true, where setup.sh installs libcurl4-openssl-dev) and
    ``CKPTFS_CURL`` does not turn it off."""
    from ckptfs.sources.remote import curl

    if curl.native is None:
        skip_or_fail("ckptfs.sources.remote._curl is not built (needs libcurl4-openssl-dev; setup.py build_ext)")
    monkeypatch.delenv(curl.ENV, raising=False)


def require_nginx() -> None:
    """Skip a test that needs nginx where it is not installed — fail under CI=true (skip_or_fail)."""
    if reason := nginx_missing():
        skip_or_fail(reason)


@contextlib.contextmanager
def nginx_origin(tmp_path_factory, fill, name: str = "www", **nginx_options):
    """The remote tests' module-scoped origin, spelled once: nginx on loopback (``Nginx(root, **nginx_options)``,
    after ``require_nginx``) serving a fresh folder that ``fill(root)`` wrote; yields (server, root, what
    ``fill`` returned)."""
    require_nginx()
    root = tmp_path_factory.mktemp(name)
    made = fill(root)
    with Nginx(root, **nginx_options) as server:
        yield server, root, made


def fuse_problem(binding: str | None = None) -> str | None:
    """Why a FUSE mount with ``binding`` (None: ckptfs's default choice) cannot work here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"/dev/fuse cannot be opened: {exc.strerror}"
    if binding == "fusepy":
        if importlib.util.find_spec("fuse") is None:
            return "fusepy is not installed"
        if ctypes.util.find_library("fuse") is None:
            return "libfuse2 is not installed (fusepy needs it)"
        if shutil.which("fusermount") is None:
            return "fusermount is not installed"
        return None
    if importlib.util.find_spec("mfusepy") is None and binding == "mfusepy":
        return "mfusepy is not installed"
    if ctypes.util.find_library("fuse3") is None and ctypes.util.find_library("fuse") is None:
        return "libfuse is not installed"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "fusermount3 is not installed"
    return None


def require_fuse(binding: str | None = None) -> None:
    problem = fuse_problem(binding)
    if problem is not None:
        skip_or_fail(f"FUSE unavailable: {problem}")


def ckptfs_cli() -> list[str]:
    """The real CLI, run from this checkout whatever the installed copy is."""
    return [sys.executable, "-m", "ckptfs.commands.cli"]


#: A command prefix giving the child the default action of SIGHUP, SIGINT and SIGTERM, for a test that sends one
#: of them: the child would otherwise inherit whatever the test runner ignores (``nohup`` ignores SIGHUP, a
#: shell's background job SIGINT), and neither libfuse (its handlers go only where the action is the default)
#: nor Python (no KeyboardInterrupt for an ignored SIGINT) would then act on the signal.
DEFAULT_SIGNALS = ["env", "--default-signal=HUP,INT,TERM"]


def cli_env(binding: str | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    if binding is not None:
        env["CKPTFS_FUSE_BINDING"] = binding
    env.update(extra)
    return env


def _mount_points() -> set[str]:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        points = set()
        for line in fh:
            points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]))
        return points


def is_mounted(path: str | os.PathLike) -> bool:
    """In the mount table (true for a dead FUSE mount too, unlike os.path.ismount)."""
    return os.path.abspath(path) in _mount_points()


def force_unmount(path: str | os.PathLike) -> None:
    """Unmount by any means (teardown): fusermount3 -u, fusermount -u, then lazily."""
    path = os.path.abspath(path)
    for command in (["fusermount3", "-u", path], ["fusermount", "-u", path], ["fusermount3", "-uz", path],
                    ["fusermount", "-uz", path], ["umount", "-l", path]):
        if not is_mounted(path):
            return
        if shutil.which(command[0]):
            subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    wait_until(lambda: not is_mounted(path), timeout=5)


def mount_stats(mnt: str | os.PathLike) -> dict:
    """The mount's ``user.ckptfs.stats`` (cache counters, ``pid`` of the daemon, ``binding``, ``libfuse``)."""
    return json.loads(os.getxattr(str(mnt), "user.ckptfs.stats"))


pid_alive = procinfo.alive


class Mounts:
    """Mounts made by one fixture, all undone at teardown."""

    def __init__(self, make_dir: Callable[[], Path]):
        self._make_dir = make_dir
        self._made: list[tuple[Path, int | None, subprocess.Popen | None]] = []

    def mount(self, src: str | os.PathLike, *cli_args: str, binding: str | None = None,
              foreground: bool = False, mountpoint: str | os.PathLike | None = None,
              env: dict[str, str] | None = None, cli: list[str] | None = None,
              cwd: str | os.PathLike | None = None) -> Path:
        """Mount ``src``; ``env``: extra environment for the CLI (FUSE_LIBRARY_NAME=fuse: mfusepy on libfuse2);
        ``cli``: the command that stands for ``ckptfs`` (default ``ckptfs_cli()``); ``cwd``: where the CLI
        runs (relative names in ``src`` and ``cli_args`` are relative to it)."""
        require_fuse(binding)
        mnt = Path(mountpoint) if mountpoint is not None else self._make_dir()
        command = [*(cli or ckptfs_cli()), "mount", str(src), str(mnt), *cli_args]
        if foreground:
            return self._mount_foreground(command, mnt, cli_env(binding, **(env or {})))
        result = subprocess.run(command, env=cli_env(binding, **(env or {})), stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=READY_TIMEOUT + 30, cwd=cwd)
        if result.returncode != 0:
            pytest.fail(f"ckptfs mount failed ({result.returncode}): {result.stderr.strip()}")
        try:
            pid = mount_stats(mnt)["pid"]
        except OSError:
            pid = None
        self._made.append((mnt, pid, None))
        return mnt

    def _mount_foreground(self, command: list[str], mnt: Path, env: dict[str, str]) -> Path:
        log_path = mnt.parent / f"{mnt.name}.foreground.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen([*command, "-f"], env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT)
        self._made.append((mnt, proc.pid, proc))
        if not wait_until(lambda: is_mounted(mnt) or proc.poll() is not None, timeout=READY_TIMEOUT):
            pytest.fail("foreground mount not ready in time")
        if proc.poll() is not None:
            pytest.fail(f"ckptfs mount -f exited with {proc.returncode}: {log_path.read_text().strip()}")
        return mnt

    def unmount_all(self) -> None:
        for mnt, pid, proc in reversed(self._made):
            force_unmount(mnt)
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            elif pid is not None and not wait_until(lambda: not pid_alive(pid), timeout=10):
                os.kill(pid, signal.SIGKILL)
        self._made.clear()


@pytest.fixture
def mounted(tmp_path_factory) -> Iterator[Callable[..., Path]]:
    mounts = Mounts(lambda: tmp_path_factory.mktemp("mnt"))
    try:
        yield mounts.mount
    finally:
        mounts.unmount_all()


@pytest.fixture(scope="module")
def module_mounted(tmp_path_factory) -> Iterator[Callable[..., Path]]:
    mounts = Mounts(lambda: tmp_path_factory.mktemp("mnt"))
    try:
        yield mounts.mount
    finally:
        mounts.unmount_all()


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``path`` (root only), unmounted at exit."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


HANG_GUARD_S = 60.0  # a call that has not returned by then is taken as hung


def remount_read_only(path: Path, *stores) -> None:
    """Make the tmpfs at ``path`` read-only, once the background prune of each ``--cache-dir`` store in
    ``stores`` has ended: a prune holds the folder's lock file open for writing while it walks the folder
    (the first write makes one due), and the kernel refuses (EBUSY) to remount a file system read-only while
    a file on it is open for writing, so on a loaded machine the remount failed now and then."""
    deadline = time.monotonic() + HANG_GUARD_S
    while any(store._pruning for store in stores) and time.monotonic() < deadline:
        time.sleep(0.01)
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def bounded(call, *args, guard: float = HANG_GUARD_S):
    """``call(*args)``'s result; fails the test if it has not returned within ``guard`` seconds."""
    box: list = []
    errors: list = []

    def run():
        try:
            box.append(call(*args))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(guard)
    assert not worker.is_alive(), f"{getattr(call, '__name__', call)} did not return within {guard} s"
    if errors:
        raise errors[0]
    return box[0]
