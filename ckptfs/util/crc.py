"""The process's crc32: ISA-L's (the optional ``isal`` package, the ``integrity`` extra: carry-less
multiplication, several times zlib's speed) when it is installed, else zlib's. Both give
the same values and release the GIL, so entries written with one are read with the other.

Every checksum of payload bytes goes through :func:`crc32`: the cache entries' payload crc (a warm-up
checksums every byte it stores, a visible share of ``ckptfs prefetch``'s CPU with zlib's), manifests and checked
reads. ISA-L is imported at the first call, not with this module: a command that checksums nothing (a local
mount without a store) does not pay its import.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


@functools.cache
def _implementation() -> Callable[[ReadableBuffer, int], int]:
    try:
        from isal.isal_zlib import crc32 as isal_crc32
    except ImportError:  # the optional speed-up is not installed: zlib's own, same values
        return zlib.crc32
    isal: Callable[[ReadableBuffer, int], int] = isal_crc32  # zlib's signature (untyped where isal is absent)
    return isal


def crc32(data: ReadableBuffer, value: int = 0) -> int:
    """``zlib.crc32(data, value)`` (unsigned), computed by the fastest implementation installed."""
    return _implementation()(data, value)
