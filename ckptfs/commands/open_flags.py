"""The command-line flags of the open options, generated from ``OpenOptions``' fields (ckptfs.core.options).

``open_flags`` is the one decorator that gives a command (``mount``, ``info``, ``bench``, ``prefetch``) a flag
for every open option, each with the help text, metavar, environment fallback and shown default its field
declares, and hands the command one checked ``OpenOptions`` (``open_options=``) instead of a keyword per
option. A command leaves out only the options it names (``omit``), each with the reason it has no use for
it; a new field therefore gets its flag on every command, and its ``-o`` name in fstab (which takes its list
from ``ckptfs mount``), without an edit here. ``flag`` is one field's flag alone (``ckptfs cache prune``).

``KINDS`` maps each field's ``kind`` to how click parses it: the one place a kind of value is parsed and
checked (a size, seconds, a percentage, a Redis URL...).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import click

from ckptfs.core.options import OpenOptions, Spelling, spelled_fields, spelling_of
from ckptfs.core.options import DTYPE_MODES
from ckptfs.util.sizes import parse_size


class SizeType(click.ParamType):
    """A size in binary units (``64M`` = 64 MiB), or a whole number of bytes."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


SIZE = SizeType()


def _percent(ctx, param, value):
    if value is None:
        return None
    try:
        percent = float(str(value).rstrip("%"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a percentage (5, 5%, 0.5)") from None
    if not 0 <= percent < 100:
        raise click.BadParameter(f"{value!r}: give a percentage from 0 to below 100")
    return percent


def _needs_redis_py() -> None:
    try:
        import redis  # noqa: F401 - a missing client is a usage error now, not a surprise in the daemon
    except ImportError:
        raise click.BadParameter("needs redis-py: pip install 'ckptfs[redis]' (or: pip install redis)") from None


def _redis_url(ctx, param, value):
    if value is None:
        return None
    from ckptfs.cache.redis_tier import check_url

    try:
        check_url(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    _needs_redis_py()
    return value


def _cluster_seeds(ctx, param, value):
    if not value:
        return ()
    from ckptfs.cache.redis_cluster import check_seed

    try:
        for seed in value:
            check_seed(seed)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    _needs_redis_py()
    return tuple(value)


def _short_size(n: int) -> str:
    """``10G``, ``512M``: the largest binary unit that divides ``n``, as ``--help`` shows sizes."""
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


#: kind -> how click parses it (click.option keywords) and how ``--help`` shows a default of that kind
KINDS: dict[str, tuple[dict[str, Any], Callable[[Any], str]]] = {
    "text": ({}, str),
    "dtype": ({"type": click.Choice(DTYPE_MODES)}, str),
    "size": ({"type": SIZE}, _short_size),
    "count": ({"type": click.IntRange(min=1), "metavar": "N"}, str),
    "seconds": ({"type": click.FloatRange(min=0, min_open=True), "metavar": "SECONDS"}, "{:g}".format),
    "percent": ({"callback": _percent, "metavar": "PCT"}, "{:g}".format),
    "dir": ({"type": click.Path(file_okay=False)}, str),
    "file": ({"type": click.Path(dir_okay=False)}, str),
    "redis_url": ({"callback": _redis_url, "metavar": "URL"}, str),
    "redis_seed": ({"callback": _cluster_seeds, "metavar": "HOST:PORT"}, str),
    "flag": ({"is_flag": True}, lambda on: "on" if on else "off"),
}


def _shown_default(field, spelled: Spelling) -> str | None:
    """The default ``--help`` shows: the field's own, else the one its ``default_at`` names."""
    value = field.default if field.default not in (None, ()) else None
    if value is None and spelled.default_at is not None:
        module, _, name = spelled.default_at.partition(":")
        value = getattr(importlib.import_module(module), name)  # dispatch by a declared name
    return None if value is None else KINDS[spelled.kind][1](value)


def _click_option(field, spelled: Spelling, help_text: str | None = None) -> Callable:
    params, _ = KINDS[spelled.kind]
    params = dict(params)
    if spelled.metavar is not None:
        params["metavar"] = spelled.metavar
    help_text = help_text if help_text is not None else spelled.help
    shown = _shown_default(field, spelled)
    if shown is not None:  # written out: a flag not given stays None, so the layer that owns the default decides
        help_text = f"{help_text}  [default: {shown}]"
    return click.option(spelled.flag, field.name, default=None, multiple=spelled.repeat, envvar=spelled.env,
                        help=help_text, **params)


def flag(name: str, cls: type[OpenOptions] = OpenOptions) -> Callable:
    """The flag of one open option, as every command spells it (passed as its field's name)."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    return _click_option(field, spelling_of(name, cls))


def open_flags(omit: Mapping[str, str] | None = None, help: Mapping[str, str] | None = None,
               cls: type[OpenOptions] = OpenOptions) -> Callable:
    """Decorator: the command gets a flag for every field of ``cls`` but those in ``omit`` (name -> why the
    command has no use for it), and is called with ``open_options=`` the ``cls`` they build (checked and
    resolved; a value refused by ``cls.build`` is a usage error). ``help``: a field's help text where the
    command means something narrower by it (``prefetch --dtype``)."""
    omit, help = dict(omit or {}), dict(help or {})
    fields = spelled_fields(cls)
    unknown = (set(omit) | set(help)) - {f.name for f, _ in fields}
    if unknown:
        raise TypeError(f"no open option(s) {', '.join(sorted(unknown))}")
    taken = [(f, s) for f, s in fields if f.name not in omit]

    def decorate(command: Callable) -> Callable:
        run: Callable = _WithOpenOptions(command, [f.name for f, _ in taken], cls, omit)
        for field, spelled in reversed(taken):
            run = _click_option(field, spelled, help.get(field.name))(run)
        return run

    return decorate


class _WithOpenOptions:
    """The callback ``open_flags`` makes of a command: it takes the parsed open-option flags out of the
    keywords and calls the command with the one ``open_options`` they build. A class rather than a closure so
    that ``omitted_options`` (name -> why the command has no use for it, read back by the tests of
    reachability) is a declared attribute; it stands in for the command as ``functools.wraps`` would."""

    omitted_options: dict[str, str]

    def __init__(self, command: Callable, names: list[str], cls: type[OpenOptions], omit: dict[str, str]):
        functools.update_wrapper(self, command)
        self._command, self._names, self._cls = command, names, cls
        self.omitted_options = omit

    def __call__(self, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in self._names}
        return self._command(open_options=options_from(given, self._cls), **kwargs)


def options_from(given: Mapping[str, Any], cls: type[OpenOptions] = OpenOptions) -> OpenOptions:
    """The ``cls`` the parsed flags ``given`` build (a flag not given: None or (), the default)."""
    try:
        return cls.build(**{k: v for k, v in given.items() if v not in (None, ())})
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
