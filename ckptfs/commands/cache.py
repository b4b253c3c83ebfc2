"""``ckptfs cache``: inspect or empty a ``--cache-dir`` folder (``ckptfs prefetch`` is ``prefetch.py``).

Its ``--cache-dir``, ``--cache-dir-size`` and ``--cache-dir-min-free`` are the open options' own flags
(``open_flags.flag``): the same spelling, help, default and ``$CKPTFS_CACHE_DIR`` fallback as ``mount``'s.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from ckptfs.cache.auth import CacheRefused
from ckptfs.cache.disk import DEFAULT_CACHE_DIR_SIZE, DiskStore
from ckptfs.sources.remote.store.sparse_store import DEFAULT_MIN_FREE, NAMESPACE, SparseStore, folder_bytes
from ckptfs.commands.open_flags import flag
from ckptfs.core.options import env_of
from ckptfs.util.sizes import format_size

ENV_KEY_FILE = env_of("cache_key_file")


def _store(cache_dir: str | None, max_bytes: int | None = None) -> DiskStore:
    """The folder's store for ``ckptfs cache``: made and checked like a mount's (one line if refused)."""
    if not cache_dir:
        raise click.UsageError(f"give --cache-dir DIR (or set ${env_of('cache_dir')})")
    try:
        return DiskStore(cache_dir, max_bytes or DEFAULT_CACHE_DIR_SIZE, "blocks",
                         os.environ.get(ENV_KEY_FILE) or None)
    except CacheRefused as exc:
        raise click.ClickException(str(exc)) from None


def _remote_store(cache_dir: str, max_bytes: int | None = None, min_free: float | None = None) -> SparseStore:
    """The folder's store of fetched remote bytes (checked by ``_store`` first)."""
    return SparseStore(cache_dir, max_bytes or DEFAULT_CACHE_DIR_SIZE, os.environ.get(ENV_KEY_FILE) or None,
                       DEFAULT_MIN_FREE if min_free is None else min_free)


@click.group("cache")
def cache_group() -> None:
    """Inspect or empty a --cache-dir folder."""


@cache_group.command("stats")
@flag("cache_dir")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def cache_stats(cache_dir, as_json):
    """Files and bytes per namespace (blocks: decoded groups, remote: remote files, tensors: shared())."""
    usage = _store(cache_dir).usage()
    usage[NAMESPACE] = _remote_store(cache_dir).usage()
    total = {"files": sum(v["files"] for v in usage.values()), "bytes": sum(v["bytes"] for v in usage.values())}
    if as_json:
        click.echo(json.dumps({"cache_dir": cache_dir, "namespaces": usage, "total": total}, indent=2))
        return
    click.echo(f"{'namespace':<10} {'files':>10} {'size':>12}")
    for name in sorted(usage):
        click.echo(f"{name:<10} {usage[name]['files']:>10} {format_size(usage[name]['bytes']):>12}")
    click.echo(f"{'total':<10} {total['files']:>10} {format_size(total['bytes']):>12}")


@cache_group.command("prune")
@flag("cache_dir")
@flag("cache_dir_size")
@flag("cache_dir_min_free")
def cache_prune(cache_dir, cache_dir_size, cache_dir_min_free):
    """Delete least recently used entries down to 90% of --cache-dir-size (and killed writers' leftovers)."""
    result = _store(cache_dir, cache_dir_size).prune()
    remote = _remote_store(cache_dir, cache_dir_size, cache_dir_min_free).prune()
    result["files"] += remote["files"]
    result["bytes"] += remote["bytes"]
    result["total"] = folder_bytes(Path(cache_dir))
    click.echo(f"removed {result['files']} files ({format_size(result['bytes'])}); "
               f"{format_size(result['total'])} left")


@cache_group.command("clear")
@flag("cache_dir")
def cache_clear(cache_dir):
    """Delete every entry (safe while mounts use the folder: they decode again)."""
    result = _store(cache_dir).clear()
    remote = _remote_store(cache_dir).clear()
    result = {key: result[key] + remote[key] for key in ("files", "bytes")}
    click.echo(f"removed {result['files']} files ({format_size(result['bytes'])})")
