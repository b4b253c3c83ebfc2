"""Where a command's SRC comes from: its command line, ``--src-file FILE`` (``-``: standard input) or
``$CKPTFS_SRC``, the two ways that never put the source in the command line.

A process's command line (``/proc/PID/cmdline``, what ``ps`` shows) is readable by every user of the machine,
and a presigned URL's signature or a URL's ``user:password@`` is a credential. Every command rewrites its own
command line at entry (``util.redact.hide_in_argv``, called by the command group), but only once Python has
started and imported ckptfs: from ``execve`` until then the URL as typed is visible. A process's environment
(``/proc/PID/environ``) and a file of mode 0600 are readable only by their user (and root), so a source given
by either is never shown to other users.

Rules, the same for every command that takes a source: ``--src-file`` reads the source from the file's only
line (then the command line names no SRC: its arguments are the ones after SRC); otherwise a SRC on the
command line wins; otherwise ``$CKPTFS_SRC`` gives it. A command with further arguments of any number
(``prefetch SRC [NAMES]...``) takes its first argument as SRC, so a source by environment goes with no
names there; ``--src-file`` goes with names.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable

import click

ENV = "CKPTFS_SRC"
#: A source is one URL or path: a file holding more than this is not one.
MAX_SOURCE_BYTES = 64 << 10


def with_source(*after: str, more: str | None = None) -> Callable:
    """Decorator for a click command whose arguments are SRC, then one value for each name in ``after``
    (``mount``'s ``mountpoint``), then with ``more`` any number of values (``prefetch``'s ``names``). The
    command gets ``src`` and those names as keyword arguments, as ``click.argument`` would give them, and
    gains the ``--src-file`` option."""
    metavar = " ".join(["SRC", *(name.upper() for name in after), *([f"[{more.upper()}]..."] if more else [])])

    def decorate(command: Callable) -> Callable:
        @functools.wraps(command)
        def run(operands: tuple[str, ...], src_file: str | None, **kwargs):
            src, rest = resolve(list(operands), src_file, after, more is not None)
            named: dict[str, str | tuple[str, ...]] = dict(zip(after, rest))
            if more is not None:
                named[more] = tuple(rest[len(after):])
            return command(src=src, **named, **kwargs)

        run = click.option("--src-file", metavar="FILE", default=None,
                           help=f"Read SRC from FILE ('-': standard input) instead of the command line, which "
                                f"every user can see (also: ${ENV}). For presigned URLs and URLs with a "
                                f"password.")(run)
        return click.argument("operands", nargs=-1, metavar=metavar)(run)

    return decorate


def resolve(operands: list[str], src_file: str | None, after: tuple[str, ...],
            variadic: bool) -> tuple[str, list[str]]:
    """SRC and the other arguments, from the command line's ``operands`` (see the module docstring);
    ``after``: the names of the arguments that follow SRC; ``variadic``: any number more may. click.UsageError
    (one line, exit 2) when they do not add up."""
    fixed = len(after)
    if src_file is not None:
        if len(operands) < fixed or (len(operands) > fixed and not variadic):
            wanted = " ".join(name.upper() for name in after) or "no argument"
            raise click.UsageError(f"with --src-file, SRC is read from it: give {wanted} "
                                   f"({len(operands)} argument{'s' if len(operands) != 1 else ''} given)")
        return read_source(src_file), operands
    if len(operands) > fixed + 1 and not variadic:
        raise click.UsageError(f"Got unexpected extra argument ({operands[fixed + 1]})")
    if len(operands) > fixed:
        return operands[0], operands[1:]
    env = os.environ.get(ENV, "").strip()
    if len(operands) == fixed and env:
        return env, operands
    expected = list(after) if env else ["src", *after]
    missing = expected[len(operands)].upper()
    raise click.UsageError(f"Missing argument '{missing}' (SRC may also come from --src-file FILE or ${ENV})")


def read_source(path: str) -> str:
    """The source ``--src-file`` names: the only non-empty line of ``path`` (``-``: standard input)."""
    where = "standard input" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_SOURCE_BYTES + 1)
        else:
            with open(path, "rb") as fh:
                data = fh.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise click.UsageError(f"--src-file {where}: {exc.strerror or exc}") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise click.UsageError(f"--src-file {where}: more than {MAX_SOURCE_BYTES >> 10} KiB, not one source")
    lines = [line.strip() for line in os.fsdecode(data).splitlines() if line.strip()]
    if len(lines) != 1:
        raise click.UsageError(f"--src-file {where}: {'empty' if not lines else f'{len(lines)} lines'}; "
                               f"give one source (a path or URL) on one line")
    return lines[0]
