"""``ckptfs diff A B``: what differs between two checkpoints, or a checkpoint and a manifest.

Tensors are paired by name (a repeated name pairs in file order). For each pair: another shape or storage
type, another stored size, other stored bytes (sha256; a checkpoint side is hashed as ``ckptfs manifest``
does, a manifest side is read), and with ``values=True`` the largest absolute and relative difference of
the dequantized values of every pair that is not byte-identical and has the same shape (the comparison
users make between two quantizations of one model). A manifest records no shapes, types or values, so
against a manifest only sizes and bytes are compared.

Files are compared by their headers too (``header_sha256``: the metadata and tensor infos before the first
tensor), paired by name (two one-file sides whatever their names): a changed metadata value with every
tensor's bytes intact is a difference. A manifest written before that field existed compares no header and
says so once.

The relative difference of two values is ``|a - b| / max(|a|, |b|)`` (0 where both are 0), so it is
symmetric and bounded by 2 for finite values; a NaN on either side makes both figures NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckptfs.integrity.manifest import (Manifest, Progress, build_manifest, is_manifest, load_manifest,
                                       warn_without_header_hashes)
from ckptfs.integrity.verify import _by_occurrence, cut_short

#: Decoded elements compared at a time (bounds memory for huge tensors).
VALUE_WINDOW = 1 << 22


@dataclass
class Change:
    name: str
    what: list[str]                      # "shape", "type", "size", "bytes", "truncated"
    detail: list[str]
    max_abs: float | None = None
    max_rel: float | None = None

    def line(self) -> str:
        text = f"{self.name!r}: " + "; ".join(self.detail)
        if self.max_abs is not None:
            text += f"; values: max abs {_num(self.max_abs)}, max rel {_num(self.max_rel)}"
        return text


@dataclass(frozen=True)
class HeaderChange:
    """A file whose header (metadata, tensor infos) differs between the sides: its name and both sha256s;
    ``whole``: a file without tensors (a folder's config or tokenizer file), whose header is all of it."""

    file: str
    a: str
    b: str
    whole: bool = False

    def line(self) -> str:
        if self.whole:
            return f"{self.file!r} differs (sha256 {self.a[:12]}... -> {self.b[:12]}...)"
        return (f"header of {self.file!r} differs (metadata or tensor infos; sha256 {self.a[:12]}... -> "
                f"{self.b[:12]}...)")


@dataclass
class Difference:
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)
    same: int = 0
    headers: list[HeaderChange] = field(default_factory=list)

    @property
    def differs(self) -> bool:
        return bool(self.only_a or self.only_b or self.changed or self.headers)

    def lines(self) -> list[str]:
        out = [f"only in A: {n!r}" for n in self.only_a] + [f"only in B: {n!r}" for n in self.only_b]
        out += [c.line() for c in self.changed]
        out += [h.line() for h in self.headers]
        same = f"{self.same} tensor" + ("" if self.same == 1 else "s")
        out.append(f"{same} identical, {len(self.changed)} changed, {len(self.only_a)} only in A, "
                   f"{len(self.only_b)} only in B")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"only_in_a": self.only_a, "only_in_b": self.only_b, "same": self.same,
                "changed": [{"name": c.name, "what": c.what, "detail": c.detail,
                             "max_abs": _json_num(c.max_abs), "max_rel": _json_num(c.max_rel)} for c in self.changed],
                "headers": [{"file": h.file, "a": h.a, "b": h.b} for h in self.headers]}


@dataclass
class _Side:
    """One side of a diff: a manifest's entries, plus the opened checkpoint where it is one."""

    manifest: Manifest
    checkpoint: Any = None
    _by_key: dict | None = None

    def file_size(self, name: str) -> int:
        return next((f.size for f in self.manifest.files if f.name == name), 0)

    def tensors(self) -> dict[tuple[str, int], Any]:
        return _by_occurrence(self.manifest.tensors)

    def info(self, key: tuple[str, int]):
        """The checkpoint's Tensor for a (name, occurrence) key, or None for a manifest side."""
        if self.checkpoint is None:
            return None
        if self._by_key is None:
            seen: dict[str, int] = {}
            self._by_key = {}
            order = {path: i for i, path in enumerate(self.checkpoint.files)}
            # the manifest's order (file, offset), so that a repeated name pairs with the same occurrence
            for t in sorted(self.checkpoint.tensors, key=lambda t: (order[t.info.source], t.info.offset)):
                k = seen.get(t.name, 0)
                seen[t.name] = k + 1
                self._by_key[(t.name, k)] = t
        return self._by_key.get(key)


