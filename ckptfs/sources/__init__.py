"""Where bytes come from: byte sources (local files, URLs by scheme), model folders and the pool that keeps
a checkpoint's sources open. The scheme registry is :mod:`ckptfs.sources.registry`; remote schemes live in
:mod:`ckptfs.sources.remote` and are imported only when a URL of theirs is first opened."""

from ckptfs.sources.base import ByteSource, Folder
from ckptfs.sources.identity import checkpoint_content_id, local_content_id, remote_content_id, sha256_content_id
from ckptfs.sources.local import FileSource, LocalFolder
from ckptfs.sources.pool import SourcePool
from ckptfs.sources.registry import (DEFAULT_OPENER, Opener, is_file, is_url, normalize, open_folder, open_source,
                                     register_scheme, scheme_of)

__all__ = ["ByteSource", "Folder", "FileSource", "LocalFolder", "SourcePool", "open_source", "open_folder",
           "register_scheme", "is_url", "is_file", "normalize", "scheme_of", "Opener", "DEFAULT_OPENER", "checkpoint_content_id",
           "local_content_id", "remote_content_id", "sha256_content_id"]
