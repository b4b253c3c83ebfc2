"""``OpenOptions``: everything that decides how a checkpoint is opened and read, as one frozen value.

The command line, the fstab helper and ``ckptfs.open()``'s keywords each build one ``OpenOptions``; the
checkpoint keeps it whole, its tensors carry it into their pickles, and a worker process that unpickles a
tensor reopens the checkpoint with exactly the same options: the same shared tiers, manifest checks, mirrors
and timeouts as its parent (before this value existed a worker reopened with the cache tiers alone, and read
a corrupted file silently that its parent refused).

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
from typing import Any

#: The decoded-group memory cache of a checkpoint when nothing else is asked for.
DEFAULT_CACHE_BYTES = 512 * 1024 * 1024
DEFAULT_MAX_OPEN_FILES = 64

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


@dataclass(frozen=True)
class OpenOptions:
    """How to open and read one checkpoint (see the module docstring). Build it with :meth:`build`."""

    dtype: str = "auto"                     # "auto" | "float32" | "float16" (ckptfs.quant.DTYPE_MODES)
    cache_size: int = DEFAULT_CACHE_BYTES   # bytes of decoded groups kept in memory (0: none)
    max_open_files: int = DEFAULT_MAX_OPEN_FILES
    cache_dir: str | None = None            # the disk tier (ckptfs.cache.disk), also fetched remote bytes
    cache_dir_size: int | None = None       # its bound (None: ckptfs.cache.disk's default)
    cache_dir_min_free: float | None = None  # percent of its file system kept free (None: the store's 5)
    redis: str | None = None                # the Redis tier's URL
    redis_cluster: tuple[str, ...] = ()     # seed nodes (HOST:PORT) of a Redis Cluster tier
    cache_key_file: str | None = None       # the key authenticating shared-tier entries (ckptfs.cache)
    manifest: Any = None                    # a manifest file's path, or a loaded ckptfs.integrity Manifest
    mirrors: tuple[str, ...] = ()           # byte-identical copies read when a read from the source fails
    timeout: float | None = None            # every remote read answered within it (None: the default)
    stall_timeout: float | None = None      # a remote attempt with no bytes for this long is abandoned

    @classmethod
    def build(cls, base: OpenOptions | None = None, **changes) -> OpenOptions:
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


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral)  # numpy's integers too
