"""The daemon's own counters: what ``user.ckptfs.stats`` and the Prometheus exporter report.

Standard library only, so a mount without ``--metrics`` pays for nothing it does not use:

- ``Histogram``: fixed buckets, one ``bisect`` and two additions per observation into a store of the
  observing thread (no lock), kept per label value; the exporter merges the stores at scrape time. Used only
  for what must be observed per event: FUSE request seconds per operation and decode seconds per storage
  type.
- ``LabelledCounter``: exact integer counters per label value (bytes returned to readers per file kind,
  errors per operation and errno), per thread in the same way: exact under FUSE's many threads.
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
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from ckptfs.checkpoint.api import Checkpoint, Tensor
    from ckptfs.quant import Codec

#: Seconds. From 5 µs (a cached 4 KiB read; a small exact-type decode) to 60 s (a remote read retried
#: until its timeout), roughly x2.5 per step, so p50/p99 resolve at both ends.
_get_ident = threading.get_ident
_bisect = bisect.bisect_left

LATENCY_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _PerThread:
    """One store per thread, written only by its thread: counting needs no lock (a ``+=`` on shared data
    would lose updates between threads; a lock would cost more than the counting). Readers merge the stores;
    ``list(d.items())`` copies a dict in one step under the GIL, so a reader never sees it mid-change.

    Stores are keyed by thread id: an id is reused only after its thread ended, so each store still has a
    single writer, and their number stays bounded by the threads alive at once (libfuse's pool)."""

    def __init__(self) -> None:
        self.stores: dict[int, dict[Any, Any]] = {}
        self._lock = threading.Lock()

    def mine(self) -> dict[Any, Any]:
        """This thread's store (callers on the hot path look it up in ``stores`` themselves first)."""
        store = self.stores.get(_get_ident())
        if store is None:
            with self._lock:
                store = self.stores.setdefault(_get_ident(), {})
        return store

    def all_items(self) -> list[list[tuple[Any, Any]]]:
        with self._lock:
            stores = list(self.stores.values())
        return [list(store.items()) for store in stores]


class Histogram:
    """Observations per label value into fixed buckets (upper bounds; the last bucket is +Inf)."""

    def __init__(self, buckets: Iterable[float] = LATENCY_BUCKETS):
        self.buckets = tuple(sorted(buckets))
        self._threads = _PerThread()
        self._stores = self._threads.stores

    def observe(self, label: str, seconds: float) -> None:
        store = self._stores.get(_get_ident()) or self._threads.mine()
        series = store.get(label)
        if series is None:
            series = store[label] = [0] * (len(self.buckets) + 1) + [0.0]  # bucket counts, then the sum
        series[_bisect(self.buckets, seconds)] += 1
        series[-1] += seconds

    def snapshot(self) -> dict[str, tuple[list[int], float]]:
        """label -> (cumulative counts per bucket, +Inf last; sum): Prometheus' histogram shape."""
        merged: dict[str, list[Any]] = {}
        for items in self._threads.all_items():
            for label, series in items:
                series = list(series)
                total = merged.setdefault(label, [0] * len(series))
                for i, v in enumerate(series):
                    total[i] += v
        out = {}
        for label, series in merged.items():
            running, cumulative = 0, []
            for c in series[:-1]:
                running += c
                cumulative.append(running)
            out[label] = (cumulative, series[-1])
        return out


class LabelledCounter:
    """Exact integer counters keyed by a label value (or a tuple of them), one store per thread."""

    def __init__(self) -> None:
        self._threads = _PerThread()
        self._stores = self._threads.stores

    def add(self, key: Any, amount: int = 1) -> None:
        store = self._stores.get(_get_ident()) or self._threads.mine()
        store[key] = store.get(key, 0) + amount

    def snapshot(self) -> dict[Any, int]:
        merged: dict[Any, int] = {}
        for items in self._threads.all_items():
            for key, n in items:
                merged[key] = merged.get(key, 0) + n
        return merged

    def total(self) -> int:
        return sum(self.snapshot().values())


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
    """A codec that reports each ``dequantize`` / ``dequantize_into`` to ``DecodeCounters``; every other
    attribute is the codec's.

    The block engine calls one of them once per decoded block group, so this costs one clock read and one
    locked addition per group. Exact types served straight from the source never call it: nothing is
    decoded for them, and nothing is counted."""

    def __init__(self, codec: Any, counters: DecodeCounters):
        self._codec = codec
        self._counters = counters
        self._label = str(codec.name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._codec, name)

    def dequantize(self, blocks: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = self._codec.dequantize(blocks, *args, **kwargs)
        self._record(out.nbytes, time.perf_counter() - start)
        return out

    def dequantize_into(self, blocks: Any, out: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = self._codec.dequantize_into(blocks, out, *args, **kwargs)
        self._record(result.nbytes, time.perf_counter() - start)
        return result

    def _record(self, nbytes: int, seconds: float) -> None:
        counters = self._counters
        counters.bytes.add(self._label, nbytes)
        if counters.histogram is not None:
            counters.histogram.observe(self._label, seconds)


def instrument_decoding(checkpoint: Checkpoint, counters: DecodeCounters) -> None:
    """Route every tensor's decoding through ``counters`` (before any read: the block engine takes the
    tensor's codec when it first builds the tensor's data)."""
    wrapped: dict[int, TimedCodec] = {}

    def wrap(tensor: Tensor) -> None:
        codec = tensor.codec
        if codec is None or tensor.data_made:  # a packed view has no codec: its layout decodes
            return
        proxy = wrapped.get(id(codec))
        if proxy is None:
            proxy = wrapped[id(codec)] = counters.wrap(codec)
        tensor.codec = cast("Codec", proxy)  # it stands in for the codec: every attribute delegated

    checkpoint.tensors.on_made(wrap)  # each Tensor as it is made: a mount of 94k tensors makes few

class MountCounters:
    """What a mount counts: errors and decoded bytes always; with ``timed`` (``--metrics``) also request
    seconds per FUSE operation, decode seconds per storage type and bytes returned per file kind."""

    def __init__(self, timed: bool = False):
        self.timed = timed
        self.request_seconds = Histogram() if timed else None
        self.errors = LabelledCounter()      # (op, errno number) -> n
        self.read_bytes = LabelledCounter()  # file kind -> bytes returned to readers
        self.short_replies = LabelledCounter()  # replies refused as short before the end of the file (0)
        self.decode = DecodeCounters(Histogram() if timed else None)
