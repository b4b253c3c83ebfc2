"""The tensor warm-up (``ckptfs prefetch``): walk tensors group by group through the tiered cache so that the
shared tiers hold them before the first mount asks.

Each decoded group goes through the same ``TieredCache.get_or_load`` a mount uses, so the entries land
under the same keys (content identity, storage type, output dtype, block range) a mount with the same
``--dtype`` looks up. A group a lower tier already holds is found there and not decoded again. Tensors whose
stored bytes are the served values (F32 served as F32) have no decoded groups; their bytes are read once,
which warms the remote byte cache (``--cache-dir``) for remote sources and the page cache for local files.

The walk is handed the checkpoint and its tensors: what it needs of them is declared here (:class:`Warmed`,
:class:`WarmTensor`, :class:`WarmValues`, which ``ckptfs.checkpoint.api.Checkpoint``, ``Tensor`` and
``ckptfs.engine.values.TensorValues`` answer), so it imports neither the checkpoint nor the engine.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.core.errors import CheckpointError
from ckptfs.util.sizes import format_size

READ_STEP_BYTES = 16 << 20


class WarmValues(Protocol):
    """What the walk asks of a tensor's values (``ckptfs.engine.values.TensorValues``): their geometry, whether
    they are the stored bytes, how many leading blocks are there, and reading or decoding a group of them."""

    @property
    def info(self) -> TensorInfo: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    @property
    def direct(self) -> bool: ...

    @property
    def group_blocks(self) -> int: ...

    @property
    def n_blocks(self) -> int: ...

    @property
    def n_elements(self) -> int: ...

    def available_blocks(self) -> int: ...

    def read(self, e0: int, e1: int) -> object: ...

    def decode_group(self, g: int) -> None: ...


class WarmTensor(Protocol):
    """What the walk asks of a tensor (``ckptfs.checkpoint.api.Tensor``)."""

    @property
    def name(self) -> str: ...

    @property
    def decodable(self) -> bool: ...

    @property
    def nbytes(self) -> int | None: ...

    @property
    def data(self) -> WarmValues: ...


class WarmCache(Protocol):
    """What the walk asks of a checkpoint's tiered cache (``ckptfs.cache.tiered.TieredCache``): its decoded
    bytes so far, its background writers flushed, its tiers' counters."""

    @property
    def decoded_bytes(self) -> int: ...

    def flush(self) -> None: ...

    def tier_stats(self) -> dict[str, dict[str, Any]]: ...


class Warmed(Protocol):
    """What the walk asks of the checkpoint (``ckptfs.checkpoint.api.Checkpoint``): its cache."""

    @property
    def cache(self) -> WarmCache: ...


@dataclass
class WarmReport:
    tensors: int = 0
    skipped: int = 0
    served_bytes: int = 0
    decoded_bytes: int = 0
    failures: list[str] = field(default_factory=list)
    tiers: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def tier_errors(self) -> dict[str, int]:
        return {name: int(s.get("errors", 0)) for name, s in self.tiers.items() if s.get("errors")}

    @property
    def ok(self) -> bool:
        return not self.failures and not self.tier_errors

    def summary(self) -> str:
        parts = [f"prefetched {self.tensors} tensors ({format_size(self.served_bytes)}), "
                 f"decoded {format_size(self.decoded_bytes)}"]
        for name, s in self.tiers.items():
            if name != "memory":
                parts.append(f"{name}: {s.get('stored', 0)} entries stored, {s.get('hits', 0)} found"
                             + (f", {s['forged']} forged entries refused (decoded again)" if s.get("forged") else ""))
        if self.skipped:
            parts.append(f"{self.skipped} tensors not decodable (skipped)")
        if self.tier_errors:
            parts.append("tier errors: " + ", ".join(f"{k} {v}" for k, v in self.tier_errors.items())
                         + " (see the log above)")
        if self.failures:
            parts.append(f"{len(self.failures)} tensors failed: " + "; ".join(self.failures[:3]))
        return "; ".join(parts)


def warm(checkpoint: Warmed, tensors: Sequence[WarmTensor], progress: bool = False) -> WarmReport:
    """Decode ``tensors`` of ``checkpoint`` group by group into its cache tiers (their values, or for a type
    served as stored, their bytes read once); what was done, and what failed, in the report."""
    report = WarmReport()
    todo = [t for t in tensors if t.decodable]
    report.skipped = len(tensors) - len(todo)
    total = sum(t.nbytes or 0 for t in todo)  # every decodable tensor has a served size
    cache = checkpoint.cache
    decoded_before = cache.decoded_bytes
    bar = _progress(total) if progress else None
    try:
        for tensor in todo:
            try:
                report.served_bytes += _warm_tensor(tensor.data, bar)
                report.tensors += 1
            except CheckpointError as exc:
                report.failures.append(f"{tensor.name}: {exc}")
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    cache.flush()  # the background writers: everything decoded is stored before the report (and exit)
    report.decoded_bytes = cache.decoded_bytes - decoded_before
    report.tiers = cache.tier_stats()
    return report


def _warm_tensor(data: WarmValues, bar: Any) -> int:
    item = data.dtype.itemsize
    if data.direct:
        step = max(1, READ_STEP_BYTES // item)
        end = data.available_blocks() * data.info.block_elements
        for e0 in range(0, end, step):
            data.read(e0, min(e0 + step, end))
            _advance(bar, (min(e0 + step, end) - e0) * item)
        return end * item
    group_elements = data.group_blocks * data.info.block_elements
    n_groups = -(-data.available_blocks() // data.group_blocks)
    for g in range(n_groups):
        data.decode_group(g)
        _advance(bar, min(group_elements, data.n_elements - g * group_elements) * item)
    if data.available_blocks() < data.n_blocks:
        data.read(0, data.n_elements)  # raises the CheckpointError naming the missing bytes
    return data.n_elements * item


def _progress(total: int) -> Any:
    import click

    bar: Any = click.progressbar(length=total, label="prefetch", file=sys.stderr, show_percent=True, width=30)
    return bar.__enter__()


def _advance(bar: Any, n: int) -> None:
    if bar is not None:
        bar.update(n)
