"""Cache keys: typed values whose text form is derived from their parts, never parsed back.

A key names decoded (or fetched) elements ``[start, stop)`` of one stored thing in one served form:

- ``content_id``: the content identity of the bytes it is computed from (``ckptfs.sources.identity``), so a
  tier shared by processes or machines never serves one file's (or one version's) values for another;
- ``offset``: where in those bytes the thing is stored (a tensor's data offset; 0 where the identity
  already names the thing, as a packed layer's parts do);
- ``kind``: what was computed: a storage type (``Q4_K``), ``packed:gptq``, ``bytes`` for fetched chunks;
- ``form``: the served form: a dtype (``<f4``), plus whatever else fixes the values' layout;
- ``start``/``stop``: the block (or row, tile, chunk) range.

A ``CacheKey`` is a ``str`` whose value is that text, so every tier stores it as it is (a dict key in
memory, a file name digest on disk, a Redis key); code that needs a part reads the attribute, and code that
needs the keys that follow one (a sequential reader's batched lookups) asks :meth:`CacheKey.following`.
"""

from __future__ import annotations

from typing import Any

class CacheKey(str):
    """See the module docstring. Frozen; equal to (and hashed as) its text. Its parts are kept as one tuple
    (a key is made for every chunk and group looked up: one assignment costs less than six)."""

    content_id = property(lambda self: self._parts[0], doc="the content identity of the bytes")
    offset = property(lambda self: self._parts[1], doc="where in those bytes the thing is stored")
    kind = property(lambda self: self._parts[2], doc="what was computed (a storage type, ``bytes``)")
    form = property(lambda self: self._parts[3], doc="the served form (a dtype, ``raw``)")
    start = property(lambda self: self._parts[4], doc="the first block (row, chunk) of the range")
    stop = property(lambda self: self._parts[5], doc="the end of the range")

    def __new__(cls, content_id: str, offset: int, kind: str, form: str, start: int, stop: int) -> CacheKey:
        offset, start, stop = int(offset), int(start), int(stop)
        key = str.__new__(cls, f"{content_id}|{offset}|{kind}|{form}|{start}-{stop}")
        key.__dict__["_parts"] = (content_id, offset, kind, form, start, stop)
        return key

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a CacheKey is frozen")

    def __reduce__(self) -> tuple[Any, ...]:
        return (CacheKey, (self.content_id, self.offset, self.kind, self.form, self.start, self.stop))

    def with_range(self, start: int, stop: int) -> CacheKey:
        """The key of the same thing's range ``[start, stop)``."""
        return CacheKey(self.content_id, self.offset, self.kind, self.form, start, stop)

    def following(self, n: int) -> list[CacheKey]:
        """The keys of the ``n`` ranges after this one, of the same width (a tensor's last group may be cut
        shorter: its guessed key then simply finds nothing)."""
        width = self.stop - self.start
        if width <= 0:
            return []
        return [self.with_range(self.stop + i * width, self.stop + (i + 1) * width) for i in range(n)]


def group_key(content_id: str, offset: int, storage_type: str, dtype: str, b0: int, b1: int) -> CacheKey:
    """The key of decoded blocks [b0, b1) of the tensor stored at ``offset`` of the file ``content_id``.

    The block range names the decoded blocks themselves: tensors sharing a data offset (deduplicated data)
    share their groups, but a shorter tensor's last group, cut at its end, is not the longer one's.
    """
    return CacheKey(content_id, offset, storage_type, dtype, b0, b1)
