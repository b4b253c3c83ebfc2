"""The one place an exception becomes the command line's one-line error and exit code (2, a usage error, is
said as one: "ckptfs: usage error: ...", as click's own usage errors are)."""

from __future__ import annotations

import sys
import traceback

import click

from ckptfs.core.errors import CheckpointError
from ckptfs.fuse.errors import MountError
from ckptfs.util.oneline import one_line
from ckptfs.util.redact import redact


#: ``-v``/``--verbose`` of a command whose only verbosity is the traceback behind its one-line error
verbose_option = click.option("-v", "--verbose", is_flag=True,
                              help="On an error, print its traceback before the one line.")


def fail(exc: BaseException, verbose: bool, detail: str = "") -> None:
    """Say ``exc`` (and ``detail``, what the command did before it: "; 2.0 MiB in the cache folder from before it, kept") as
    the one line, and exit with its code."""
    if verbose:
        traceback.print_exc()
    message = str(exc) if isinstance(exc, (CheckpointError, OSError, ValueError)) else f"{type(exc).__name__}: {exc}"
    # a MountError says its code; so do click's exceptions (not all of them: Abort has none)
    code = exc.exit_code if isinstance(exc, MountError) else getattr(exc, "exit_code", 1)  # probe: third-party
    kind = "usage error" if code == 2 else "error"  # as click's usage errors say it (OneLineGroup)
    click.echo(one_line(redact(f"ckptfs: {kind}: {message}{detail}")), err=True)  # no URL secret in it
    sys.exit(code)
