"""How the ``ckptfs`` program ends: a command whose results are all on disk may end its process at once.

Python's teardown after a command collects and frees every object the process made (the modules, the
checkpoint's tables, the chunk buffers): a few percent of a ``ckptfs prefetch``'s time (docs/remote.md),
spent on nothing its result needs. A command that knows its results are
written (the store's chunks are on the device before it returns) ends with :func:`exit_at_once`; the
program's entry (``ckptfs.commands.cli.program``) then flushes the output streams and the log and ends the
process with ``os._exit``. Nothing else is cut short: ckptfs's own threads are daemons, which any exit ends
where they are (a prune of the cache folder is made to be stopped anywhere), and the read-ahead scheduler's
workers are idle once the command has waited for its work. Run any other way (``click.testing.CliRunner``,
an embedding process calling the click group), the command ends as every command does: a ``SystemExit`` for
the caller to handle.
"""

from __future__ import annotations

import logging
import os
import sys


class ExitAtOnce(SystemExit):
    """A command's end (its exit code) that lets the program end the process without its teardown."""


def exit_at_once(code: int) -> None:
    """End the command with ``code``, and let the program end its process at once (:class:`ExitAtOnce`)."""
    raise ExitAtOnce(code)


def end_process(end: SystemExit) -> None:
    """The program's end after a command: at once for :class:`ExitAtOnce` (see the module docstring), else
    ``end`` raised again, for the interpreter to end as usual."""
    if not isinstance(end, ExitAtOnce):
        raise end
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said on it
            pass
    logging.shutdown()
    os._exit(end.code if isinstance(end.code, int) else 0 if end.code is None else 1)
