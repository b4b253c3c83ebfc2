"""Human sizes for command-line options: 64M = 64 MiB (binary units, as CONTRACT.md fixes)."""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``text`` ("512M", "2G", "1.5G", "4096", "64MiB"); ValueError if it is not a size."""
    match = _PATTERN.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 64M, 2G)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.upper()])


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
