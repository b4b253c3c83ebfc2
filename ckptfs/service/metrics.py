"""``--metrics [HOST:]PORT``: the mount's counters as Prometheus text at ``/metrics`` (prometheus-client).

Imported only when ``--metrics`` is given (``pip install 'ckptfs[metrics]'``); a mount without it never
loads prometheus-client. The exporter (prometheus-client's own HTTP server thread) is started by the daemon
after the fork, bound to 127.0.0.1 unless a host is given.

Nothing is kept twice: one custom collector reads, at scrape time, the counters the daemon keeps anyway —
the stats builder's tiers and source counters, per scheme and per origin (``user.ckptfs.stats`` shows the
same numbers), the decode counters, the FUSE request counters of ``CkptOperations`` and the process's page
faults (getrusage). Only two things are observed per event, into ``counters.Histogram`` (one bisect under one
lock): FUSE request seconds per operation, and decode seconds per storage type. The names and labels are
fixed in docs/reference/metrics.md.
"""

from __future__ import annotations

import errno as errno_module
import resource
from collections.abc import Iterator
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from ckptfs.fuse.errors import MountError

DEFAULT_HOST = "127.0.0.1"
FILE_KINDS = ("npy", "raw", "json", "file", "hf")
OUTCOMES = ("ok", "retry", "error", "timeout")


def parse_address(spec: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port); MountError (usage) otherwise."""
    text = str(spec).strip()
    host, port = DEFAULT_HOST, text
    if text.startswith("["):
        inside, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise MountError(f"--metrics {spec!r}: use PORT, HOST:PORT or [IPv6]:PORT", exit_code=2)
        host, port = inside, rest[1:]
    elif ":" in text:
        host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
        raise MountError(f"--metrics {spec!r}: use PORT, HOST:PORT or [IPv6]:PORT (port 0-65535)", exit_code=2)
    return host, int(port)


def _histogram(name: str, doc: str, label: str, snapshot: dict[str, tuple[list[int], float]],
               bounds: tuple[float, ...]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=[label])
    for value, (cumulative, total) in sorted(snapshot.items()):
        buckets = [(repr(float(b)), cumulative[i]) for i, b in enumerate(bounds)]
        buckets.append(("+Inf", cumulative[-1]))
        family.add_metric([value], buckets, total)
    return family


class CkptfsCollector:
    """Builds every ckptfs family from the daemon's live counters when Prometheus scrapes."""

    def __init__(self, operations: Any, info: dict[str, str]):
        self._ops = operations
        self._info = info

    def describe(self) -> list[Metric]:
        return []  # no sample at registration: the counters are read only when scraped

    def collect(self) -> Iterator[Metric]:
        ops = self._ops
        stats = ops.stats()
        counters = ops.counters

        info = GaugeMetricFamily("ckptfs_info", "This mount: ckptfs version, FUSE binding, source.",
                                 labels=["version", "binding", "source"])
        info.add_metric([self._info["version"], self._info["binding"], self._info["source"]], 1)
        yield info

        read_bytes = CounterMetricFamily("ckptfs_read_bytes", "Bytes returned to readers, per file kind.",
                                         labels=["kind"])
        by_kind = ops.read_bytes_by_kind()  # Python's reads and the C path's together
        for kind in sorted(set(FILE_KINDS) | set(by_kind)):
            read_bytes.add_metric([kind], by_kind.get(kind, 0))
        yield read_bytes

        c_reads = stats["c_reads"]
        direct = CounterMetricFamily("ckptfs_c_reads", "Read requests answered in C without Python (files read "
                                     "as they are), per file kind; not in ckptfs_fuse_requests.",
                                     labels=["kind"])
        for kind, served in sorted(c_reads["by_kind"].items()):
            direct.add_metric([kind], served["reads"])
        yield direct

        seconds = counters.request_seconds.snapshot()
        requests = CounterMetricFamily("ckptfs_fuse_requests", "FUSE requests answered, per operation.",
                                       labels=["op"])
        for op, (cumulative, _) in sorted(seconds.items()):
            requests.add_metric([op], cumulative[-1])
        yield requests
        yield _histogram("ckptfs_fuse_request_seconds", "Time to answer a FUSE request, per operation.", "op",
                         seconds, counters.request_seconds.buckets)

        errors = CounterMetricFamily("ckptfs_fuse_errors", "FUSE requests answered with an error.",
                                     labels=["op", "errno"])
        for (op, code), n in sorted(counters.errors.snapshot().items()):
            errors.add_metric([op, errno_module.errorcode.get(code, str(code))], n)
        yield errors

        hits = CounterMetricFamily("ckptfs_cache_hits", "Cache lookups answered by the tier.", labels=["tier"])
        misses = CounterMetricFamily("ckptfs_cache_misses", "Cache lookups the tier could not answer.",
                                     labels=["tier"])
        held = GaugeMetricFamily("ckptfs_cache_bytes", "Bytes held by the tier.", labels=["tier"])
        for tier, values in stats["tiers"].items():
            hits.add_metric([tier], int(values.get("hits", 0)))
            misses.add_metric([tier], int(values.get("misses", 0)))
            held.add_metric([tier], int(values.get("bytes", 0)))
        yield from (hits, misses, held)

        decode = counters.decode
        decoded = CounterMetricFamily("ckptfs_decoded_bytes", "Codec output produced, per storage type.",
                                      labels=["storage_type"])
        for storage_type, n in sorted(decode.bytes.snapshot().items()):
            decoded.add_metric([storage_type], n)
        yield decoded
        if decode.histogram is not None:
            yield _histogram("ckptfs_decode_seconds", "Time to decode one block group, per storage type.",
                             "storage_type", decode.histogram.snapshot(), decode.histogram.buckets)

        yield from _source_families(stats["source"], self._info["scheme"])

        usage = resource.getrusage(resource.RUSAGE_SELF)
        faults = CounterMetricFamily("ckptfs_page_faults", "Page faults of the daemon process.", labels=["kind"])
        faults.add_metric(["minor"], usage.ru_minflt)
        faults.add_metric(["major"], usage.ru_majflt)
        yield faults


