"""The version pin of a file whose validator cannot tell its versions apart (``ckptfs.sources.remote.version``),
driven by hand over a source whose tail answers are counted (no network: what is under test is when a check
goes out, not how).

A fetch ahead of readers waits for a check sent ``CHECK_SPACING_S`` after the one before, so that the pieces
landing meanwhile share one check. That wait is worth it only while other fetches are under way: the last
piece of a stream or of a warm-up has nothing to share it with, and is checked at once.
"""

from __future__ import annotations

import time
import types

import pytest

from ckptfs.core.errors import CheckpointError
from ckptfs.sources.identity import sample_digest
from ckptfs.sources.remote import version
from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.version import VersionPin

TAIL = b"the file's last bytes" * 100


class TailSource:
    """What the pin asks of a source (``origin.Asked``): its tail, counted."""

    scheme = "http"
    name = "http://origin.test/model.gguf"

    def __init__(self) -> None:
        self.tail = TAIL
        self.asked = 0

    def _attempt(self, start: int, end: int, read: ReadContext) -> bytes:
        self.asked += 1
        return self.tail[start:end]


class Client:
    """What the pin asks of an ``OriginClient``: one attempt, no retries."""

    def retrying(self, attempt, read, offset, what):
        return attempt(read)

    def timeout_error(self, offset):
        return CheckpointError("x", offset, "timed out")


@pytest.fixture
def pauses(monkeypatch):
    """The pauses the pin takes (its module's ``time.sleep``), recorded instead of slept."""
    taken: list[float] = []
    monkeypatch.setattr(version, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=taken.append))
    monkeypatch.setattr(version, "CHECK_SPACING_S", 5.0)
    return taken


def _pin(source: TailSource) -> VersionPin:
    return VersionPin(source, Client(), (0, len(TAIL), sample_digest(TAIL)))


def test_a_fetch_ahead_alone_is_checked_at_once(pauses):
    source = TailSource()
    pin = _pin(source)
    for _ in range(3):  # one after another, each alone: no wait for others to share its check
        with pin.fetching():
            pin.confirm(time.monotonic(), ReadContext.fetching_ahead(30.0), 0)
    assert source.asked == 3 and pauses == []


def test_a_fetch_ahead_among_others_waits_to_share_a_check(pauses):
    source = TailSource()
    pin = _pin(source)
    with pin.fetching():
        pin.confirm(time.monotonic(), ReadContext.fetching_ahead(30.0), 0)  # the first check
    with pin.fetching(), pin.fetching():  # another fetch under way beside this one
        pin.confirm(time.monotonic(), ReadContext.fetching_ahead(30.0), 0)
    assert source.asked == 2
    assert len(pauses) == 1 and 0 < pauses[0] <= version.CHECK_SPACING_S


def test_a_changed_tail_is_refused_when_checked_alone(pauses):
    source = TailSource()
    pin = _pin(source)
    source.tail = b"another version!" * 200
    with pin.fetching(), pytest.raises(CheckpointError, match="changed since it was opened"):
        pin.confirm(time.monotonic(), ReadContext.fetching_ahead(30.0), 0)
