"""The one place an exception becomes the command line's one-line error and exit code."""

from __future__ import annotations

import sys
import traceback

import click

from ckptfs.core.errors import CheckpointError
from ckptfs.util.oneline import one_line


def fail(exc: BaseException, verbose: bool) -> None:
    if verbose:
        traceback.print_exc()
    message = str(exc) if isinstance(exc, (CheckpointError, OSError, ValueError)) else f"{type(exc).__name__}: {exc}"
    click.echo(one_line(f"ckptfs: error: {message}"), err=True)
    sys.exit(getattr(exc, "exit_code", 1))