def _source_families(source: dict[str, Any], scheme: str) -> tuple[CounterMetricFamily, ...]:
    """Per scheme and outcome where the source counters keep them; a local mount shows its scheme at 0."""
    by_scheme = source.get("by_scheme") or {scheme: {"requests": {}, "bytes": 0}}
    requests = CounterMetricFamily("ckptfs_source_requests", "Requests to the checkpoint's sources, by outcome.",
                                   labels=["scheme", "outcome"])
    fetched = CounterMetricFamily("ckptfs_source_bytes", "Payload bytes received from the sources.",
                                  labels=["scheme"])
    for name, entry in sorted(by_scheme.items()):
        outcomes = entry.get("requests", {})
        for outcome in sorted(set(OUTCOMES) | set(outcomes)):
            requests.add_metric([name, outcome], int(outcomes.get(outcome, 0)))
        fetched.add_metric([name], int(entry.get("bytes", 0)))
    failovers = CounterMetricFamily("ckptfs_mirror_failovers", "Reads served from a mirror after the primary failed.")
    failovers.add_metric([], int(source.get("failovers", 0)))
    shared = CounterMetricFamily("ckptfs_source_shared_bytes", "Fetched-chunk bytes the shared tier (--redis, "
                                 "--redis-cluster) served instead of the sources.")
    shared.add_metric([], int(source.get("shared_bytes", 0)))
    return requests, fetched, failovers, shared, *_origin_families(source.get("origins") or {})


def _origin_families(origins: dict[str, dict[str, Any]]) -> tuple[CounterMetricFamily, CounterMetricFamily]:
    """What each remote origin cost its readers (``ckptfs.ahead.limits``): none on a local mount."""
    outages = CounterMetricFamily("ckptfs_source_outages", "Outages of the origin: a fetch used its whole "
                                  "--timeout without its bytes.", labels=["origin"])
    deadlines = CounterMetricFamily("ckptfs_source_deadlines_met", "Times readers waited a whole --timeout for "
                                    "the origin (fetches running out side by side: one).", labels=["origin"])
    for origin, figures in sorted(origins.items()):
        outages.add_metric([origin], int(figures.get("outages", 0)))
        deadlines.add_metric([origin], int(figures.get("deadlines_met", 0)))
    return outages, deadlines


def start_exporter(host: str, port: int, operations: Any, info: dict[str, str]) -> tuple[str, int]:
    """Serve ``/metrics`` from a thread; the address it listens on (the port chosen when ``port`` is 0)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CkptfsCollector(operations, info))
    try:
        started = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise MountError(f"--metrics {host}:{port}: cannot listen: {exc.strerror or exc}") from None
    # prometheus-client >= 0.17 returns (server, thread): the port a port of 0 was given
    return host, int(started[0].server_port) if started else port
