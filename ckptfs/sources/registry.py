"""Where bytes come from: a factory of byte sources and model folders keyed by URL scheme.

``open_source(src)`` returns a :class:`ByteSource` for a local path or a URL; ``open_folder(src)`` a
:class:`Folder` when ``src`` names a model folder. A new scheme is one module that calls
:func:`register_scheme` when imported; the modules of the built-in remote schemes are imported only when a
URL of theirs is first opened, so ``import ckptfs`` and a local mount never load an HTTP or S3 library.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import re
import threading
from collections.abc import Callable

from ckptfs.core.errors import CheckpointError
from ckptfs.sources.base import ByteSource, Folder
from ckptfs.sources.local import FileSource, open_local_folder

SourceOpener = Callable[[str], ByteSource]
FolderOpener = Callable[[str], "Folder | None"]

#: Modules that register the built-in remote schemes, imported on first use of the scheme.
LAZY_SCHEMES = {"http": "ckptfs.sources.remote.http", "https": "ckptfs.sources.remote.http",
                "s3": "ckptfs.sources.remote.s3", "hf": "ckptfs.sources.remote.hub"}

_URL_RE = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*)://")
_openers: dict[str, tuple[SourceOpener, FolderOpener | None]] = {}
_lock = threading.Lock()


def register_scheme(scheme: str, opener: SourceOpener, folder: FolderOpener | None = None) -> None:
    """Make ``scheme://...`` sources (and folders, when ``folder`` is given) open through these callables."""
    with _lock:
        _openers[scheme.lower()] = (opener, folder)


def scheme_of(src) -> str | None:
    """The URL scheme of ``src`` (lower case), or None for a local path."""
    if not isinstance(src, str):
        return None
    match = _URL_RE.match(src)
    return match["scheme"].lower() if match else None


def is_url(src) -> bool:
    return scheme_of(src) is not None


def _scheme_openers(scheme: str) -> tuple[SourceOpener, FolderOpener | None]:
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


_open_wrapper: contextvars.ContextVar[Callable[[ByteSource], ByteSource] | None] = contextvars.ContextVar(
    "ckptfs_open_wrapper", default=None)


@contextlib.contextmanager
def wrapping(wrapper: Callable[[ByteSource], ByteSource] | None):
    """Sources opened inside pass through ``wrapper``: ``ckptfs.open`` reads headers this way through the same
    wrapper its pool applies later (mirrors), so a truncated local primary is parsed at its mirror's size."""
    token = _open_wrapper.set(wrapper)
    try:
        yield
    finally:
        _open_wrapper.reset(token)


def open_source(src: str, base_dir: str | None = None) -> ByteSource:
    """A byte source for ``src``: a URL by its scheme, else a local file (a relative path is opened from
    ``base_dir`` when given, while messages keep the name as given)."""
    scheme = scheme_of(src)
    if scheme is None:
        open_path = os.path.join(base_dir, src) if base_dir is not None else src
        source = FileSource(src, open_path)
    else:
        source = _scheme_openers(scheme)[0](src)
    wrapper = _open_wrapper.get()
    return wrapper(source) if wrapper is not None else source


def open_folder(src: str) -> Folder | None:
    """The model folder ``src`` names, or None when it names a file (or nothing a folder lister knows)."""
    scheme = scheme_of(src)
    if scheme is None:
        return open_local_folder(src)
    folder = _scheme_openers(scheme)[1]
    return folder(src) if folder is not None else None


def is_file(src: str) -> bool:
    """Whether ``src`` names a readable regular file (for a URL: whether it opens)."""
    if scheme_of(src) is None:
        return os.path.isfile(src)
    try:
        open_source(src).close()
    except CheckpointError:
        return False
    return True


def normalize(src: str) -> str:
    """A form of ``src`` for comparing names: ``os.path.normpath`` for a path; a URL as it is (normpath
    would fold its ``//``)."""
    return src if scheme_of(src) is not None else os.path.normpath(src)
