"""How one checkpoint's byte sources are opened: remote options (timeouts, cache directory, the fleet's Redis
that fetched chunks are shared through) and mirrors.

``ckptfs.open`` makes one ``SourcePlan`` per checkpoint when a URL, a mirror or a remote option is involved
(a plain local open never imports this). The plan is applied in both places sources are opened: while the
headers are read (``header_opener``: the ``ckptfs.sources.Opener`` the header readers and folder discovery
are handed, without read-ahead), and by the checkpoint's pool afterwards (``opener`` and ``wrapper``), so
the same options and mirrors hold for every read of the checkpoint, in the mount daemon too.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ckptfs.core.options import OpenOptions
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.sources.base import ByteSource, Folder
from ckptfs.sources.registry import Opener, is_url
from ckptfs.sources.remote import stored
from ckptfs.sources.remote.options import RemoteOptions

if TYPE_CHECKING:  # imported when there are mirrors
    from ckptfs.sources.mirror import MirrorSet


class SourceCheck(Protocol):
    """Checked reads (a manifest's ``ckptfs.integrity.checked.ManifestCheck``): a wrapper of every source,
    and of a mirror's member standing in for the file ``path``."""

    def __call__(self, source: ByteSource) -> ByteSource: ...

    def wrap(self, source: ByteSource, path: str | None = None) -> ByteSource: ...

_FILE_SUFFIXES = (".gguf", ".safetensors", ".json")


def names_folder(src: str) -> bool:
    """Whether ``src`` names a model folder (docs/interfaces.md, "Sources": an ``hf://`` or ``s3://`` URL
    whose path does not end in ``.gguf``/``.safetensors``/``.json``, or ends in ``/``; a local directory). An
    ``http(s)://`` URL always names a file: plain HTTP has no listing."""
    scheme, sep, _ = src.partition("://")
    if not sep:
        return os.path.isdir(src)
    if scheme.lower() not in ("hf", "s3"):
        return False
    return src.endswith("/") or not src.rsplit("/", 1)[-1].lower().endswith(_FILE_SUFFIXES)


class StoredOpener(Opener):
    """An ``Opener`` whose remote files and folders go through the ``--cache-dir`` store's name records
    (``ckptfs.sources.remote.stored``): served from the store when the origin does not answer at open, or
    never asked with ``--offline``."""

    def source(self, src: str, base_dir: str | None = None) -> ByteSource:
        options = self.options
        if not is_url(src) or not (options.cache_dir or options.open_options.offline):
            return super().source(src, base_dir)
        source = stored.open_file(lambda given: Opener(given).source(src, base_dir), src, options)
        return self.wrapper(source) if self.wrapper is not None else source

    def folder(self, src: str) -> Folder | None:
        folder = super().folder(src)
        return stored.open_folder(folder, self.options) if is_url(src) else folder


class SourcePlan:
    """How the sources of ``src`` are opened, from the checkpoint's ``OpenOptions`` (checked and resolved
    there): the remote sources' :class:`RemoteOptions` and the mirrors."""

    def __init__(self, src: str, options: OpenOptions):
        self.options = RemoteOptions(options)
        self.src = src
        self.mirrors = list(options.mirrors)
        self._folder = names_folder(src) if self.mirrors else False

    def _mirror_set(self, member_wrapper: Callable[[ByteSource, str], ByteSource] | None = None,
                    options: RemoteOptions | None = None) -> MirrorSet | None:
        if not self.mirrors:
            return None
        from ckptfs.sources.mirror import MirrorSet

        return MirrorSet(self.src, self.mirrors, self._folder, member_wrapper, options or self.options)

    def header_opener(self) -> Opener:
        """What the header readers and folder discovery open sources with: these options without read-ahead
        (no thread may start before a mount forks its daemon, and the header reader grows its reads itself),
        and the mirrors."""
        quiet = dataclasses.replace(self.options, read_ahead=False)
        return StoredOpener(quiet, self._mirror_set(options=quiet))

    def read_scope(self) -> ReadScope:
        """The scope of an application read entering now (a mount makes one per FUSE read and passes it down):
        every source read it makes ends by ``--timeout`` from now."""
        return NOTHING_SAID.within(self.options.timeout)

    def opener(self, name: str, base_dir: str | None = None) -> ByteSource:
        """The pool's opener: sources under these options (the pool applies the wrapper itself)."""
        return StoredOpener(self.options).source(name, base_dir)

    def wrapper(self, checked: SourceCheck | None = None) -> Callable[[ByteSource], ByteSource] | None:
        """The pool's source wrapper: mirrors (each member checked when ``checked`` — a ManifestCheck — is
        given, so a manifest mismatch fails over), else ``checked`` alone."""
        mirror_set = self._mirror_set(checked.wrap if checked is not None else None)
        return mirror_set if mirror_set is not None else checked
