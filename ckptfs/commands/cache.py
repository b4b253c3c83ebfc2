"""The cache command line: the ``--cache-dir/--cache-dir-size/--cache-dir-min-free/--redis/--redis-cluster/
--cache-key-file`` options and ``ckptfs cache`` (``ckptfs prefetch`` is ``prefetch.py``).

``tier_options`` is the one definition of these options, for every command that takes them (``mount``,
``prefetch``, and the remote sources' byte cache, which shares ``--cache-dir``). ``--cache-dir`` defaults to
``$CKPTFS_CACHE_DIR``, the folder ``Tensor.shared()`` falls back on too, and ``--cache-key-file`` to
``$CKPTFS_CACHE_KEY_FILE`` (the fstab helper maps ``-o cache_key_file=`` from this option list).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from ckptfs.cache.auth import ENV_KEY_FILE, CacheRefused
from ckptfs.cache.disk import DEFAULT_CACHE_DIR_SIZE, DiskStore
from ckptfs.cache.sparse_store import DEFAULT_MIN_FREE, NAMESPACE, SparseStore, folder_bytes
from ckptfs.util.sizes import format_size, parse_size

ENV_DIR = "CKPTFS_CACHE_DIR"


def _size(ctx, param, value):
    if value is None or isinstance(value, int):
        return value
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _redis_url(ctx, param, value):
    if value is None:
        return None
    from ckptfs.cache.redis_tier import check_url

    try:
        check_url(value)
        import redis  # noqa: F401 - a missing client is a usage error now, not a surprise in the daemon
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    except ImportError:
        raise click.BadParameter("needs redis-py: pip install 'ckptfs[redis]' (or: pip install redis)") from None
    return value


def _cluster_seeds(ctx, param, value):
    if not value:
        return ()
    from ckptfs.cache.redis_cluster import check_seed

    try:
        for seed in value:
            check_seed(seed)
        import redis  # noqa: F401
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    except ImportError:
        raise click.BadParameter("needs redis-py: pip install 'ckptfs[redis]' (or: pip install redis)") from None
    return tuple(value)


def cache_dir_option(f):
    return click.option("--cache-dir", type=click.Path(file_okay=False), default=None, envvar=ENV_DIR,
                        help=f"Persistent cache folder shared by the ckptfs processes of this machine "
                             f"(decoded groups, fetched remote bytes; default ${ENV_DIR}).")(f)


def cache_dir_size_option(f):
    return click.option("--cache-dir-size", default="10G", show_default=True, callback=_size, metavar="SIZE",
                        help="Bound of the --cache-dir folder (all processes together; LRU).")(f)


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


def cache_dir_min_free_option(f):
    return click.option("--cache-dir-min-free", default=None, callback=_percent, metavar="PCT",
                        help="Percent of the --cache-dir file system the fetched-bytes store keeps free "
                             "(evicting least recently used chunks; default 5).")(f)


def cache_key_file_option(f):
    return click.option("--cache-key-file", type=click.Path(dir_okay=False), default=None, envvar=ENV_KEY_FILE,
                        help=f"Secret key authenticating the --cache-dir and --redis entries (owned by you, "
                             f"mode 0600; the same file on every machine sharing a Redis; default "
                             f"${ENV_KEY_FILE}, else the folder's own DIR/.key and a Redis trusted as-is).")(f)


def tier_options(f):
    """--cache-dir, --cache-dir-size, --cache-dir-min-free, --redis, --redis-cluster and --cache-key-file on one
    command (passed as cache_dir, cache_dir_size, cache_dir_min_free, redis, redis_cluster, cache_key_file)."""
    f = click.option("--redis-cluster", "redis_cluster", multiple=True, metavar="HOST:PORT", callback=_cluster_seeds,
                     help="A seed node of a Redis Cluster for decoded groups shared across machines, spread over "
                          "its nodes (repeatable; needs ckptfs[redis]).")(f)
    f = click.option("--redis", default=None, metavar="URL", callback=_redis_url,
                     help="Redis for decoded groups shared across machines (redis://HOST:PORT/DB; "
                          "needs ckptfs[redis]).")(f)
    return cache_dir_option(cache_dir_size_option(cache_dir_min_free_option(cache_key_file_option(f))))


def _store(cache_dir: str | None, max_bytes: int = DEFAULT_CACHE_DIR_SIZE) -> DiskStore:
    """The folder's store for ``ckptfs cache``: made and checked like a mount's (one line if refused)."""
    if not cache_dir:
        raise click.UsageError(f"give --cache-dir DIR (or set ${ENV_DIR})")
    try:
        return DiskStore(cache_dir, max_bytes, "blocks", os.environ.get(ENV_KEY_FILE) or None)
    except CacheRefused as exc:
        raise click.ClickException(str(exc)) from None


def _remote_store(cache_dir: str, max_bytes: int = DEFAULT_CACHE_DIR_SIZE,
                  min_free: float | None = None) -> SparseStore:
    """The folder's store of fetched remote bytes (checked by ``_store`` first)."""
    return SparseStore(cache_dir, max_bytes, os.environ.get(ENV_KEY_FILE) or None,
                       DEFAULT_MIN_FREE if min_free is None else min_free)


@click.group("cache")
def cache_group() -> None:
    """Inspect or empty a --cache-dir folder."""


@cache_group.command("stats")
@cache_dir_option
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
@cache_dir_option
@cache_dir_size_option
@cache_dir_min_free_option
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
@cache_dir_option
def cache_clear(cache_dir):
    """Delete every entry (safe while mounts use the folder: they decode again)."""
    result = _store(cache_dir).clear()
    remote = _remote_store(cache_dir).clear()
    result = {key: result[key] + remote[key] for key in ("files", "bytes")}
    click.echo(f"removed {result['files']} files ({format_size(result['bytes'])})")
