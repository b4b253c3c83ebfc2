"""A real mount's ``--metrics`` endpoint, read the way Prometheus reads it (prometheus_client's own text parser):
``scrape(mnt)`` gives every sample keyed by (sample name, sorted labels), ``value`` one sample (0 when absent,
as a counter that has not moved yet is)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from conftest import mount_stats


def scrape(mnt: Path) -> dict[tuple[str, tuple], float]:
    """Every sample of the mount's /metrics, keyed by (sample name, sorted labels)."""
    from prometheus_client import parser

    with urllib.request.urlopen(f"http://{mount_stats(mnt)['metrics']}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
