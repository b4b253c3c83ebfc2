"""gguf-py's ``GGUFWriter`` with its metadata arrays packed at once: the same bytes as its per-item packing
(one ``struct.pack`` call per value, recursively), which takes seconds for a 262,144-token vocabulary and its
scores, types and merges — time a mount spends before it answers."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import gguf


def new_writer(arch: str):
    """A writer for ``arch`` whose arrays of strings and little-endian numbers are packed in bulk."""
    return _BulkArrayWriter(path=None, arch=arch)


class _BulkArrayWriter(gguf.GGUFWriter):
    def _pack_val(self, val: Any, vtype, add_vtype: bool, sub_type=None) -> bytes:
        kind = gguf.GGUFValueType
        if (vtype != kind.ARRAY or self.endianess != gguf.GGUFEndian.LITTLE or not isinstance(val, Sequence)
                or isinstance(val, (bytes, str)) or len(val) == 0):
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        ltype = sub_type
        if ltype is None:
            ltype = kind.get_type(val[0])
            # get_type answers by an item's class: items of one class need no call each
            if len(set(map(type, val))) > 1 and not all(kind.get_type(item) is ltype for item in val[1:]):
                raise ValueError("All items in a GGUF array should be of the same type")
        head = (struct.pack("<I", vtype) if add_vtype else b"") + struct.pack("<IQ", ltype, len(val))
        if ltype == kind.STRING:
            encoded = [item.encode("utf-8") if isinstance(item, str) else item for item in val]
            lengths = struct.pack(f"<{len(encoded)}Q", *map(len, encoded))
            body = b"".join(lengths[8 * i: 8 * i + 8] + item for i, item in enumerate(encoded))
            return head + body
        fmt = self._simple_value_packing.get(ltype)
        if fmt is None or ltype == kind.BOOL:
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        return head + struct.pack(f"<{len(val)}{fmt}", *val)
