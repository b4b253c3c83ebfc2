"""``ckptfs prefetch``: fill the caches ahead of the first mount.

Two kinds of warm-up, picked by what is asked (for a SRC holding several checkpoints, a repository: for
each of them in turn, or those ``--include GLOB`` matches by name, a summary line each):

- **Stored bytes** (a remote SRC, no NAMES): every byte of every file of the checkpoint (all shards, headers
  included) fetched into the ``--cache-dir`` store, many ranges in flight (``ckptfs.sources.remote.warmup``),
  so that a later mount or open with the same ``--cache-dir`` sends no request for bytes. ``--cache-dir`` is
  required: without a store the bytes would be lost at exit. Resumable: what the store holds is skipped.
- **Decoded groups** (a local SRC, NAMES, ``--redis``/``--redis-cluster``, or ``--decode``): tensors decoded
  into the shared tiers under the keys a mount with the same ``--dtype`` looks up (``ckptfs.ahead.warm``).
  A remote SRC with ``--decode`` gets its bytes first, then is decoded from them.

A progress line on stderr when it is a terminal (``--quiet``: none, and no summary); one summary line at
the end; failures are one line with exit 1, usage errors exit 2.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING

import click

from ckptfs.commands.ending import exit_at_once
from ckptfs.commands.failure import fail
from ckptfs.commands.open_flags import open_flags
from ckptfs.commands.source import with_source
from ckptfs.core.options import OpenOptions
from ckptfs.util.sizes import format_size

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ckptfs.checkpoint.api import Checkpoint
    from ckptfs.sources.plan import SourcePlan

#: The memory cache of the checkpoint a prefetch opens: decoded groups go on to the shared tiers.
PREFETCH_CACHE_BYTES = 64 << 20


class ByteBar:
    """One redrawn line on stderr: bytes done / total, MB/s (of this run's fetches) and the time left."""

    WIDTH = 30
    EVERY_S = 0.2

    def __init__(self, enabled: bool, label: str = "prefetch"):
        self.enabled = enabled
        self.label = label
        self._start = time.monotonic()
        self._first: int | None = None
        self._drawn = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self._first is None:
            self._first = done
        if now - self._drawn < self.EVERY_S and done < total:
            return
        self._drawn = now
        rate = (done - self._first) / max(1e-6, now - self._start)
        eta = f"{(total - done) / rate:.0f} s" if rate > 0 and done < total else "-"
        filled = self.WIDTH * done // max(1, total)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                         f"{format_size(done)} / {format_size(total)}  {rate / 1e6:.1f} MB/s  ETA {eta}   ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * (self.WIDTH + 80) + "\r")
            sys.stderr.flush()
            self.enabled = False


@click.command("prefetch")
@with_source(more="names")
@open_flags(omit={"cache_size": "decoded groups go on to the shared tiers (PREFETCH_CACHE_BYTES in memory)",
                  "manifest": "a manifest checks the reads of a mount or an open, not a cache fill",
                  "offline": "a warm-up fetches from the origin what the cache folder lacks"},
            help={"dtype": "The dtype the mounts that will read decoded entries use (it is part of every key)."})
@click.option("--decode", is_flag=True,
              help="For a remote SRC: after its bytes, decode its tensors into the tiers too.")
@click.option("--include", "include", multiple=True, metavar="GLOB",
              help="For a SRC holding several checkpoints (a repository): warm only those whose name (their "
                   "folder in a mount) matches GLOB; repeatable. Default: every one.")
@click.option("-q", "--quiet", is_flag=True, help="No progress line and no summary (errors only).")
@click.option("-v", "--verbose", is_flag=True, help="Log to stderr; tracebacks on errors.")
def prefetch(src, names, open_options, decode, include, quiet, verbose):
    """Fill the caches before a deployment: a remote SRC's stored bytes into --cache-dir (every file, many
    ranges at once, resumable), or tensors of SRC (all, or NAMES) decoded into the shared tiers. A SRC
    holding several checkpoints (a repository) has each of them warmed (--include to choose)."""
    import logging

    from ckptfs.sources import is_url

    remote = is_url(src)
    options = OpenOptions.build(open_options, cache_size=PREFETCH_CACHE_BYTES)
    cache_dir, redis, redis_cluster = options.cache_dir, options.redis, options.redis_cluster
    decode = bool(decode or names or redis or redis_cluster or not remote)
    fetch_bytes = remote and not names and bool(cache_dir or not decode)
    if verbose:
        logging.basicConfig(level=logging.INFO, format="ckptfs: %(levelname)s %(name)s: %(message)s")
    elif not decode:  # every failure of a byte warm-up ends in its one error line: no log lines before it
        logging.getLogger("ckptfs").addHandler(logging.NullHandler())
    if fetch_bytes and not decode:  # a transfer that ends with the process (ckptfs.util.heap)
        from ckptfs.util.heap import keep_freed_memory

        keep_freed_memory()
    if fetch_bytes and not cache_dir:
        raise click.UsageError("a remote SRC is prefetched into --cache-dir DIR (or $CKPTFS_CACHE_DIR): "
                               "without it the bytes would be lost at exit")
    if decode and not cache_dir and not redis and not redis_cluster:
        raise click.UsageError("nothing to warm: give --cache-dir DIR, --redis URL and/or --redis-cluster HOST:PORT")
    ok = True
    stop = threading.Event()  # set on Ctrl-C: queued pieces are dropped, not fetched on the way out
    early = None
    try:
        from ckptfs.core.runtime import runtime
        from ckptfs.sources.netstats import SOURCE_COUNTERS

        started, before = time.monotonic(), runtime().get(SOURCE_COUNTERS).snapshot()
        bar = ByteBar(enabled=fetch_bytes and not quiet and sys.stderr.isatty())
        plan = None
        if fetch_bytes and not include and options.needs_source_plan(src):  # (a URL always does)
            from ckptfs.sources.plan import SourcePlan
            from ckptfs.sources.registry import load_scheme

            plan = SourcePlan(src, options)  # one for the early warm-up and the open: the open reuses its probe
            load_scheme(src)
            # what the open needs (the formats, numpy, the codecs: tens of ms) is imported while the early
            # warm-up's first requests are on the wire, not before them (nor beside the imports they need)
            _import_ahead("ckptfs.formats", "ckptfs.checkpoint.api")
            early = _early_warmup(src, plan, stop, bar)
        from ckptfs.checkpoint.api import open_with
        from ckptfs.formats.repository import SeveralCheckpoints

        try:
            with open_with(src, options, plan) as ck:
                if include:
                    raise click.UsageError(f"--include chooses among the checkpoints of a repository: {src} is "
                                           f"one checkpoint")
                if fetch_bytes:
                    ok = _fetch_bytes(ck, bar, quiet, started, before, stop, early)
                if decode and ok:
                    ok = _decode(ck, src, names, quiet)
        except SeveralCheckpoints as several:
            if names:
                raise click.UsageError(f"{src} holds {len(several.repository.members)} checkpoints: NAMES "
                                       f"name tensors of one (prefetch it alone)") from None
            ok = _repository(several.repository, include, options, fetch_bytes, decode, bar, quiet, stop)
        except BaseException:
            if early is not None:  # the open failed (or Ctrl-C): the warm-up's pieces end, none start
                stop.set()
                early.join()
            raise
        finally:
            bar.close()  # before any error line (the early warm-up may have drawn it)
    except KeyboardInterrupt:
        stop.set()
        click.echo("ckptfs: interrupted (what was fetched is kept: run it again for the rest)", err=True)
        sys.exit(130)
    except click.ClickException:
        raise
    except Exception as exc:  # noqa: BLE001 - the CLI turns every failure into one line
        kept = early.stored if early is not None else 0  # the open failed after the warm-up stored bytes
        fail(exc, verbose, f"; {format_size(kept)} in the cache folder from before it, kept" if kept else "")
    exit_at_once(0 if ok else 1)  # every byte fetched is on the device by now (ckptfs.commands.ending)


def _import_ahead(*modules: str) -> None:
    """Import ``modules`` on a thread of their own, while the caller waits on the network (best effort: a
    module that fails to import fails again where it is used, and says why there)."""
    import importlib

    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - see the docstring
                return

    threading.Thread(target=run, name="ckptfs-import-ahead", daemon=True).start()


def _early_warmup(src: str, plan: SourcePlan, stop: threading.Event, bar: ByteBar):
    """For a SRC that is one remote file and the whole checkpoint (not a shard of a split set, an index or a
    folder), without mirrors: its warm-up started now, before the open (``EarlyWarmup``: best effort, on a
    thread of its own), or None. Its source is made here, before the open: what the store holds of the file
    is measured before the open stores the header chunks it reads (``EarlyWarmup.start``), and a source that
    cannot be made (a 404, a dead server) is the error the open would give, said once. Anything that goes
    wrong after that is left to the open and the warm-up after it, which say it in their own words."""
    from ckptfs.sources.plan import names_folder
    from ckptfs.sources.remote.warmup import EarlyWarmup, check_room, remote_of

    if names_folder(src) or plan.mirrors:
        return None  # (with mirrors the open may need them: an early warm-up would read the primary alone)
    source = plan.opener(src)  # first: the formats' modules are still being imported (``_import_ahead``)
    remote = remote_of(source)
    if remote is not None:  # a file the folder cannot take above its free-space floor: refused before the open
        check_room([remote])
    from ckptfs.formats import detect
    from ckptfs.formats.shards import is_index_name, parse_shard_name

    name = src.rstrip("/").rsplit("/", 1)[-1]
    if parse_shard_name(name) is not None or is_index_name(name):
        return None  # (its probe is not lost: the open reuses it)
    # a file that is no checkpoint: the check refuses it from the bytes the open brought, before any piece
    return EarlyWarmup(source, stop=stop, progress=bar, check=lambda source: detect(src, source=source)).start()


def _repository(repository, include: tuple[str, ...], options: OpenOptions, fetch_bytes: bool, decode: bool,
                bar: ByteBar, quiet: bool, stop: threading.Event) -> bool:
    """Each checkpoint of a repository (those ``include`` matches, by name: their folder in a mount) opened
    and warmed in turn, a summary line each; one that fails is said in its line and the others go on.
    Whether all succeeded."""
    import fnmatch

    from ckptfs.checkpoint.api import open as open_checkpoint
    from ckptfs.core.runtime import runtime
    from ckptfs.sources.netstats import SOURCE_COUNTERS
    from ckptfs.util.oneline import one_line

    if options.mirrors:
        raise click.UsageError("--mirror names a copy of one checkpoint: prefetch the checkpoints of "
                               f"{repository.folder} one by one with their mirrors")
    chosen = [m for m in repository.members if not include or any(fnmatch.fnmatchcase(m.name, g) for g in include)]
    if not chosen:
        raise click.UsageError(f"--include {' '.join(include)} matches none of the checkpoints of "
                               f"{repository.folder}: {', '.join(m.name for m in repository.members)}")
    ok, shown = True, bar.enabled
    for member in chosen:
        if stop.is_set():
            break
        started, before = time.monotonic(), runtime().get(SOURCE_COUNTERS).snapshot()
        each = ByteBar(shown, f"prefetch {member.name}")
        try:
            with open_checkpoint(member.src, options=options) as ck:
                done = _fetch_bytes(ck, each, quiet, started, before, stop, label=f"{member.name}: ") \
                    if fetch_bytes else True
                if decode and done:
                    done = _decode(ck, member.src, (), quiet)
        except Exception as exc:  # noqa: BLE001 - one line for this checkpoint; the others go on
            each.close()
            click.echo(one_line(f"ckptfs: error: {member.name}: {exc}"), err=True)
            done = False
        ok = ok and done
    return ok


def _fetch_bytes(ck, bar: ByteBar, quiet: bool, started: float, before: dict, stop: threading.Event,
                 early=None, label: str = "") -> bool:
    """The stored-bytes warm-up of an opened checkpoint (after ``early``'s, when one ran during the open);
    its summary counts the header bytes the open fetched (``before``: the traffic counters before the open,
    at ``started``) as fetched by this run. ``label`` starts its lines (a repository's checkpoint name)."""
    from ckptfs.sources.remote.store.chunks import CHUNK
    from ckptfs.core.runtime import runtime
    from ckptfs.sources.netstats import SOURCE_COUNTERS
    from ckptfs.sources.remote.warmup import checkpoint_sources, stored_in_folder, warm
    from ckptfs.util.oneline import one_line

    counters = runtime().get(SOURCE_COUNTERS)  # the open's sources count in the process's runtime
    cached_before = (early.join() or None) if early is not None else None  # None: it did not get to run
    opened = counters.snapshot()["bytes"] - before["bytes"] if cached_before is None else 0
    try:
        report = warm(checkpoint_sources(ck), progress=bar, stop=stop, cached_before=cached_before)
    finally:
        bar.close()
    if cached_before is None:
        # the header chunks the open fetched and stored are this run's, not found cached (the open's other
        # bytes, the one-byte probe and a validator's 4 KiB tail check, are less than a chunk)
        report.cached -= min(report.cached, opened // CHUNK * CHUNK)
    report.fetched = counters.snapshot()["bytes"] - before["bytes"]  # every byte received, the open's too
    report.seconds = time.monotonic() - started
    if report.errors:
        kept = stored_in_folder(checkpoint_sources(ck))  # measured in the store: a full one keeps less
        click.echo(one_line(f"ckptfs: error: {label}{report.errors[0]}"
                            + (f" (and {len(report.errors) - 1} more)" if len(report.errors) > 1 else "")
                            + f"; {format_size(report.fetched)} fetched, {format_size(kept)} of the checkpoint's "
                              f"{format_size(report.total)} in the cache folder (run it again for the rest)"),
                   err=True)
        return False
    if not quiet:
        requests = counters.snapshot()["requests"] - before["requests"]
        click.echo(f"prefetch: {label}{report.summary()}; {requests} requests")
    return True


def _decode(ck: Checkpoint, src: str, names: Sequence[str], quiet: bool) -> bool:
    from ckptfs.ahead.warm import warm

    try:
        tensors = [ck[name] for name in names] if names else list(ck.tensors)
    except KeyError as exc:
        raise click.UsageError(f"no tensor {exc.args[0]!r} in {src}") from None
    report = warm(ck, tensors, progress=not quiet and sys.stderr.isatty())
    if not quiet or not report.ok:
        click.echo(report.summary(), err=not report.ok)
    return report.ok
