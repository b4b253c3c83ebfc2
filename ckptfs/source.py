"""Compatibility name: the byte sources moved to the package ``ckptfs.sources``."""

from ckptfs.sources import FileSource, SourcePool  # noqa: F401
