"""Running the filesystem detached: fork before any thread exists, report readiness over a pipe.

libfuse can daemonize by itself, but it forks inside C while Python (and OpenBLAS) threads may be alive, and
its parent exits before any mount error is known. Instead the parent forks in Python while it is the only
thread (numpy's OpenBLAS stops its pool in a pthread_atfork handler, checked in tests), the child detaches
(setsid, stdio away from the terminal so ``$(ckptfs mount ...)`` returns) and runs FUSE in the foreground,
and libfuse's ``init`` callback — called once the kernel has the mount — writes ``ok`` to a pipe. ``init``
is not yet a working mount (libfuse may give up right after it, or an option may leave a root that answers
nothing), so the parent then checks that the mount answers (``verify``) and stops the daemon if it does not.
The parent returns only then (``ckptfs mount a b && ls b`` works), or prints the child's one-line reason.

libfuse writes its own errors ("fuse: ...", fusermount3's) to fd 2, so fd 2 is captured in a temporary
file until the mount is ready: the last line is the reason when mounting fails; on success the capture is
replayed where fd 2 goes from then on (the terminal, or the daemon's log file).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from ckptfs.fuse.errors import MountError

READY_TIMEOUT = 60.0
_OK = b"ok\n"
_ERROR = b"error: "


class StderrCapture:
    """fd 2 into a temporary file until ``release``; then to ``target_fd`` (default: the original fd 2)."""

    def __init__(self) -> None:
        sys.stderr.flush()
        self._saved = os.dup(2)
        self._file = tempfile.TemporaryFile()
        os.dup2(self._file.fileno(), 2)
        self._released = False

    def text(self) -> str:
        sys.stderr.flush()
        self._file.seek(0)
        return self._file.read().decode("utf-8", "replace")

    def last_line(self) -> str:
        lines = [line.strip() for line in self.text().splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def release(self, target_fd: int | None = None, replay: bool = True) -> None:
        """Point fd 2 at ``target_fd`` (or back where it was), first copying what was captured there."""
        if self._released:
            return
        self._released = True
        target = self._saved if target_fd is None else target_fd
        captured = self.text().encode() if replay else b""
        if captured:
            os.write(target, captured)
        os.dup2(target, 2)
        os.close(self._saved)
        self._file.close()


class ReadinessPipe:
    """The child's end: exactly one message, ``ok`` or ``error: REASON``."""

    def __init__(self, fd: int):
        self._fd = fd
        self._lock = threading.Lock()

    @property
    def sent(self) -> bool:
        return self._fd < 0

    def send(self, message: bytes) -> None:
        with self._lock:
            if self._fd < 0:
                return
            try:
                os.write(self._fd, message)
            except OSError:
                pass  # the parent gave up (timeout); nothing left to tell
            finally:
                os.close(self._fd)
                self._fd = -1

    def ok(self) -> None:
        self.send(_OK)

    def error(self, reason: str) -> None:
        line = " ".join(reason.split()) or "the mount failed"
        self.send(_ERROR + line.encode("utf-8", "replace") + b"\n")


def _wait_child(pid: int, timeout: float = 5.0) -> int | None:
    """The child's exit status, or None if it is still running after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def _await_ready(read_fd: int, pid: int, timeout: float) -> None:
    """Return when the child says ``ok``; MountError with its reason otherwise."""
    deadline = time.monotonic() + timeout
    data = b""
    try:
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                os.kill(pid, signal.SIGTERM)
                raise MountError(f"the mount was not ready after {timeout:.0f} s (daemon {pid} stopped)")
            ready, _, _ = select.select([read_fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_fd)
    if data == _OK:
        return
    if data.startswith(_ERROR):
        _wait_child(pid)
        raise MountError(data[len(_ERROR):].decode("utf-8", "replace").strip())
    status = _wait_child(pid)
    how = "is still running" if status is None else (
        f"was killed by signal {-status}" if status < 0 else f"exited with status {status}")
    raise MountError(f"the mount daemon {how} before the mount was ready")


#: The signals that end a mount (libfuse's handlers unmount on each).
TERMINATION_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


def _default_termination_signals() -> None:
    """Give the detached daemon the default action of each termination signal it inherited as ignored.

    The daemon has left the starting shell's session, yet it inherits what that shell ignored: ``nohup``
    ignores SIGHUP, a background job SIGINT. libfuse installs its unmounting handlers only for signals at
    their default action, so an inherited "ignore" left a daemon that a documented ``kill -HUP`` never
    unmounted. A foreground mount (``-f``) keeps what it was started with: its caller chose."""
    for signum in TERMINATION_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)


def detach(run_child: Callable[[ReadinessPipe], int], timeout: float = READY_TIMEOUT,
           verify: Callable[[int], None] | None = None, in_child: Callable[[], None] | None = None) -> None:
    """Fork; the child runs ``run_child(pipe)`` and exits with its result; return once it reports ``ok``
    and ``verify(child_pid)`` (if given) accepts the mount.

    Raises MountError (with the child's reason) if it does not; a child that said ``ok`` but failed
    ``verify`` is stopped first. ``in_child`` runs first thing in the child (to drop what the parent holds,
    such as the mountpoint lock). Must be called while this process has no other Python thread: a forked
    child would inherit their locks but not the threads.
    """
    if threading.active_count() > 1:
        raise MountError("internal error: cannot daemonize with threads running "
                         f"({', '.join(t.name for t in threading.enumerate())}); use -f")
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the daemon
        code = 1
        try:
            os.close(read_fd)
            if in_child is not None:
                in_child()
            os.setsid()
            _default_termination_signals()
            code = run_child(ReadinessPipe(write_fd))
        finally:
            os._exit(code)
    os.close(write_fd)
    _await_ready(read_fd, pid, timeout)
    if verify is not None:
        try:
            verify(pid)
        except MountError:
            _stop(pid)
            raise


def _stop(pid: int) -> None:
    """End a daemon whose mount does not work: SIGTERM (libfuse unmounts), SIGKILL if it lingers (then
    ``auto_unmount`` removes the mount)."""
    try:
        os.kill(pid, signal.SIGTERM)
        if _wait_child(pid) is None:
            os.kill(pid, signal.SIGKILL)
            _wait_child(pid)
    except (ProcessLookupError, ChildProcessError):
        pass


def redirect_stdio(stderr_target: str | None) -> int:
    """Point stdin/stdout at /dev/null; return an fd for stderr after startup (the log file or /dev/null)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    if stderr_target is None:
        return devnull
    return os.open(stderr_target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
