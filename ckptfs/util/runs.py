"""Sorted numbers as runs of consecutive ones: the unit of one request, one write, one lock."""

from __future__ import annotations

from collections.abc import Iterable


def runs(indexes: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted ``indexes`` as contiguous ``[start, stop)`` runs."""
    out: list[tuple[int, int]] = []
    for i in indexes:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out
