"""``ckptfs info``: a summary of a checkpoint without decoding any tensor data.

The text form is one line per item: control characters in names and values are escaped (``oneline``). File
names are shown as ``public_name`` shows them (no user info, no query: they are credentials).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.tree.registry import describe
from ckptfs.util.jsonutil import to_jsonable
from ckptfs.util.oneline import one_line
from ckptfs.util.redact import public_name, redact
from ckptfs.util.sizes import format_size

BIG_ARRAY = 16
#: Names a text listing shows before "... and N more" (a folder of 50,000 files is not one 650 KB line).
LISTED_NAMES = 20


def _summarize(value: Any) -> Any:
    """Big arrays (tokenizer vocabularies) as a one-line summary instead of their contents."""
    if isinstance(value, np.ndarray) and value.size > BIG_ARRAY:
        return f"<array of {value.size} {value.dtype}>"
    if isinstance(value, list) and len(value) > BIG_ARRAY:
        kind = type(value[0]).__name__ if value else "?"
        return f"<array of {len(value)} {kind}>"
    if isinstance(value, str) and len(value) > 200:
        return value[:200] + f"... <{len(value)} chars>"
    return to_jsonable(value)


def summary(ck: Checkpoint, hf: bool = False, gguf: bool = False) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    stored: Counter[str] = Counter()
    stored_tensors = [t for t in ck.tensors if not t.virtual]  # views of packed parts have no bytes of their own
    for t in stored_tensors:
        counts[t.storage_type] += 1
        stored[t.storage_type] += t.stored_nbytes
    return {
        "format": ck.format,
        "version": ck.version,
        "files": [public_name(f) for f in ck.files],  # a URL's user info and query are credentials
        "tensor_count": len(stored_tensors),
        "metadata": {k: _summarize(ck.metadata[k]) for k in ck.metadata},
        "storage_types": {k: {"tensors": counts[k], "stored_bytes": stored[k]} for k in sorted(counts)},
        "damaged": [{"name": t.name, "storage_type": t.storage_type, "reason": redact(t.info.damaged) if t.info.damaged else t.info.damaged}
                    for t in ck.damaged()],
        "notes": [redact(note) for note in ck.notes],
        "passthrough": sorted(ck.passthrough),
        "hf": describe("hf", ck) if hf else None,  # whether a mount with --hf gets hf/, or why not
        "gguf": describe("gguf", ck) if gguf else None,
        "packed_views": _packed_views(ck),
    }


def _packed_views(ck: Checkpoint) -> dict[str, Any] | None:
    """Quantized layers: how many views (in all and per scheme), and why any layer has none (None: no such
    layers)."""
    rows = ck.packed_views
    if not rows:
        return None
    schemes = sorted({r["scheme"] for r in rows})
    return {"schemes": schemes, "views": sum(1 for r in rows if r["present"]),
            "per_scheme": {s: {"views": sum(1 for r in rows if r["scheme"] == s and r["present"]),
                               "absent": sum(1 for r in rows if r["scheme"] == s and not r["present"])}
                           for s in schemes},
            "absent": [{"name": r["name"], "reason": r["reason"]} for r in rows if not r["present"]]}


def repository_summary(repository) -> dict[str, Any]:
    """A folder of several checkpoints (``formats.repository``): each checkpoint, what to name to open it alone,
    its folder in a mount, its files and their bytes; then the folder's other files. Nothing is opened."""
    sizes = {name: size for name, (_, size) in repository.files.items()}
    owned = set(repository.owner())
    return {
        "repository": public_name(repository.folder),
        "checkpoints": [{**m.as_dict(), "src": public_name(m.src),
                         "bytes": sum(max(0, sizes.get(f, 0)) for f in m.files)} for m in repository.members],
        "other_files": [name for name in repository.files if name not in owned],
        "notes": [redact(note) for note in repository.notes],
    }


def _more(count: int, what: str) -> str:
    return f"... and {count} more {what} (--all lists every one)"


def _names(names: list[str], every: bool) -> str:
    """A list of file names for one line: the first LISTED_NAMES of them unless ``every``."""
    if every or len(names) <= LISTED_NAMES:
        return ", ".join(names)
    return ", ".join(names[:LISTED_NAMES]) + ", " + _more(len(names) - LISTED_NAMES, "files")


def _render_repository(info: dict[str, Any], every: bool) -> str:
    rows = info["checkpoints"]
    lines = [f"repository: {len(rows)} checkpoints (a mount shows each in a folder of its own)"]
    shown = rows if every else rows[:LISTED_NAMES]
    for row in shown:
        lines.append(f"  {row['name']}/  {row['label']}  {format_size(row['bytes'])}  (open alone: {row['src']})")
    if len(shown) < len(rows):
        lines.append("  " + _more(len(rows) - len(shown), "checkpoints"))
    if info["other_files"]:
        lines.append(f"other files ({len(info['other_files'])}): {_names(info['other_files'], every)}")
    lines += [f"note: {note}" for note in info["notes"]]
    return "\n".join(one_line(line) for line in lines)


def render(info: dict[str, Any], every: bool = False) -> str:
    """The text form of ``summary``/``repository_summary``; long lists of names are cut short unless ``every``
    (``ckptfs info --all``: the JSON form always holds them all)."""
    if "checkpoints" in info:
        return _render_repository(info, every)
    lines = [f"format: {info['format']}" + (f" v{info['version']}" if info["version"] is not None else ""),
             f"files: {len(info['files'])}" + (f" ({info['files'][0]})" if len(info["files"]) == 1 else ""),
             f"tensors: {info['tensor_count']}",
             "storage types:"]
    for name, row in info["storage_types"].items():
        lines.append(f"  {name:<14} {row['tensors']:>6} tensors  {format_size(row['stored_bytes']):>12}")
    lines.append(f"metadata: {len(info['metadata'])} keys")
    for key, value in info["metadata"].items():
        lines.append(f"  {key} = {value if isinstance(value, str) else repr(value)}")
    if info["passthrough"]:
        lines.append(f"other files ({len(info['passthrough'])}): {_names(info['passthrough'], every)}")
    if info.get("hf"):
        lines.append(f"hf/: {info['hf']}")
    if info.get("gguf"):
        lines.append(f"gguf/: {info['gguf']}")
    packed = info.get("packed_views")
    if packed:
        per = packed.get("per_scheme") or {}
        counts = ", ".join(f"{s} {per[s]['views']}" if s in per else s for s in packed["schemes"])
        lines.append(f"packed views ({counts}): {packed['views']}, absent: {len(packed['absent'])}")
        for row in packed["absent"]:
            lines.append(f"  no view {row['name']!r}: {row['reason']}")
    for note in info["notes"]:
        lines.append(f"note: {note}")
    if info["damaged"]:
        lines.append(f"damaged tensors: {len(info['damaged'])}")
        for row in info["damaged"]:
            lines.append(f"  {row['name']!r} ({row['storage_type']}): {row['reason']}")
    else:
        lines.append("damaged tensors: none")
    return "\n".join(one_line(line) for line in lines)  # a newline in a name or value must not split a line
