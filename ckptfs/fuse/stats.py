"""The service counters of a mount: ``decoded_bytes``, ``tiers`` and ``source`` (docs/reference/metrics.md).

One builder serves both readers of them, the root xattr ``user.ckptfs.stats`` (``ckptfs stats MNT``) and the
Prometheus exporter, so the two always agree. It takes what the checkpoint has: the cache's per-tier stats
(a ``TieredCache`` gives ``{"memory": {...}, "disk": {...}}``), and the remote-source counters of the runtime
the mount was handed (``ckptfs.core.runtime``; all zero when every source is local).
Every tier has at least ``hits``, ``misses`` and ``bytes``; ``source`` always has ``requests``, ``bytes``,
``retries`` and ``failovers``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ckptfs.core.runtime import Runtime

TIER_KEYS = ("hits", "misses", "bytes")
SOURCE_KEYS = ("requests", "bytes", "retries", "failovers")  # and shared_bytes where remote chunks are shared


class TierStatsSource(Protocol):
    """A cache that reports per tier: a ``TieredCache``, or a repository's member caches summed."""

    def tier_stats(self) -> dict[str, dict[str, Any]]: ...


class CacheOwner(Protocol):
    """What serves a mount's blocks: a tree (one checkpoint's or a repository's) and the cache it reports."""

    @property
    def cache(self) -> TierStatsSource: ...


def tier_stats(cache: TierStatsSource | None, runtime: Runtime) -> dict[str, dict[str, int]]:
    """``{"memory": {"hits", "misses", "bytes", ...}, ...}`` from the cache that serves the blocks, with the
    counters of ``runtime``'s shared tiers of fetched chunks."""
    if cache is None:
        return {"memory": dict.fromkeys(TIER_KEYS, 0)}
    # a TieredCache's stats() is its memory tier's (the "cache" key); tier_stats() has every configured tier
    raw = cache.tier_stats()
    tiers: dict[str, dict[str, int]] = {}
    for name, values in raw.items():
        if isinstance(values, dict):
            tiers[name] = {**dict.fromkeys(TIER_KEYS, 0), **values}
    tiers.setdefault("memory", dict.fromkeys(TIER_KEYS, 0))
    for name, values in chunk_tier_stats(runtime).items():
        tier = tiers.setdefault(name, dict.fromkeys(TIER_KEYS, 0))
        tier.update({f"chunk_{key}": value for key, value in values.items()})
    return tiers


def chunk_tier_stats(runtime: Runtime) -> dict[str, dict[str, int]]:
    """``runtime``'s shared tiers of fetched chunks (``--redis`` with a remote source): their counters, shown
    in the tier of the same name as ``chunk_<counter>`` (``chunk_hit_bytes``: chunk bytes it served,
    ``chunk_leases``: chunks this process fetched under its lease, ``chunk_waited``/``chunk_waited_hits``:
    chunks it waited for another's fetch of, and got)."""
    try:
        from ckptfs.sources.remote.store.chunks import SHARED_CHUNK_TIERS
    except ImportError:  # an installation without remote sources
        return {}
    return runtime.get(SHARED_CHUNK_TIERS).stats()


def source_stats(runtime: Runtime) -> dict[str, Any]:
    """``runtime``'s remote-source counters; zeros (and no schemes) when no remote source was read."""
    try:
        from ckptfs.sources.netstats import SOURCE_COUNTERS
    except ImportError:  # an installation without remote sources
        return {**dict.fromkeys(SOURCE_KEYS, 0), "by_scheme": {}, "origins": {}}
    from ckptfs.ahead.limits import ORIGINS

    snapshot = runtime.get(SOURCE_COUNTERS).snapshot()
    # each origin's learnt in-flight limit (ckptfs.ahead.limits): what a cold stream's speed comes from
    return {**dict.fromkeys(SOURCE_KEYS, 0), "by_scheme": {}, **snapshot, "origins": runtime.get(ORIGINS).stats()}


def service_stats(tree: CacheOwner, decoded_bytes: int, runtime: Runtime) -> dict[str, Any]:
    return {"decoded_bytes": int(decoded_bytes), "tiers": tier_stats(tree.cache, runtime),
            "source": source_stats(runtime)}


def render_table(stats: dict[str, Any]) -> str:
    """``ckptfs stats MNT`` without ``--json``: the service counters as aligned text, then the rest."""
    from ckptfs.util.sizes import format_size

    lines = [f"decoded: {format_size(int(stats.get('decoded_bytes', 0)))}", "",
             f"{'tier':<8} {'hits':>12} {'misses':>12} {'hit ratio':>9} {'bytes':>10}"]
    for name, tier in stats.get("tiers", {}).items():
        hits, misses = int(tier.get("hits", 0)), int(tier.get("misses", 0))
        ratio = f"{hits / (hits + misses):.1%}" if hits + misses else "-"
        lines.append(f"{name:<8} {hits:>12} {misses:>12} {ratio:>9} {format_size(int(tier.get('bytes', 0))):>10}")
    source = stats.get("source", {})
    lines += ["", "source: " + ", ".join(
        f"{key} {format_size(int(source.get(key, 0))) if key == 'bytes' else int(source.get(key, 0))}"
        for key in SOURCE_KEYS)]
    warmup = stats.get("warmup", stats.get("prefetch"))
    if isinstance(warmup, dict):  # a mount's --prefetch (a repository's: a line per checkpoint after it)
        lines += ["", _warmup_line(warmup, format_size)]
        for name, each in dict(warmup.get("checkpoints") or {}).items():
            lines.append(f"  {name}: " + _warmup_line(each, format_size).removeprefix("warm-up: "))
    skip = {"decoded_bytes", "tiers", "source", "cache"}
    other = [(k, v) for k, v in stats.items() if k not in skip and not isinstance(v, (dict, list))]
    if other:
        lines.append("")
        lines += [f"{key}: {value}" for key, value in other]
    return "\n".join(lines)


def _warmup_line(warmup: dict[str, Any], format_size: Callable[[float], str]) -> str:
    """``warm-up: running, 120.0 MiB of 241.6 MiB in the cache folder`` (``failed: why`` after it)."""
    line = f"warm-up: {warmup.get('state', '?')}"
    total = int(warmup.get("total_bytes", 0))
    if total:
        line += f", {format_size(int(warmup.get('stored_bytes', 0)))} of {format_size(total)} in the cache folder"
    if "fetched_bytes" in warmup:
        line += f" ({format_size(int(warmup['fetched_bytes']))} fetched in {warmup.get('seconds', 0)} s)"
    if warmup.get("error"):
        line += f"; {warmup['error']}"
    return line
