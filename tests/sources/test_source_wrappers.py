"""Wrappers of a source (a mirror set, a manifest's checked reads) answer as what they wrap: ``wrapped`` names
it (``WrapsSource``: a warm-up finds the remote source under them) and ``fetches_ahead`` is its (read-ahead
advises far ahead only a source that fetches what is advised)."""

from __future__ import annotations

from ckptfs.integrity.checked import CheckedSource
from ckptfs.sources import FileSource
from ckptfs.sources.base import ByteSource, WrapsSource
from ckptfs.sources.mirror import MirrorSource


class Fetching(FileSource):
    """A local file standing in for a source that fetches what is advised (as a remote source does)."""

    @property
    def fetches_ahead(self) -> bool:
        return True


def _wrappers(inner: ByteSource) -> list[ByteSource]:
    return [MirrorSource(inner, [], timeout=5.0), CheckedSource(inner, None, [], 1 << 20)]  # type: ignore[arg-type]


def test_wrappers_name_what_they_wrap_and_fetch_ahead_as_it_does(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 4096)
    for inner in (FileSource(str(path)), Fetching(str(path))):
        for wrapper in _wrappers(inner):
            assert isinstance(wrapper, WrapsSource)
            assert wrapper.wrapped is inner
            assert wrapper.fetches_ahead is inner.fetches_ahead
    assert FileSource(str(path)).fetches_ahead is False
