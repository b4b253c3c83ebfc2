"""The daemon's own counters: what ``user.ckptfs.stats`` and the Prometheus exporter report.

Standard library only, so a mount without ``--metrics`` pays for nothing it does not use:

- ``Histogram``: fixed buckets, one lock, one ``bisect`` per observation (about a microsecond), kept per label
  value; the exporter reads them at scrape time. Used only for what must be observed per event: FUSE request
  seconds per operation and decode seconds per storage type.
- ``LabelledCounter``: exact integer counters per label value (bytes returned to readers per file kind,
  errors per operation and errno). Exact under FUSE's many threads: a ``+=`` on a shared dict is not atomic.
- ``TimedCodec``: wraps a codec so each ``dequantize`` counts its output bytes (``decoded_bytes`` in the
  stats, always on: one clock read and one addition per decoded block group of about 256 KiB) and, when a
  histogram is given, its duration.

Everything else the exporter shows (cache tiers, source counters, page faults) is read from the objects
that already keep it, when scraped, so reads pay nothing for it.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterable
from typing import Any

#: Seconds. From 5 µs (a cached 4 KiB read; a small exact-type decode) to 60 s (a remote read retried
#: until its timeout), roughly x2.5 per step, so p50/p99 resolve at both ends.
LATENCY_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _Series:
    __slots__ = ("counts", "sum")

    def __init__(self, n: int):
        self.counts = [0] * n
        self.sum = 0.0


class Histogram:
    """Observations per label value into fixed buckets (upper bounds; the last bucket is +Inf)."""

    def __init__(self, buckets: Iterable[float] = LATENCY_BUCKETS):
        self.buckets = tuple(sorted(buckets))
        self._series: dict[str, _Series] = {}
        self._lock = threading.Lock()

    def observe(self, label: str, seconds: float) -> None:
        i = bisect.bisect_left(self.buckets, seconds)
        with self._lock:
            series = self._series.get(label)
            if series is None:
                series = self._series[label] = _Series(len(self.buckets) + 1)
            series.counts[i] += 1
            series.sum += seconds

    def snapshot(self) -> dict[str, tuple[list[int], float]]:
        """label -> (cumulative counts per bucket, +Inf last; sum): Prometheus' histogram shape."""
        with self._lock:
            raw = {label: (list(s.counts), s.sum) for label, s in self._series.items()}
        out = {}
        for label, (counts, total) in raw.items():
            running, cumulative = 0, []
            for c in counts:
                running += c
                cumulative.append(running)
            out[label] = (cumulative, total)
        return out


class LabelledCounter:
    """Exact integer counters keyed by a label value (or a tuple of them)."""

    def __init__(self) -> None:
        self._values: dict[Any, int] = {}
        self._lock = threading.Lock()

    def add(self, key: Any, amount: int = 1) -> None:
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def snapshot(self) -> dict[Any, int]:
        with self._lock:
            return dict(self._values)

    def total(self) -> int:
        with self._lock:
            return sum(self._values.values())


class DecodeCounters:
    """Codec output per storage type: bytes always, durations when ``histogram`` is set (``--metrics``)."""

    def __init__(self, histogram: Histogram | None = None):
        self.bytes = LabelledCounter()
        self.histogram = histogram

    def wrap(self, codec: Any) -> TimedCodec:
        return codec if isinstance(codec, TimedCodec) else TimedCodec(codec, self)

    def total_bytes(self) -> int:
        return self.bytes.total()


class TimedCodec:
    """A codec that reports each ``dequantize`` to ``DecodeCounters``; every other attribute is the codec's.

    The block engine calls ``dequantize`` once per decoded block group, so this costs one clock read and one
    locked addition per group. Exact types served straight from the source never call it: nothing is
    decoded for them, and nothing is counted."""

    def __init__(self, codec: Any, counters: DecodeCounters):
        self._codec = codec
        self._counters = counters
        self._label = str(codec.name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._codec, name)

    def dequantize(self, blocks: Any) -> Any:
        start = time.perf_counter()
        out = self._codec.dequantize(blocks)
        elapsed = time.perf_counter() - start
        counters = self._counters
        counters.bytes.add(self._label, out.nbytes)
        if counters.histogram is not None:
            counters.histogram.observe(self._label, elapsed)
        return out


def instrument_decoding(checkpoint: Any, counters: DecodeCounters) -> None:
    """Route every tensor's decoding through ``counters`` (before any read: the block engine takes the
    tensor's codec when it first builds the tensor's data)."""
    wrapped: dict[int, TimedCodec] = {}
    for tensor in checkpoint.tensors:
        codec = getattr(tensor, "codec", None)
        if codec is None or getattr(tensor, "_data", None) is not None:
            continue
        proxy = wrapped.get(id(codec))
        if proxy is None:
            proxy = wrapped[id(codec)] = counters.wrap(codec)
        tensor.codec = proxy


class MountCounters:
    """What a mount counts: errors and decoded bytes always; with ``timed`` (``--metrics``) also request
    seconds per FUSE operation, decode seconds per storage type and bytes returned per file kind."""

    def __init__(self, timed: bool = False):
        self.timed = timed
        self.request_seconds = Histogram() if timed else None
        self.errors = LabelledCounter()      # (op, errno number) -> n
        self.read_bytes = LabelledCounter()  # file kind -> bytes returned to readers
        self.decode = DecodeCounters(Histogram() if timed else None)
