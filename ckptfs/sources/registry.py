"""Where bytes come from: a factory of byte sources and model folders keyed by URL scheme.

An :class:`Opener` (remote options, a wrapper) opens a :class:`ByteSource` for a local path or a URL
(``opener.source(src)``) and a :class:`Folder` when ``src`` names a model folder (``opener.folder(src)``); it
is handed explicitly to whatever opens a checkpoint's files. ``open_source``/``open_folder``/``is_file`` use
the defaults. A new scheme is one module that calls
:func:`register_scheme` when imported; the modules of the built-in remote schemes are imported only when a
URL of theirs is first opened, so ``import ckptfs`` and a local mount never load an HTTP or S3 library.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckptfs.core.errors import CheckpointError
from ckptfs.sources.base import ByteSource, Folder
from ckptfs.sources.local import FileSource, open_local_folder

SourceOpener = Callable[..., ByteSource]  # (src) or, for a scheme that takes them, (src, options=...)
FolderOpener = Callable[..., "Folder | None"]

#: Modules that register the built-in remote schemes, imported on first use of the scheme.
LAZY_SCHEMES = {"http": "ckptfs.sources.remote.http", "https": "ckptfs.sources.remote.http",
                "s3": "ckptfs.sources.remote.s3", "hf": "ckptfs.sources.remote.hub"}

_URL_RE = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*)://")
_openers: dict[str, tuple[SourceOpener, FolderOpener | None, bool]] = {}
_lock = threading.Lock()


def register_scheme(scheme: str, opener: SourceOpener, folder: FolderOpener | None = None) -> None:
    """Make ``scheme://...`` sources (and folders, when ``folder`` is given) open through these callables:
    ``opener(src)`` / ``folder(src)``, or with a second parameter ``options`` when they declare one (the
    remote schemes: an :class:`Opener`'s ``options`` are handed to them)."""
    with _lock:
        _openers[scheme.lower()] = (opener, folder, _takes_options(opener))


def _takes_options(fn: Callable[..., Any]) -> bool:
    try:
        return "options" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or a class without a readable signature
        return False


def scheme_of(src: object) -> str | None:
    """The URL scheme of ``src`` (lower case), or None for a local path."""
    if not isinstance(src, str):
        return None
    match = _URL_RE.match(src)
    return match["scheme"].lower() if match else None


def is_url(src: object) -> bool:
    return scheme_of(src) is not None


def load_scheme(src: str) -> None:
    """Import the module that opens ``src``'s scheme now, as its first open would (CheckpointError for an
    unknown scheme or a missing optional package): a caller that then waits on the network can do other
    work beside that wait (``ckptfs prefetch`` imports what its open needs) without slowing the request."""
    scheme = scheme_of(src)
    if scheme is not None:
        _scheme_openers(scheme)


def _scheme_openers(scheme: str) -> tuple[SourceOpener, FolderOpener | None, bool]:
    entry = _openers.get(scheme)
    if entry is None and scheme in LAZY_SCHEMES:
        try:
            importlib.import_module(LAZY_SCHEMES[scheme])
        except ImportError as exc:
            raise CheckpointError(f"{scheme}://", None, f"{scheme}:// sources need an optional package: "
                                                       f"{exc} (pip install 'ckptfs[remote]')") from None
        entry = _openers.get(scheme)
    if entry is None:
        raise CheckpointError(f"{scheme}://", None, f"unknown source scheme {scheme!r} (known: local paths, "
                                                   f"{', '.join(sorted(set(LAZY_SCHEMES) | set(_openers)))})")
    return entry


@dataclass(frozen=True)
class Opener:
    """How one checkpoint's sources are opened, handed explicitly to everything that opens them (the header
    readers, folder discovery, the pool): ``options`` for the remote schemes (a
    ``ckptfs.sources.remote.options.RemoteOptions``: timeouts, cache folder, read-ahead; None: their
    defaults) and ``wrapper``, applied to every source opened (mirrors, checked reads: the headers are read
    through the same wrapper the pool applies later, so a truncated local primary is parsed at its mirror's
    size)."""

    options: Any = None
    wrapper: Callable[[ByteSource], ByteSource] | None = None

    def source(self, src: str, base_dir: str | None = None) -> ByteSource:
        """A byte source for ``src``: a URL by its scheme, else a local file (a relative path is opened from
        ``base_dir`` when given, while messages keep the name as given)."""
        scheme = scheme_of(src)
        if scheme is None:
            open_path = os.path.join(base_dir, src) if base_dir is not None else src
            source: ByteSource = FileSource(src, open_path)
        else:
            opener, _, takes_options = _scheme_openers(scheme)
            source = opener(src, options=self.options) if takes_options else opener(src)
        return self.wrapper(source) if self.wrapper is not None else source

    def folder(self, src: str) -> Folder | None:
        """The model folder ``src`` names, or None when it names a file (or nothing a folder lister knows)."""
        scheme = scheme_of(src)
        if scheme is None:
            return open_local_folder(src)
        folder = _scheme_openers(scheme)[1]
        if folder is None:
            return None
        return folder(src, options=self.options) if _takes_options(folder) else folder(src)

    def is_file(self, src: str) -> bool:
        """Whether ``src`` names a readable regular file (for a URL: whether it opens)."""
        if scheme_of(src) is None:
            return os.path.isfile(src)
        try:
            self.source(src).close()
        except CheckpointError:
            return False
        return True


#: Sources opened with every scheme's defaults and no wrapper.
DEFAULT_OPENER = Opener()


def open_source(src: str, base_dir: str | None = None) -> ByteSource:
    """``DEFAULT_OPENER.source(src, base_dir)``: see :class:`Opener`."""
    return DEFAULT_OPENER.source(src, base_dir)


def open_folder(src: str) -> Folder | None:
    """``DEFAULT_OPENER.folder(src)``: see :class:`Opener`."""
    return DEFAULT_OPENER.folder(src)


def is_file(src: str) -> bool:
    """``DEFAULT_OPENER.is_file(src)``: see :class:`Opener`."""
    return DEFAULT_OPENER.is_file(src)


def normalize(src: str) -> str:
    """A form of ``src`` for comparing names: ``os.path.normpath`` for a path; a URL as it is (normpath
    would fold its ``//``)."""
    return src if scheme_of(src) is not None else os.path.normpath(src)
