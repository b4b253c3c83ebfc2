"""The daemon's logging: text or JSON lines, one line per distinct EIO cause, reopening on SIGUSR1.

**Start-up.** What the mount warns about before it serves (the checks and the checkpoint's open, made in the
``ckptfs mount`` process before the daemon is forked) goes to stderr and to ``--log-file`` alike
(``configure_startup``): a mount from fstab or systemd keeps it in its log.

**Formats.** ``--log-format text`` (default): ``TIME PID LEVEL LOGGER: MESSAGE``. ``--log-format json``: one
JSON object per line for log shippers (``time`` in UTC ISO 8601, ``level``, ``logger``, ``pid``,
``message``, ``exception`` when there is a traceback, plus the fields a call site adds such as ``op``,
``path`` and ``errno`` on EIO lines). libfuse's own rare messages on fd 2 stay plain text.

**One line per cause.** A failed read of a page through the page cache reaches the daemon twice: the kernel
first asks for it as readahead (``->readahead``), and when that leaves the page not up to date it reads the
page itself (``->read_folio``) before answering EIO. Both requests carry the same range and fail for the
same reason, so ``EIO`` lines are keyed by their cause (the file in the mount and the error's own message,
which names the stored file, byte range and tensor) and each cause is logged once; repeats are only
counted (``ckptfs_fuse_errors_total``). The memory of causes is bounded (the oldest are forgotten) and
is the operations' own (``util/once.py``'s ``OncePerCause``).

**No secrets.** Every line is formatted through ``util.redact.redact``: a URL's user info and query (a
presigned signature) never reach the log, whoever logged it (ckptfs, urllib3's request lines, botocore).

**Rotation.** libfuse ends the mount on SIGHUP (and SIGINT/SIGTERM), so logrotate's usual HUP would unmount.
SIGUSR1 reopens ``--log-file`` instead: a ``postrotate`` of ``kill -USR1 PID`` (or ``copytruncate``) keeps
the mount. The signal is blocked in every thread and taken by one waiting thread (a Python signal handler
would never run: the main thread sits inside libfuse's C loop).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time

from ckptfs.util.redact import redact

TEXT_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")
REOPEN_SIGNAL = signal.SIGUSR1
_STANDARD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class RedactingFormatter(logging.Formatter):
    """The text format, every line redacted (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (redacted, as every line)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(self._format(record))

    def _format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    return RedactingFormatter(TEXT_FORMAT)


def configure(level: int, log_format: str = "text", extra_fd: int | None = None) -> None:
    """Log to stderr (fd 2: the terminal, or the daemon's log file), and to ``extra_fd`` if given."""
    _install(level, formatter(log_format), extra_fd, formatter(log_format))


def configure_startup(log_format: str = "text", log_fd: int | None = None) -> None:
    """Before a mount serves (its checks and the checkpoint's open, in the ``ckptfs mount`` process): warnings
    on stderr as bare lines, as the command's own messages, and into the log file (``log_fd``) in its format.
    A mount that fstab or systemd starts has a stderr nobody keeps, so what the open warns about (a Redis
    trusted as-is, a folder's notes) must reach its log too."""
    _install(logging.WARNING, RedactingFormatter("%(message)s"), log_fd, formatter(log_format))


def _install(level: int, stderr_format: logging.Formatter, extra_fd: int | None,
             extra_format: logging.Formatter) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handlers: list[tuple[logging.Handler, logging.Formatter]] = [(logging.StreamHandler(sys.stderr), stderr_format)]
    if extra_fd is not None:
        handlers.append((logging.StreamHandler(open(extra_fd, "a", buffering=1, closefd=False)), extra_format))
    for handler, format_ in handlers:
        handler.setFormatter(format_)
        root.addHandler(handler)
    root.setLevel(level)


class LogFile:
    """``--log-file``: opened before the fork (so a bad path is a one-line error), reopened on SIGUSR1.

    ``fd`` stays the same number for the life of the daemon; a reopen points it (and fd 2, when fd 2 is the
    log, as in a daemon once mounted) at a newly opened file of the same path.
    """

    def __init__(self, path: str):
        self.path = path
        self.fd = self._open()

    def _open(self) -> int:
        cloexec = getattr(os, "O_CLOEXEC", 0)  # probe: platform
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | cloexec, 0o644)

    def reopen(self) -> None:
        try:
            stderr_is_log = _same_file(2, self.fd)
            fresh = self._open()
        except OSError as exc:
            logging.getLogger(__name__).error("cannot reopen log file %s: %s", self.path, exc.strerror)
            return
        try:
            sys.stderr.flush()
            os.dup2(fresh, self.fd)
            if stderr_is_log:
                os.dup2(fresh, 2)
        finally:
            os.close(fresh)
        logging.getLogger(__name__).info("reopened log file %s", self.path)

    def reopen_on_signal(self) -> threading.Thread:
        """Block SIGUSR1 in this thread (and so in every thread started after it) and reopen whenever it
        arrives. Call in the process that serves, before libfuse starts its threads."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {REOPEN_SIGNAL})

        def wait() -> None:
            while True:
                signal.sigwait({REOPEN_SIGNAL})
                self.reopen()

        thread = threading.Thread(target=wait, name="ckptfs-log-reopen", daemon=True)
        thread.start()
        return thread


def _same_file(a: int, b: int) -> bool:
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)
