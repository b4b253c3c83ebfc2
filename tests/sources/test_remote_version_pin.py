"""The version pin of a file whose validator cannot tell its versions apart (``ckptfs.sources.remote.version``),
driven by hand over a source whose tail answers are counted (no network: what is under test is when a check
goes out, not how).

A fetch ahead of readers waits for a check sent ``CHECK_SPACING_S`` after the one before, so that the pieces
landing meanwhile share one check. That wait is worth it only while other fetches are under way: the last
piece of a stream or of a warm-up has nothing to share it with, and is checked at once; and a reader waiting
for bytes under way cuts it short (its wait would be the reader's). And once every fetch under way has its
answer, a check goes out then, beside their bodies, and their confirms find it done.
"""

from __future__ import annotations

import threading
import time

import pytest
from conftest import wait_until

from ckptfs.core.errors import CheckpointError
from ckptfs.sources.identity import sample_digest
from ckptfs.sources.remote import version
from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.options import RemoteOptions
from ckptfs.sources.remote.version import VersionPin

TAIL = b"the file's last bytes" * 100


class TailSource:
    """What the pin asks of a range client (``ranges.RangeClient``): its tail, counted."""

    scheme = "http"
    name = "http://origin.test/model.gguf"

    def __init__(self, read_ahead: bool = True) -> None:
        self.tail = TAIL
        self.asked = 0
        self.options = RemoteOptions(read_ahead=read_ahead)  # False: a checkpoint's headers being read

    def fetch(self, start: int, end: int, read: ReadContext) -> bytes:
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
    """The pauses the pin takes (``VersionPin._pause``), recorded instead of waited."""
    taken: list[float] = []
    monkeypatch.setattr(VersionPin, "_pause", lambda pin, seconds: taken.append(seconds))
    monkeypatch.setattr(version, "CHECK_SPACING_S", 5.0)
    return taken


def _pin(source: TailSource) -> VersionPin:
    return VersionPin(source, Client(), (0, len(TAIL), sample_digest(TAIL)))


def _ahead() -> ReadContext:
    return ReadContext.fetching_ahead(30.0)


def test_a_fetch_ahead_alone_is_checked_at_once(pauses):
    source = TailSource()
    pin = _pin(source)
    for _ in range(3):  # one after another, each alone: no wait for others to share its check
        with pin.fetching(_ahead()) as fetch:
            pin.confirm(time.monotonic(), fetch, 0)
    assert source.asked == 3 and pauses == []


def test_a_fetch_ahead_among_others_waits_to_share_a_check(pauses):
    source = TailSource()
    pin = _pin(source)
    with pin.fetching(_ahead()) as fetch:
        pin.confirm(time.monotonic(), fetch, 0)  # the first check
    with pin.fetching(_ahead()) as fetch, pin.fetching(_ahead()):  # another fetch under way beside this one
        pin.confirm(time.monotonic(), fetch, 0)
    assert source.asked == 2
    assert len(pauses) == 1 and 0 < pauses[0] <= version.CHECK_SPACING_S


def test_a_reader_waiting_for_bytes_under_way_cuts_the_wait_for_a_shared_check_short(monkeypatch):
    monkeypatch.setattr(version, "CHECK_SPACING_S", 5.0)
    source = TailSource()
    pin = _pin(source)
    with pin.fetching(_ahead()) as fetch:
        pin.confirm(time.monotonic(), fetch, 0)  # the first check
    done = threading.Event()
    with pin.fetching(_ahead()) as fetch, pin.fetching(_ahead()):  # another fetch under way beside this one

        def confirm() -> None:
            pin.confirm(time.monotonic(), fetch, 0)
            done.set()

        waiting = threading.Thread(target=confirm, daemon=True)
        started = time.monotonic()
        waiting.start()
        assert not done.wait(0.3)  # waiting for others to share its check
        pin.awaited()  # a reader now waits for bytes under way
        assert done.wait(10.0)
        waiting.join(10.0)
    assert time.monotonic() - started < version.CHECK_SPACING_S and source.asked == 2


def test_a_changed_tail_is_refused_when_checked_alone(pauses):
    source = TailSource()
    pin = _pin(source)
    source.tail = b"another version!" * 200
    with pin.fetching(_ahead()) as fetch, pytest.raises(CheckpointError, match="changed since it was opened"):
        pin.confirm(time.monotonic(), fetch, 0)


def _early_check_done(pin: VersionPin) -> bool:
    with pin._count:
        return not pin._early


def test_a_check_goes_out_once_every_fetch_under_way_has_its_answer(pauses):
    source = TailSource()
    pin = _pin(source)
    with pin.fetching(_ahead()) as one, pin.fetching(_ahead()) as two:
        one.answered()
        assert _early_check_done(pin) and source.asked == 0  # another answer is still to come
        two.answered()  # the last one: the check goes out now, its body still arriving
        assert wait_until(lambda: _early_check_done(pin), 10.0)
        assert source.asked == 1
        pin.confirm(one.answered_at, one, 0)  # the bodies are in: the check sent after both answers covers them
        pin.confirm(two.answered_at, two, 0)
    assert source.asked == 1


def test_a_failed_early_check_is_said_by_the_confirm(pauses):
    source = TailSource()
    pin = _pin(source)
    source.tail = b"another version!" * 200
    with pin.fetching(_ahead()) as fetch:
        fetch.answered()
        assert wait_until(lambda: _early_check_done(pin), 10.0)
        assert source.asked == 1
        with pytest.raises(CheckpointError, match="changed since it was opened"):
            pin.confirm(fetch.answered_at, fetch, 0)  # checks again itself, and refuses the bytes
    assert source.asked == 2


def test_no_thread_checks_while_headers_are_read(pauses):
    source = TailSource(read_ahead=False)  # before a mount forks its daemon: no thread may start
    pin = _pin(source)
    with pin.fetching(ReadContext(time.monotonic() + 30.0)) as fetch:
        fetch.answered()
        assert source.asked == 0 and _early_check_done(pin)
        pin.confirm(fetch.answered_at, fetch, 0)
    assert source.asked == 1


class HangingTail(TailSource):
    """A tail whose answer, once ``hang`` is set, does not come until ``release`` is (30 s at most)."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = threading.Event()
        self.release = threading.Event()

    def fetch(self, start: int, end: int, read: ReadContext) -> bytes:
        if self.hang.is_set():
            self.hang.clear()  # (the next asks are answered)
            self.asked += 1
            self.release.wait(30)
            return self.tail[start:end]
        return super().fetch(start, end, read)


def test_an_early_check_that_hangs_costs_the_confirm_its_own_check_not_the_wait(pauses):
    source = HangingTail()
    pin = _pin(source)
    with pin.fetching(_ahead()) as fetch:
        pin.confirm(time.monotonic(), fetch, 0)  # one check that passed: how long a check takes
    source.hang.set()
    try:
        with pin.fetching(_ahead()) as fetch:
            fetch.answered()  # the early check goes out, and its answer does not come
            assert wait_until(lambda: source.asked == 2, 10.0)
            pin.confirm(fetch.answered_at, fetch, 0)  # waits about a check's time, then checks itself
            assert source.asked == 3
    finally:
        source.release.set()
