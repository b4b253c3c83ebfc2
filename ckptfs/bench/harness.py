"""The mount under test: the real CLI on a temporary mountpoint, always unmounted, and the daemon's memory
sampled while it works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ckptfs.core.options import OpenOptions
from ckptfs.util import procinfo
from ckptfs.fuse.operations import STATS_XATTR

RSS_SLACK = 100 << 20


SAMPLE_INTERVAL = 0.01


MOUNT_TIMEOUT = 120.0


class MountFailed(RuntimeError):
    """The CLI daemon did not mount (its one-line reason)."""


def drop_page_cache(paths: tuple[str, ...]) -> None:
    """Evict the checkpoint's pages from the kernel page cache, so "cold" means read from the disk.

    posix_fadvise(DONTNEED) drops clean pages of a file for everyone; it needs no privileges. Best effort.
    """
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):
            pass
        finally:
            os.close(fd)


class BenchMount:
    """``ckptfs mount`` by the real CLI on a fresh directory; use through :func:`bench_mount`, which always
    unmounts and removes it."""

    def __init__(self, src: str, workdir: str, label: str, options: OpenOptions, env: dict[str, str] | None = None):
        self.path = os.path.join(workdir, label)
        self.log = os.path.join(workdir, label + ".log")
        self._pid: int | None = None
        self.ready_s = float("nan")
        self._command = [sys.executable, "-m", "ckptfs.commands.cli", "mount", src, self.path, *options.as_flags(),
                         "--log-file", self.log]
        self._env = {**os.environ, **(env or {})}
        os.mkdir(self.path)

    def start(self) -> None:
        """Run ``ckptfs mount`` (it returns once the mount is ready); MountFailed with its reason."""
        start = time.perf_counter()
        process = subprocess.Popen(self._command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=self._env)
        try:
            _, err = process.communicate(timeout=MOUNT_TIMEOUT)
        except BaseException:
            # Interrupted: let the CLI finish, so a mount it is making exists when close() looks for it.
            process.wait(timeout=MOUNT_TIMEOUT)
            raise
        self.ready_s = time.perf_counter() - start
        if process.returncode != 0:
            raise MountFailed((err.strip().splitlines() or [f"exit status {process.returncode}"])[-1])
        self._pid = int(self.stats()["pid"])

    @property
    def pid(self) -> int:
        """The mount daemon's process id (what the memory sampler watches); only a started mount has one."""
        if self._pid is None:
            raise RuntimeError(f"{self.path} is not mounted yet: start() first")
        return self._pid

    def stats(self) -> dict[str, Any]:
        return json.loads(os.getxattr(self.path, STATS_XATTR))

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def close(self) -> None:
        """Unmount (the daemon then exits by itself) and remove the mountpoint; never raises."""
        from ckptfs.service.mountpoint import is_mount_point, unmount

        try:
            if is_mount_point(self.path):
                unmount(self.path)
        except Exception as exc:  # noqa: BLE001 - cleanup must go on; say what is left behind
            print(f"ckptfs bench: could not unmount {self.path}: {exc}", file=sys.stderr)
            return
        deadline = time.monotonic() + 5.0
        while self._pid is not None and procinfo.alive(self._pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            os.rmdir(self.path)
        except OSError:
            pass


@contextmanager
def bench_mount(src: str, workdir: str, label: str, options: OpenOptions,
                env: dict[str, str] | None = None) -> Iterator[BenchMount]:
    """A mount of ``src`` with ``options`` (passed to ``ckptfs mount`` as its flags), always unmounted."""
    mount = BenchMount(src, workdir, label, options, env)
    try:
        mount.start()
        yield mount
    finally:
        mount.close()


class AnonMemorySampler:
    """Peak RssAnon of a process and its children, sampled every 10 ms in a background thread.

    Anonymous memory is what the daemon allocates (decoded blocks, Python objects); the checkpoint's own
    pages, read with pread, belong to the kernel page cache and are excluded by RssAnon by definition.
    """

    def __init__(self, pid: int):
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pids, refreshed = [self.pid], 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - refreshed > 0.5:
                pids, refreshed = [self.pid, *procinfo.children(self.pid)], now
            self.peak = max(self.peak, sum(procinfo.rss_anon(p) or 0 for p in pids))
            self._stop.wait(SAMPLE_INTERVAL)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak
