"""Which files form a checkpoint, given what the user named: a file, a split-GGUF shard, an index or a folder.

The answer is one ParsedCheckpoint whose descriptors each point at their own file (docs/multifile.md has
the whole set of rules):

- a ``*.index.json`` file: the shards its weight_map names (read as safetensors), plus the folder's other
  files passed through;
- a folder: its ``*.safetensors.index.json`` if it holds exactly one; otherwise its only checkpoint — one
  ``.gguf``/``.safetensors`` file or one ``PREFIX-NNNNN-of-NNNNN`` set — plus its other files passed through.
  Several candidates (quantizations side by side, an mmproj file, consolidated.safetensors beside shards)
  are refused with the list, because guessing would serve a different model than the one meant (the
  refusal carries the folder as a ``formats.repository.Repository``: ``ckptfs mount`` shows it whole);
- a file: that file; a split-GGUF shard brings its siblings. No pass-through for a named file: naming a
  file says "this checkpoint", not "this model folder".

Paths are joined to what the user gave and never resolved (Hugging Face snapshots are links into blobs/).
"""

from __future__ import annotations

import logging
import os
import stat

from ckptfs.core.descriptors import ParsedCheckpoint
from ckptfs.core.errors import CheckpointError
from ckptfs.sources import DEFAULT_OPENER, Folder, LocalFolder, Opener, is_url, normalize
from ckptfs.formats import read_file
from ckptfs.formats._common import only_checkpoint_errors
from ckptfs.formats.repository import several_checkpoints
from ckptfs.formats.safetensors_set import read_index, read_safetensors_set
from ckptfs.formats.shards import Candidate, FolderScan, name_list, parse_shard_name, scan_folder
from ckptfs.formats.split_gguf import read_split_gguf, split_keys
from ckptfs.util.oneline import one_line
from ckptfs.util.redact import public_name

INDEX_NAME_SUFFIX = ".index.json"
log = logging.getLogger(__name__)


@only_checkpoint_errors
def read_checkpoint(src: str, opener: Opener = DEFAULT_OPENER) -> ParsedCheckpoint:
    """Read whatever ``src`` names into one ParsedCheckpoint (see the module docstring), opening every file
    and folder through ``opener`` (a remote checkpoint's options, mirrors)."""
    folder = opener.folder(src)
    if folder is not None:
        return _read_folder(folder, opener)
    if not is_url(src):
        _check_local_file(src)
    if os.path.basename(src).endswith(INDEX_NAME_SUFFIX):
        return _read_indexed(src, _scan(os.path.dirname(src), opener), opener)
    return read_named_file(src, opener)


_NOT_FILES = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"))


def _check_local_file(src: str) -> None:
    """A local ``src`` that is not a folder must be a file we can read without blocking: the real reason
    otherwise (permission denied on a parent, a symlink loop, a name too long: not "no such file"), and a
    FIFO, socket or character device is refused before anything opens it (opening a FIFO waits for a
    writer forever). Block devices pass: a checkpoint may be written to a raw device."""
    try:
        mode = os.stat(src).st_mode
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise CheckpointError(src, None, reason[:1].lower() + reason[1:]) from None
    for test, kind in _NOT_FILES:
        if test(mode):
            raise CheckpointError(src, None, f"is {kind}, not a checkpoint file or folder")


def read_named_file(src: str, opener: Opener = DEFAULT_OPENER) -> ParsedCheckpoint:
    """One file; a split-GGUF shard brings its whole set."""
    parsed = read_file(src, opener)
    base = os.path.basename(src)
    shard = parse_shard_name(base)
    if parsed.format == "gguf":
        keys = split_keys(src, parsed)
        if keys is not None and keys.count > 1:
            return read_split_gguf(src, parsed, keys, opener)
        if shard is not None and shard.count > 1:
            parsed.notes.append(f"{base} is named like shard {shard.number} of {shard.count} but has no split "
                                f"keys: served alone")
    elif shard is not None and shard.count > 1:
        parsed.notes.append(f"{base} is shard {shard.number} of {shard.count} by its name: only it is served "
                            f"(name the folder or its index file to open the whole set)")
    return parsed


