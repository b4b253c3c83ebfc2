"""``--layout tree``: dotted tensor names as folders (``blk.0.attn_q.weight`` -> ``blk/0/attn_q.weight.npy``).

``flat`` (the default) puts every tensor's files in the mount's root. ``tree`` keeps a tensor name's last two
dot-separated parts as the file stem and makes the parts before them folders; a name of one or two parts
(``token_embd.weight``, ``output``) stays in the root. Each folder name is escaped like a file name
(``%``, ``/``, NUL and invalid UTF-8 bytes as ``%XX``); inside each folder, duplicates and over-long stems
are handled exactly as in the flat layout (``~2``, ``~3``...; a long stem cut with a hash of its name).

Clashes are resolved deterministically:

- A tensor file never collides with a folder: a folder name holds no ``.`` (names are split at dots), a
  tensor file's name always does (its ``.npy``/``.raw``/``.meta.json`` suffix).
- A name with an empty part or a part that is ``.`` or ``..`` (``a..b.weight``), or a part longer than a
  file name may be, cannot become a folder: that tensor stays in the root under its flat name.
- A model folder's pass-through file whose name equals a folder (``blk``) gets ``~2`` before its extension,
  as any pass-through file that clashes; an opt-in folder's entry (``hf/...``) whose name is taken is left out
  with a log line. Tensor files, which come first, always keep their names.
"""

from __future__ import annotations

from collections.abc import Sequence

from ckptfs.util.names import NAME_MAX, assign_stems, encode_name

LAYOUTS = ("flat", "tree")


def _folders(name: str) -> tuple[list[str], str] | None:
    """The escaped folder names and the leaf name of ``name``, or None when it stays in the root."""
    parts = name.split(".")
    if len(parts) <= 2:
        return None
    folders = [encode_name(p) for p in parts[:-2]]
    if any(p in ("", ".", "..") or len(p.encode("utf-8")) > NAME_MAX for p in folders):
        return None
    return folders, ".".join(parts[-2:])


def tree_stems(names: Sequence[str]) -> list[str]:
    """One distinct stem path per tensor name, in order (``"blk/0/attn_q.weight"``; root names without
    a folder)."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for i, name in enumerate(names):
        split = _folders(name)
        folder, leaf = ("", name) if split is None else ("/".join(split[0]), split[1])
        groups.setdefault(folder, []).append((i, leaf))
    stems = [""] * len(names)
    for folder, members in groups.items():
        for (i, _), stem in zip(members, assign_stems([leaf for _, leaf in members])):
            stems[i] = f"{folder}/{stem}" if folder else stem
    return stems


def tensor_providers(layout: str) -> tuple | None:
    """The providers of a mount in ``layout``: None for the default (flat) ones."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if layout == "flat":
        return None
    from ckptfs.tree.mount_tree import DEFAULT_PROVIDERS, tensor_files, tensor_stems

    def tree_tensor_files(ck):
        return tensor_files(ck, tensor_stems(ck, tree_stems))

    return tuple(tree_tensor_files if p is tensor_files else p for p in DEFAULT_PROVIDERS)
