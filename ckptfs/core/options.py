"""``OpenOptions``: everything that decides how a checkpoint is opened and read, as one frozen value, and the
one list of those settings.

The command line, the fstab helper and ``ckptfs.open()``'s keywords each build one ``OpenOptions``; the
checkpoint keeps it whole, its tensors carry it into their pickles, and a worker process that unpickles a
tensor reopens the checkpoint with exactly the same options: the same shared tiers, manifest checks, mirrors
and timeouts as its parent (before this value existed a worker reopened with the cache tiers alone, and read
a corrupted file silently that its parent refused).

**Spelled once.** Each field is declared with :func:`option`, which puts its :class:`Spelling` next to it
(``dataclasses.field`` metadata): the help text, the command-line flag, how the command line parses its
value (``kind``, a name the CLI layer maps to a click type: ``ckptfs.commands.open_flags``), and where the
default that ``None`` stands for lives when another layer owns it (``default_at``, ``"module:NAME"``, shown
in ``--help``; never copied here). Everything else is derived from the fields:

- ``ckptfs.open()``'s keywords (its signature, as ``help()`` shows it, is generated from them);
- the ``--flags`` of ``mount``, ``info``, ``bench`` and ``prefetch`` (one decorator, ``open_flags``; a
  command leaves out only the fields it names, with its reason);
- the fstab ``-o`` names (``Spelling.fstab``: the flag without dashes, ``-`` as ``_``);
- the argv of a ``ckptfs mount`` a tool starts with these options (:meth:`OpenOptions.as_flags`).

A new option is one field here with its spelling (and, for a new kind of value, its parser in the CLI layer).

Paths in it are absolute from the moment it is built (``resolved``): a mount daemon runs in ``/`` and a
worker may run anywhere, so a relative ``--manifest m.json`` or ``--cache-dir cache`` must already name the
file its user meant. URLs stay as they are.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import re
from dataclasses import dataclass
from typing import Any, ClassVar

#: The decoded-group memory cache of a checkpoint when nothing else is asked for.
DEFAULT_CACHE_BYTES = 512 * 1024 * 1024
DEFAULT_MAX_OPEN_FILES = 64
#: What ``--dtype`` / ``dtype=`` accept (``ckptfs.quant.output_dtype`` says what each serves).
DTYPE_MODES = ("auto", "float32", "float16")

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_SPELLING = "ckptfs.spelling"


@dataclass(frozen=True)
class Spelling:
    """How one open option is spelled outside Python (see the module docstring)."""

    help: str
    flag: str                       # "--cache-size"
    kind: str = "text"              # how the command line parses it (ckptfs.commands.open_flags.KINDS)
    metavar: str | None = None      # None: the kind's
    repeat: bool = False            # the flag may be given several times (a tuple field)
    env: str | None = None          # an environment variable the command line falls back on
    default_at: str | None = None   # "module:NAME": the default a None value stands for, owned there

    @property
    def fstab(self) -> str:
        """Its ``-o key=value`` name for mount(8) and fstab."""
        return self.flag[2:].replace("-", "_")


def option(default: Any, **spelling: Any) -> Any:
    """A field of an options dataclass, with its :class:`Spelling` (keywords: its fields) beside it."""
    return dataclasses.field(default=default, metadata={_SPELLING: Spelling(**spelling)})


def spelling(field: dataclasses.Field[Any]) -> Spelling:
    """The spelling declared with ``field``; TypeError for a field declared without one (every open option
    has its flag, fstab name and help)."""
    found = field.metadata.get(_SPELLING)
    if not isinstance(found, Spelling):
        raise TypeError(f"open option {field.name!r} is declared without its spelling: use option(...)")
    return found


def spelled_fields(cls: type[OpenOptions] | None = None) -> list[tuple[dataclasses.Field[Any], Spelling]]:
    """Every field of ``cls`` (default :class:`OpenOptions`) with its spelling, in declaration order."""
    return [(f, spelling(f)) for f in dataclasses.fields(cls if cls is not None else OpenOptions)]


def spelling_of(name: str, cls: type[OpenOptions] | None = None) -> Spelling:
    """The spelling of the field ``name`` of ``cls`` (default :class:`OpenOptions`)."""
    return next(s for f, s in spelled_fields(cls) if f.name == name)


def env_of(name: str) -> str:
    """The environment variable the flag of the field ``name`` falls back on (the library reads the same one:
    ``Tensor.shared()``'s folder, the cache key)."""
    env = spelling_of(name).env
    if env is None:
        raise ValueError(f"open option {name} has no environment variable")
    return env


DTYPE_HELP = ("auto: exact types keep their dtype, the rest float32; float32: every floating tensor float32; "
              "float16: decoded tensors (quantized, BF16, F8...) float16, while F32, F64 and F16 tensors keep "
              "their stored dtype.")


@dataclass(frozen=True)
class OpenOptions:
    """How to open and read one checkpoint (see the module docstring). Build it with :meth:`build`."""

    #: the fields ``ckptfs.open()`` also takes by position, after ``src``
    POSITIONAL: ClassVar[tuple[str, ...]] = ("dtype", "cache_size", "max_open_files")

    dtype: str = option("auto", flag="--dtype", kind="dtype", help=DTYPE_HELP)  # one of DTYPE_MODES
    cache_size: int = option(
        DEFAULT_CACHE_BYTES, flag="--cache-size", kind="size",
        help="Decoded-block cache bound, binary units (64M = 64 MiB; 0: no cache).")
    max_open_files: int = option(
        DEFAULT_MAX_OPEN_FILES, flag="--max-open-files", kind="count",
        help="Files of the checkpoint (shards) kept open at once; the least recently used is closed for another.")
    cache_dir: str | None = option(
        None, flag="--cache-dir", kind="dir", env="CKPTFS_CACHE_DIR",
        help="Persistent cache folder shared by the ckptfs processes of this machine (decoded groups, fetched "
             "remote bytes; default $CKPTFS_CACHE_DIR).")
    cache_dir_size: int | None = option(
        None, flag="--cache-dir-size", kind="size", default_at="ckptfs.cache.disk:DEFAULT_CACHE_DIR_SIZE",
        help="Bound of the --cache-dir folder (all processes together; LRU).")
    cache_dir_min_free: float | None = option(
        None, flag="--cache-dir-min-free", kind="percent",
        default_at="ckptfs.sources.remote.store.sparse_store:DEFAULT_MIN_FREE",
        help="Percent of the --cache-dir file system the fetched-bytes store keeps free (evicting least recently "
             "used chunks).")
    redis: str | None = option(
        None, flag="--redis", kind="redis_url",
        help="Redis for decoded groups shared across machines (redis://HOST:PORT/DB; needs ckptfs[redis]).")
    redis_cluster: tuple[str, ...] = option(
        (), flag="--redis-cluster", kind="redis_seed", repeat=True,
        help="A seed node of a Redis Cluster for decoded groups shared across machines, spread over its nodes "
             "(repeatable; needs ckptfs[redis]).")
    cache_key_file: str | None = option(
        None, flag="--cache-key-file", kind="file", env="CKPTFS_CACHE_KEY_FILE",
        help="Secret key authenticating the --cache-dir and --redis entries (owned by you, mode 0600; the same "
             "file on every machine sharing a Redis; default $CKPTFS_CACHE_KEY_FILE, else the folder's own "
             "DIR/.key and a Redis trusted as-is).")
    manifest: Any = option(  # noqa: RUF009 - a field; a manifest file's path, or a loaded ckptfs.integrity Manifest (the API only)
        None, flag="--manifest", kind="file",
        help="Check every read against this `ckptfs manifest` file (a mismatch: EIO and one log line).")
    mirrors: tuple[str, ...] = option(
        (), flag="--mirror", metavar="SRC", repeat=True,
        help="A byte-identical copy of SRC (path or URL), read when a read from SRC fails; repeatable, tried "
             "in order.")
    timeout: float | None = option(
        None, flag="--timeout", kind="seconds", default_at="ckptfs.sources.remote.options:DEFAULT_TIMEOUT",
        help="Answer every remote read within this time, failover included, with data or an error (EIO).")
    stall_timeout: float | None = option(
        None, flag="--stall-timeout", kind="seconds",
        default_at="ckptfs.sources.remote.options:DEFAULT_STALL_TIMEOUT",
        help="Abandon a remote attempt that gets no bytes for this long and retry or fail over.")
    offline: bool = option(
        False, flag="--offline", kind="flag",
        help="Never contact the origin of a remote SRC: serve what the --cache-dir folder holds of it (a read of "
             "bytes it lacks fails with EIO).")

    @classmethod
    def build(cls, base: OpenOptions | None = None, **changes: Any) -> OpenOptions:
        """``base`` (default: all defaults) with ``changes`` applied, checked and resolved. A change of None
        leaves the field as ``base`` has it, so callers can pass every keyword they were given."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown open option(s): {', '.join(sorted(unknown))}")
        given = {k: v for k, v in changes.items() if v is not None}
        options = dataclasses.replace(base if base is not None else cls(), **given)
        return options._checked()._resolved()

    def _checked(self) -> OpenOptions:
        cache_size = self.cache_size
        if isinstance(cache_size, bool) or not _is_int(cache_size) or cache_size < 0:
            raise ValueError(f"cache_size must be a whole number of bytes >= 0 (0 keeps nothing), not {cache_size!r}")
        for name in ("timeout", "stall_timeout"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise ValueError(f"{name} must be a number of seconds > 0, not {value!r}")
        free = self.cache_dir_min_free
        if free is not None and (isinstance(free, bool) or not isinstance(free, (int, float)) or not 0 <= free < 100):
            raise ValueError(f"cache_dir_min_free must be a percentage from 0 to below 100, not {free!r}")
        if isinstance(self.mirrors, (str, bytes, os.PathLike)):
            raise TypeError("mirrors must be a list of sources, not one string")
        if isinstance(self.redis_cluster, (str, bytes)):
            raise TypeError("redis_cluster must be a list of HOST:PORT seed nodes, not one string")
        return dataclasses.replace(self, cache_size=int(cache_size), max_open_files=max(1, int(self.max_open_files)),
                                   mirrors=tuple(os.fspath(m) for m in self.mirrors),
                                   redis_cluster=tuple(self.redis_cluster))

    def _resolved(self) -> OpenOptions:
        manifest = self.manifest
        if isinstance(manifest, (str, bytes, os.PathLike)):
            manifest = absolute(os.fsdecode(os.fspath(manifest)))
        return dataclasses.replace(
            self, manifest=manifest, mirrors=tuple(absolute(m) for m in self.mirrors),
            cache_dir=absolute(os.fspath(self.cache_dir)) if self.cache_dir else None,
            cache_key_file=absolute(os.fspath(self.cache_key_file)) if self.cache_key_file else None)

    def as_flags(self) -> list[str]:
        """The command-line arguments (``--flag=value``) that build this value again: the fields that differ
        from their defaults, for a tool that mounts through ``ckptfs mount`` (``ckptfs bench``). ValueError
        for a value no command line carries (a loaded Manifest)."""
        argv = []
        for field, spelled in spelled_fields(type(self)):
            value = getattr(self, field.name)
            if value == field.default:
                continue
            if isinstance(value, bool) and spelled.kind == "flag":
                argv.append(spelled.flag)  # (a flag differs from its default False only when given)
                continue
            for item in value if spelled.repeat else (value,):
                if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                    raise ValueError(f"open option {field.name}={item!r} has no command-line spelling")
                argv.append(f"{spelled.flag}={item}")
        return argv

    @property
    def shared_tiers(self) -> bool:
        """Whether decoded groups go to tiers shared with other processes (disk, Redis)."""
        return bool(self.cache_dir or self.redis or self.redis_cluster)

    def needs_source_plan(self, src: str) -> bool:
        """Whether opening ``src`` needs remote options or mirrors (a plain local open needs neither)."""
        return bool(_URL.match(src) or self.mirrors or self.timeout is not None or self.stall_timeout is not None)


def absolute(src: str) -> str:
    """A local path as an absolute one (``~`` expanded, not normalized: ``..`` after a link keeps its meaning);
    a URL as it is."""
    if _URL.match(src):
        return src
    src = os.path.expanduser(src)
    if os.path.isabs(src):
        return src
    try:
        return os.path.join(os.getcwd(), src)
    except OSError:  # the working directory was deleted: nothing better to name
        return src


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral)  # numpy's integers too
