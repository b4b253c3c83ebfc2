"""Split GGUF (llama.cpp's gguf-split): any one shard opens the whole set.

Each shard is a complete GGUF file with its own header and local offsets, named
``PREFIX-NNNNN-of-NNNNN.gguf`` (1-based) and carrying ``split.no`` (0-based), ``split.count`` and
``split.tensors.count`` (the total over all shards). Shard 0 holds the model's metadata; the others only the
split keys; a first shard may hold no tensors at all.

Siblings are found by name next to the shard the user named (its path as given: in a Hugging Face cache
snapshot the files are links to hash-named blobs) and then checked by content. What is impossible is refused:
a sibling whose split keys say it belongs to another split (another count, another total, another number
than its name), or that is not GGUF. What is missing is served around: absent shards are named in a note and
the rest is served; a total that disagrees with what was found is a note. The keys are read as integers of
whatever width the file uses (gguf-split writes u16, u16 and i32).
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass

from ckptfs.core.descriptors import ParsedCheckpoint
from ckptfs.core.errors import CheckpointError
from ckptfs.formats import read_file
from ckptfs.formats.combine import ShardPart, combine, require_format
from ckptfs.sources import DEFAULT_OPENER, Opener
from ckptfs.formats.shards import parse_shard_name

KEY_NO = "split.no"
KEY_COUNT = "split.count"
KEY_TENSORS = "split.tensors.count"


@dataclass(frozen=True)
class SplitKeys:
    """A shard's split keys; ``no`` is 0-based, ``tensors`` None when the file does not say."""

    no: int
    count: int
    tensors: int | None

    def describe(self) -> str:
        total = f", {self.tensors} tensors in all" if self.tensors is not None else ""
        return f"shard {self.no + 1} of {self.count}{total}"


def split_keys(path: str, parsed: ParsedCheckpoint) -> SplitKeys | None:
    """The split keys of a GGUF file, None if it has no ``split.count``; CheckpointError if they are nonsense."""
    metadata = parsed.metadata
    if KEY_COUNT not in metadata:
        return None
    count = _integer(path, parsed, KEY_COUNT)
    if KEY_NO not in metadata:
        raise CheckpointError(path, None, f"has {KEY_COUNT} but no {KEY_NO}: cannot tell which shard it is")
    no = _integer(path, parsed, KEY_NO)
    tensors = _integer(path, parsed, KEY_TENSORS) if KEY_TENSORS in metadata else None
    if count < 1 or not 0 <= no < count:
        raise CheckpointError(path, None, f"{KEY_NO} = {no} with {KEY_COUNT} = {count} is impossible")
    if tensors is not None and tensors < 0:
        raise CheckpointError(path, None, f"{KEY_TENSORS} = {tensors} is negative")
    return SplitKeys(no, count, tensors)


def _integer(path: str, parsed: ParsedCheckpoint, key: str) -> int:
    value = parsed.metadata[key]
    if isinstance(value, bool):
        raise CheckpointError(path, None, f"{key} is a bool, not an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise CheckpointError(path, None, f"{key} is not an integer: {value!r}") from None


def read_split_gguf(src: str, parsed: ParsedCheckpoint, keys: SplitKeys,
                    opener: Opener = DEFAULT_OPENER) -> ParsedCheckpoint:
    """The whole split set that the shard ``src`` (already read into ``parsed``) belongs to."""
    base = os.path.basename(src)
    name = parse_shard_name(base)
    if name is None or name.ext != "gguf":
        parsed.notes.append(f"{base} says it is {keys.describe()} ({KEY_NO}/{KEY_COUNT}) but its name does not "
                            f"follow PREFIX-NNNNN-of-NNNNN.gguf, so its siblings cannot be found: serving it alone")
        return parsed
    if (name.number, name.count) != (keys.no + 1, keys.count):
        raise CheckpointError(src, None, f"is named shard {name.number} of {name.count} but its split keys say "
                                         f"{keys.describe()}")
    folder = os.path.dirname(src)
    parts: list[ShardPart] = []
    missing: list[str] = []
    head: tuple[str, ParsedCheckpoint] | None = None
    for number in range(1, keys.count + 1):
        path = os.path.join(folder, name.sibling(number))
        if number == name.number:
            shard = parsed
        elif not opener.is_file(path):
            missing.append(name.sibling(number))
            continue
        else:
            shard = read_file(path, opener)
            _check_sibling(path, shard, number, keys, src)
        parts.append(ShardPart.of(path, shard))
        if head is None:
            head = (path, shard)
    notes = [f"split GGUF shard {m} is missing: its tensors are not served" for m in missing]
    if head is None:
        raise CheckpointError(src, None, "no shard of the split set could be read")
    head_path, head_shard = head
    if os.path.basename(head_path) != name.sibling(1):
        notes.append(f"the first shard ({name.sibling(1)}), which holds the model's metadata, is missing: "
                     f"metadata is that of {os.path.basename(head_path)}")
    found = sum(len(part.tensors) for part in parts)
    if keys.tensors is not None and found != keys.tensors:
        present = "all" if not missing else f"the {len(parts)} present"
        notes.append(f"{KEY_TENSORS} says {keys.tensors} tensors, {present} shards hold {found}")
    return combine("gguf", head_shard.version, parts, head_shard.metadata, notes)


def _check_sibling(path: str, shard: ParsedCheckpoint, number: int, keys: SplitKeys, src: str) -> None:
    """Refuse a file that has a sibling's name but is not part of the same split."""
    require_format(path, shard, "gguf", "a split GGUF")
    theirs = split_keys(path, shard)
    if theirs is None:
        raise CheckpointError(path, None, f"has a shard's name but no {KEY_COUNT} key: not part of the split "
                                          f"of {os.path.basename(src)}")
    if theirs.no != number - 1 or theirs.count != keys.count:
        raise CheckpointError(path, None, f"is named shard {number} of {keys.count} but its split keys say "
                                          f"{theirs.describe()}: from a different split set")
    if theirs.tensors != keys.tensors:
        raise CheckpointError(path, None, f"says {theirs.tensors} tensors in all, {os.path.basename(src)} says "
                                          f"{keys.tensors}: the shards come from different split sets")