def open_side(src: str, progress: Progress | None = None) -> _Side:
    """A manifest file as it is, or a checkpoint opened and hashed."""
    if is_manifest(src):
        manifest = load_manifest(src)
        warn_without_header_hashes(manifest, src)
        return _Side(manifest)
    from ckptfs.checkpoint.api import open as open_checkpoint

    ck = open_checkpoint(src)
    try:
        return _Side(build_manifest(ck, progress=progress, short=True), ck)
    except BaseException:
        ck.close()
        raise


def header_changes(a: Manifest, b: Manifest) -> list[HeaderChange]:
    """The files whose headers differ, paired by name (two one-file sides: whatever their names, as a
    one-file manifest matches its file renamed); a file without ``header_sha256`` on either side is skipped."""
    if len(a.files) == 1 and len(b.files) == 1:
        pairs = [(a.files[0], b.files[0])]
    else:
        theirs = {f.name: f for f in b.files}
        pairs = [(f, theirs[f.name]) for f in a.files if f.name in theirs]
    holding = {t.file for t in a.tensors}
    return [HeaderChange(fa.name, fa.header_sha256, fb.header_sha256, whole=fa.name not in holding)
            for fa, fb in pairs
            if fa.header_sha256 is not None and fb.header_sha256 is not None and fa.header_sha256 != fb.header_sha256]


def diff(a: _Side, b: _Side, *, values: bool = False, on_tensor: Callable[[], None] | None = None) -> Difference:
    result = Difference(headers=header_changes(a.manifest, b.manifest))
    ta, tb = a.tensors(), b.tensors()
    result.only_a = [name for (name, _) in ta if (name, _) not in tb]
    result.only_b = [name for (name, _) in tb if (name, _) not in ta]
    for key, ea in ta.items():
        eb = tb.get(key)
        if eb is None:
            continue
        ia, ib = a.info(key), b.info(key)
        what, detail = [], []
        if ia is not None and ib is not None:
            if ia.shape != ib.shape:
                what.append("shape")
                detail.append(f"shape {list(ia.shape)} -> {list(ib.shape)}")
            if ia.storage_type != ib.storage_type:
                what.append("type")
                detail.append(f"type {ia.storage_type} -> {ib.storage_type}")
        if ea.stored_nbytes != eb.stored_nbytes:
            what.append("size")
            detail.append(f"stored size {ea.stored_nbytes} -> {eb.stored_nbytes} bytes")
        short = [(side, e) for side, e in (("A", ea), ("B", eb)) if e.present is not None]
        for side, e in short:  # a truncated copy: its hashes cover only the bytes there are
            what.append("truncated")
            detail.append(f"{side}: {cut_short(e, (a if side == 'A' else b).file_size(e.file))}")
        if ea.sha256 != eb.sha256 and not short:
            what.append("bytes")
            detail.append(f"stored bytes differ (sha256 {ea.sha256[:12]}... -> {eb.sha256[:12]}...)")
        if not what:
            result.same += 1
            continue
        change = Change(key[0], what, detail)
        if values and ia is not None and ib is not None and ia.shape == ib.shape:
            if short:
                change.detail.append("values not compared: " + " and ".join(side for side, _ in short) +
                                     (" is" if len(short) == 1 else " are") + " truncated")
            elif ia.decodable and ib.decodable:
                change.max_abs, change.max_rel = value_difference(ia, ib)
            else:
                change.detail.append("values not compared: " + ("A" if not ia.decodable else "B") + " is raw-only")
        result.changed.append(change)
        if on_tensor is not None:
            on_tensor()
    return result


def value_difference(ta, tb) -> tuple[float, float]:
    """Largest absolute and relative difference of two same-shape tensors' decoded values, window by window."""
    max_abs = max_rel = 0.0
    n = ta.size
    for e0 in range(0, n, VALUE_WINDOW):
        e1 = min(n, e0 + VALUE_WINDOW)
        va = np.asarray(ta.data.read(e0, e1, use_cache=False), dtype=np.float64)
        vb = np.asarray(tb.data.read(e0, e1, use_cache=False), dtype=np.float64)
        delta = np.abs(va - vb)
        scale = np.maximum(np.abs(va), np.abs(vb))
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.where(scale > 0, delta / np.where(scale > 0, scale, 1.0), 0.0)
        if delta.size:
            if np.isnan(delta).any():
                return math.nan, math.nan
            max_abs = max(max_abs, float(delta.max()))
            max_rel = max(max_rel, float(rel.max()))
    return max_abs, max_rel


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.6g}"


def _json_num(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
