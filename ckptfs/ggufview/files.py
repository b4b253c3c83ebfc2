"""The folder's JSON files as the header's builders read them: each parsed once per build.

A large ``tokenizer.json`` (9 MB for a 262,144-token vocabulary) is read by several rules (the pre-tokenizer's
shape, the post-processor's flags, the rows an embedding keeps); parsing it once saves a second of mount
time. The parses are kept only while a header is built (``one_build``), not for the mount's life.

The folder is someone else's: every file is read with the bounded reader (``util.jsonutil``: regular files
only, never blocking on a FIFO, nesting bounded), and a path a file names (``modules.json``'s module folders)
is taken only when it stays inside the folder (``inside``). Before any library reads the folder by path,
``vet`` checks each file they may read the same way, so a planted FIFO or a 200,000-deep ``config.json``
is one ``Unsupported`` line, not a hang or a traceback.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from ckptfs.core.runtime import Part, runtime
from ckptfs.ggufview import Unsupported
from ckptfs.sources.local import link_roots, within
from ckptfs.util.jsonutil import MAX_FILE_BYTES, JsonRefused, load_file

#: The files the tokenizer and metadata libraries read from a folder by path (by suffix).
LIBRARY_SUFFIXES = (".json", ".model", ".txt", ".md", ".jinja")

class ParsedFiles:
    """The library files a runtime has parsed, keyed by path, mtime and size (the values are shared: never
    changed), kept while at least one build runs (``one_build``) and dropped when the last one ends."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parsed: dict[tuple[str, int, int], Any] = {}
        self.builds = 0

    def in_child(self) -> ParsedFiles:
        """In a forked child: the same, under a fresh lock (a fork from inside a build, as a mount forks its
        daemon, ends that build in the child)."""
        self.lock = threading.Lock()
        return self


#: A runtime's parsed library files (``read_json``).
PARSED_FILES = Part("parsed library files", ParsedFiles, ParsedFiles.in_child)


def read_json(path: Path, shown: str | None = None) -> Any:
    """A JSON file's value (None when there is no such file, or a folder of that name); the value is shared:
    never change it. Unsupported (one line, naming the file ``shown``, by default its name) for a file that
    is not a regular one, too large or too deep."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISDIR(st.st_mode):
        return None
    key = (str(path), st.st_mtime_ns, st.st_size)
    files = runtime().get(PARSED_FILES)
    with files.lock:
        if key in files.parsed:
            return files.parsed[key]
    try:
        value = load_file(path)
    except JsonRefused as exc:
        raise Unsupported(str(exc).replace(str(path), shown or path.name, 1)) from None
    with files.lock:
        if files.builds:
            files.parsed[key] = value
    return value


@contextmanager
def one_build() -> Iterator[None]:
    """Parses are kept while at least one build runs, dropped when the last one ends."""
    files = runtime().get(PARSED_FILES)
    with files.lock:
        files.builds += 1
    try:
        yield
    finally:
        with files.lock:
            files.builds -= 1
            if not files.builds:
                files.parsed.clear()


def inside(folder: Path, relative: object) -> Path:
    """``folder / relative`` for a relative path a file of the folder names (``modules.json``'s ``path``):
    Unsupported for one that is not a string, is absolute, climbs out with ``..`` or leads out through a
    link (as the folder's listing leaves such links out)."""
    if not isinstance(relative, str) or not relative or "\0" in relative:
        raise Unsupported(f"a module path {relative!r} is not a relative path")
    parts = PurePosixPath(relative).parts
    if relative.startswith("/") or any(part in ("..",) for part in parts):
        raise Unsupported(f"a module path {relative!r} leads outside the folder")
    path = folder.joinpath(*parts)
    if os.path.lexists(path) and not within(str(path), link_roots(str(folder))):
        raise Unsupported(f"a module path {relative!r} leads outside the folder")
    return path


def vet(folder: Path) -> None:
    """Check the files a library may read from ``folder`` by path before any does: each one of a suffix they
    read is a regular file within the reader's bound, and each JSON one parses within the nesting bound
    (parsed once: ``read_json`` then answers from this build's parses)."""
    with os.scandir(folder) as entries:
        names = sorted(entry.name for entry in entries if entry.name.endswith(LIBRARY_SUFFIXES))
    for name in names:
        path = folder / name
        try:
            st = path.stat()
        except OSError:
            continue  # a dangling link: absent for every reader
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            raise Unsupported(f"{name} is not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise Unsupported(f"{name} is {st.st_size} bytes, more than the {MAX_FILE_BYTES} read of such a file")
        if name.endswith(".json"):
            read_json(path)


def pooling_modules(folder: Path) -> list[str]:
    """The folders ``modules.json`` names for its sentence-transformers Pooling modules, as it names them
    (each checked to stay inside the folder: ``inside``)."""
    modules = read_json(folder / "modules.json")
    if modules is None:
        return []
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise Unsupported("modules.json is not a list of modules")
    paths = [m.get("path") for m in modules if str(m.get("type", "")).endswith("Pooling")]
    for path in paths:
        inside(folder, path)
    return [path for path in paths if isinstance(path, str)]


def pooling_config(folder: Path) -> dict | None:
    """The ``config.json`` of the first Pooling module ``modules.json`` names (None without one)."""
    paths = pooling_modules(folder)
    if not paths:
        return None
    shown = f"{paths[0].rstrip('/')}/config.json"
    config = read_json(inside(folder, paths[0]) / "config.json", shown)
    if not isinstance(config, dict):
        raise Unsupported(f"{shown} is missing or not a JSON object")
    return config
