"""``mount -t fuse.ckptfs SRC MNT -o OPTS`` and ``/etc/fstab``: the helper mount(8) runs, and its installer.

mount(8) runs ``/sbin/mount.fuse.ckptfs SRC MNT [-sfnv] [-N NS] [-o OPTS] [-t TYPE]`` (``-t`` only from some
versions) with a minimal environment, so the helper ``ckptfs install-mount-helper`` writes is a two-line
shell script that sets a standard PATH (ckptfs looks for ``fusermount3``) and runs this installation's
Python by absolute path, isolated (``-I``: the caller's working directory and PYTHON* variables do not
matter), on this module.

Options (``-o``, comma-separated), translated into ``ckptfs mount`` arguments:

- Every long option of ``ckptfs mount`` has a ``key=value`` spelling, dashes as underscores
  (``cache_size=1G``, ``log_file=/var/log/ckptfs.log``, ``metrics=9101``, ``cache_dir=...``,
  ``mirror=URL`` repeated for several); a flag is ``key`` alone (``verbose``). The list is taken from the
  command itself, so an option added to ``ckptfs mount`` is accepted here too.
- What mount(8), systemd and fstab conventions add is accepted and has no effect on the FUSE mount:
  ``defaults``, ``auto``/``noauto``, ``user``/``users``/``nouser``/``owner``/``group``, ``_netdev``,
  ``nofail``, ``x-*`` (``x-systemd.automount``, ...), ``comment=``, and the kernel flags ``dev``/``nodev``,
  ``suid``/``nosuid``, ``exec``/``noexec``, atime and sync variants — a ckptfs mount holds only 0444 regular
  files with fixed times, so they change nothing.
- ``ro`` is what every ckptfs mount is. ``rw`` is ignored without a word, not refused: mount(8) passes
  ``-o rw`` itself when the fstab line or command names neither, so refusing it would refuse plain
  ``mount -t fuse.ckptfs SRC MNT``, and a line about it would be printed on every such mount though the
  user asked for nothing. (``ckptfs mount -o rw`` still refuses it: there it can only be meant.)
- Anything else goes to libfuse as a FUSE option (``allow_other``, ``nonempty``, ...).

``-f`` (fake: mount(8) only records the line) exits 0 without mounting; ``-v`` adds ``--verbose``;
``-n``, ``-s`` and ``-N`` are accepted and ignored (there is no mtab to skip; sloppy options would be
ignored anyway; a namespace switch is not supported).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

NO_EFFECT = frozenset({
    "defaults", "auto", "noauto", "user", "users", "nouser", "owner", "group", "_netdev", "nofail",
    "dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime", "diratime", "nodiratime",
    "relatime", "norelatime", "strictatime", "nostrictatime", "lazytime", "nolazytime", "sync", "async",
    "dirsync", "silent", "loud", "mand", "nomand", "iversion", "noiversion",
})
NO_EFFECT_PREFIXES = ("x-", "comment=", "helper=")
_TRUE = {"", "1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class HelperError(Exception):
    """A usage error in the helper's arguments (exit 2, one line)."""


@dataclass
class HelperCall:
    """mount(8)'s call, taken apart: what to mount, and the ``ckptfs mount`` arguments it becomes."""

    src: str
    mountpoint: str
    options: list[str] = field(default_factory=list)
    fake: bool = False
    verbose: bool = False


def parse_helper_argv(argv: list[str]) -> HelperCall:
    """``SRC MNT [-sfnv] [-N NS] [-o OPTS]... [-t TYPE]`` in any order after the two positionals."""
    positionals: list[str] = []
    call = HelperCall("", "")
    args = iter(argv)
    for arg in args:
        if arg.startswith("-") and len(arg) > 1:
            if arg in ("-o", "-t", "-N"):
                value = next(args, None)
                if value is None:
                    raise HelperError(f"{arg} needs a value")
                if arg == "-o":
                    call.options.append(value)
                continue
            if arg.startswith("-o"):
                call.options.append(arg[2:])
                continue
            for letter in arg[1:]:
                if letter == "f":
                    call.fake = True
                elif letter == "v":
                    call.verbose = True
                elif letter not in "nsrw":
                    raise HelperError(f"unknown flag -{letter}")
            continue
        positionals.append(arg)
    if len(positionals) != 2:
        raise HelperError("usage: mount.fuse.ckptfs SRC MOUNTPOINT [-o OPTIONS]")
    call.src, call.mountpoint = positionals
    return call


def split_options(texts: list[str]) -> list[str]:
    return [item.strip() for text in texts for item in text.split(",") if item.strip()]


def mount_arguments(call: HelperCall, command) -> list[str]:
    """The ``ckptfs mount`` argv for this call (using ``command``, the click command, for the option list)."""
    import click

    long_options: dict[str, click.Option] = {}
    for param in command.params:
        if isinstance(param, click.Option):
            for opt in param.opts + param.secondary_opts:
                if opt.startswith("--"):
                    long_options[opt[2:].replace("-", "_")] = param
    cli: list[str] = []
    fuse: list[str] = []
    for item in split_options(call.options):
        key, eq, value = item.partition("=")
        if key in NO_EFFECT or item.startswith(NO_EFFECT_PREFIXES) or key in ("ro", "rw"):
            continue
        param = long_options.get(key)
        if param is None:
            fuse.append(item)
        elif param.is_flag:
            if value.lower() in _TRUE:
                cli.append("--" + key.replace("_", "-"))
            elif value.lower() not in _FALSE:
                raise HelperError(f"-o {item}: {key} is a flag (write {key} alone, or {key}=false)")
        elif not eq:
            raise HelperError(f"-o {key} needs a value: {key}=VALUE")
        else:
            cli += ["--" + key.replace("_", "-"), value]
    if call.verbose:
        cli.append("--verbose")
    if fuse:
        cli += ["-o", ",".join(fuse)]
    return ["mount", call.src, call.mountpoint, *cli]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the installed helper: translate mount(8)'s call and run ``ckptfs mount``."""
    from ckptfs.commands.cli import hold_blas_to_one_thread
    from ckptfs.commands.cli import main as cli_main
    from ckptfs.commands.cli import mount as mount_command

    hold_blas_to_one_thread()  # as the ckptfs program does (the mount daemon is this process, forked)
    argv = sys.argv[1:] if argv is None else argv
    try:
        call = parse_helper_argv(argv)
        args = mount_arguments(call, mount_command)
    except HelperError as exc:
        print(f"mount.fuse.ckptfs: usage error: {exc}", file=sys.stderr)
        return 2
    if call.fake:
        return 0
    cli_main(args, prog_name="ckptfs")  # exits with ckptfs mount's own status
    return 0


if __name__ == "__main__":
    sys.exit(main())
