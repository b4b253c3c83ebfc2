"""The command-line options of remote sources, defined once for every command that opens a checkpoint."""

from __future__ import annotations

import click

from ckptfs.sources.remote.transport import DEFAULT_STALL_TIMEOUT, DEFAULT_TIMEOUT

SECONDS = click.FloatRange(min=0, min_open=True)


def remote_options(f):
    """--mirror (repeatable), --timeout and --stall-timeout (passed as mirrors, timeout, stall_timeout)."""
    f = click.option("--stall-timeout", type=SECONDS, default=None, metavar="SECONDS",
                     help=f"Abandon a remote attempt that gets no bytes for this long and retry or fail over "
                          f"[default: {DEFAULT_STALL_TIMEOUT:g}].")(f)
    f = click.option("--timeout", type=SECONDS, default=None, metavar="SECONDS",
                     help=f"Answer every remote read within this time, failover included, with data or an "
                          f"error (EIO) [default: {DEFAULT_TIMEOUT:g}].")(f)
    return click.option("--mirror", "mirrors", multiple=True, metavar="SRC",
                        help="A byte-identical copy of SRC (path or URL), read when a read from SRC fails; "
                             "repeatable, tried in order.")(f)
