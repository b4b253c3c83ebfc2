"""Human sizes for command-line options: 64M = 64 MiB (binary units, as docs/interfaces.md fixes).

Units are K, M, G, T, P, E (powers of 1024), optionally followed by ``iB`` (``64MiB``), or ``B`` alone for
bytes. ``64MB`` is refused rather than guessed: people write it meaning both 64 * 10**6 and 64 * 2**20.
A size must fit a 64-bit file offset (below 8 EiB), so every accepted value is one the rest of the code can
use; fractions (``1.5G``) are exact, then rounded down to a whole byte.
"""

from __future__ import annotations

import re
from fractions import Fraction

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([KMGTPE]?)(I?B)?\s*$", re.IGNORECASE)
MAX_SIZE = (1 << 63) - 1


def parse_size(text: str) -> int:
    """Bytes in ``text`` ("512M", "2G", "1.5G", "4096", "64MiB"); ValueError (one line) if it is not a size."""
    text = str(text)
    match = _PATTERN.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 64M, 2G: binary units)")
    number, unit, suffix = match.groups()
    if unit and suffix and suffix.upper() == "B":
        raise ValueError(f"ambiguous size {text!r}: write {number}{unit.upper()} or {number}{unit.upper()}iB "
                         f"(binary units: 1{unit.upper()} = {_UNITS[unit.upper()]} bytes)")
    if not unit and suffix and suffix.upper() == "IB":
        raise ValueError(f"not a size: {text!r} (use e.g. 64M, 2G: binary units)")
    size = int(Fraction(number) * _UNITS[unit.upper()])
    if size > MAX_SIZE:
        raise ValueError(f"size {text!r} is too large (at most {MAX_SIZE} bytes, just under 8E)")
    return size


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
