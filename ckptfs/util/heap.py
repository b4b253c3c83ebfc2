"""The C heap of a short-lived process that moves a lot of bytes: freed memory kept for reuse.

Every body a fetch reads arrives in a new buffer of up to 256 KiB (``http._read_parts``), freed once its
chunk is stored. glibc returns such blocks to the system when they are freed (``mmap``'d past its
adaptive threshold, or trimmed off the heap's top), so the next buffer is fresh memory again, each of its
pages a fault to zero: tens of thousands in a ``ckptfs prefetch`` of a few hundred MiB. ``keep_freed_memory`` makes
glibc keep what is freed for the next allocation (``mallopt``: blocks up to 32 MiB from the heap, no
trimming), which shortens such a run by those faults. The process's peak memory is
the same — the fetch budget bounds what is in flight — but it is not handed back before the process ends,
so only a command that ends when its transfer does (``ckptfs prefetch``) asks for it, never a mount. A C
library without ``mallopt`` (musl) is left as it is.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's largest (64-bit): blocks below it come from the heap
NEVER_TRIM = (1 << 31) - 1


def keep_freed_memory() -> bool:
    """Ask the C library to keep freed memory for reuse (see the module docstring); False where it cannot."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