def _scan(folder: str | Folder, opener: Opener) -> FolderScan:
    if isinstance(folder, str):
        folder = opener.folder(folder) or LocalFolder(folder)
    try:
        return scan_folder(folder)
    except OSError as exc:
        raise CheckpointError(folder.name or ".", None, f"cannot list the folder: {exc.strerror or exc}") from None


def _read_folder(found: Folder, opener: Opener) -> ParsedCheckpoint:
    folder = found.name
    if isinstance(found, LocalFolder):
        folder = folder.rstrip(os.sep) or os.sep  # "dir//" and "dir" must join to the same shard paths
        found = LocalFolder(folder)
    scan = _scan(found, opener)
    if len(scan.indexes) > 1 or (not scan.indexes and len(scan.candidates) > 1):
        raise several_checkpoints(scan)  # a repository: the mount shows it whole (formats/repository.py)
    if scan.indexes:
        return _read_indexed(scan.path(scan.indexes[0]), scan, opener)
    if not scan.candidates:
        raise CheckpointError(folder, None, "holds no checkpoint (*.gguf, *.safetensors or "
                                            "*.safetensors.index.json)")
    parsed = _read_candidate(scan.candidates[0], opener)
    _add_passthrough(parsed, scan, index=None)
    return parsed


def _read_candidate(candidate: Candidate, opener: Opener) -> ParsedCheckpoint:
    shard = candidate.shard
    if shard is None or shard.ext == "gguf":
        parsed = read_named_file(candidate.paths[0], opener)
        used = {normalize(p) for p in parsed.files}
        left_out = [os.path.basename(p) for p in candidate.paths if normalize(p) not in used]
        if left_out:
            raise CheckpointError(candidate.paths[0], None, f"does not form a split set with {name_list(left_out)} "
                                                            f"(no split keys): name one file")
        return parsed
    folder = os.path.dirname(candidate.paths[0])
    present = set(candidate.paths)
    siblings = [os.path.join(folder, shard.sibling(n)) for n in range(1, shard.count + 1)]
    return read_safetensors_set(candidate.paths, [p for p in siblings if p not in present], opener=opener)


def _read_indexed(index_path: str, scan: FolderScan, opener: Opener) -> ParsedCheckpoint:
    index = read_index(index_path, opener)
    present: list[str] = []
    missing: list[str] = []
    for file in index.shard_files():
        path = index.shard_path(file)
        (present if opener.is_file(path) else missing).append(path)
    parsed = read_safetensors_set(present, missing, index, opener=opener)
    _add_passthrough(parsed, scan, index=os.path.basename(index_path))
    return parsed


def _add_passthrough(parsed: ParsedCheckpoint, scan: FolderScan, index: str | None) -> None:
    """The folder's other regular files, under their own names; other checkpoints are left out, and said so.

    The chosen index file is passed through too: tools that read a model folder look for it (it describes the
    original shards, which the mount shows as tensors). Hidden files and sub-folders are not.
    """
    used = {normalize(p) for p in parsed.files}
    names = list(scan.others) + ([index] if index is not None else [])
    parsed.passthrough.update({name: scan.path(name) for name in names})
    ignored = [os.path.basename(p) for c in scan.candidates for p in c.paths if normalize(p) not in used]
    ignored += [name for name in scan.indexes if name != index]
    if ignored:
        note = (f"other checkpoint files in the folder, not part of this checkpoint and not passed through: "
                f"{name_list(ignored)}" + (f" (the index file {index} names the checkpoint)" if index else ""))
        parsed.notes.append(note)
        # a file left out of a mount is said where it is mounted (the folder as logs show it: no credentials)
        log.warning("%s: %s", public_name(scan.folder), one_line(note))
    if scan.broken:
        parsed.notes.append(f"not passed through (broken links or not regular files): {name_list(list(scan.broken))}")
