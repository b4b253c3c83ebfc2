"""Rules both readers apply the same way: damage reasons, raw-only extents, and the error boundary.

Damage is described in one line so that ``ckptfs info``, ``NAME.meta.json`` and error messages can quote
it verbatim; the wording is shared here so that a GGUF and a safetensors file truncated at the same place
say the same thing.
"""

from __future__ import annotations

import functools
import os
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ckptfs.core.errors import CheckpointError

#: ggml stores element counts and byte sizes in int64: anything larger cannot come from a real writer.
INT64_MAX = (1 << 63) - 1

R = TypeVar("R")


def truncation_reason(start: int, end: int, file_size: int) -> str | None:
    """The damage line for a tensor stored in ``[start, end)``, or None if the file holds all of it."""
    if end <= file_size or end == start:
        return None
    return f"truncated: needs bytes {start}..{end}, file has {file_size}"


def join_reasons(*reasons: str | None) -> str | None:
    """Several damage reasons as one line (None when there are none)."""
    present = [r for r in reasons if r]
    return "; ".join(present) if present else None


def raw_extent(offset: int, sorted_offsets: Sequence[int], file_size: int) -> int:
    """Bytes a tensor of unknown layout owns: up to the next tensor's start, or the end of the file.

    Used when the element size is unknown, so the stored size cannot be computed; whatever lies between this
    tensor and the next one is served, which includes any alignment padding (there is no way to tell).
    ``sorted_offsets`` are the absolute offsets of all tensors of the file, ascending.
    """
    i = bisect_right(sorted_offsets, offset)
    end = sorted_offsets[i] if i < len(sorted_offsets) else file_size
    return max(0, min(end, file_size) - offset)


def only_checkpoint_errors(reader: Callable[..., R]) -> Callable[..., R]:
    """Let nothing but ``CheckpointError`` escape a reader.

    Hostile headers are meant to be caught by explicit checks, but a reader is the boundary between
    untrusted bytes and the rest of ckptfs (a FUSE daemon must not die on a surprise ``struct.error``,
    ``MemoryError`` or ``RecursionError``), so anything that slips through is reported as a refusal of the
    file rather than a crash.
    """

    @functools.wraps(reader)
    def wrapper(path: str, *args: Any, **kwargs: Any) -> R:  # the path, then the reader's own (an Opener)
        path = os.fspath(path)
        try:
            return reader(path, *args, **kwargs)
        except CheckpointError:
            raise
        except Exception as exc:  # the point is to convert everything
            raise CheckpointError(path, None, f"unreadable header ({type(exc).__name__}: {exc})") from exc

    return wrapper
