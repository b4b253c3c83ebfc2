"""The remote read-ahead window of a stream a mount's handle decided (``ckptfs.ahead.fetch``),
driven by hand over a source that records what it is asked to claim (no network: what is under test is which
chunks are fetched ahead, not how).

The handle advises a stream's bytes once; the source's window then follows its reader. The kernel's
neighbouring requests of one stream reach the daemon's threads out of order, so a read a few reads behind
the reader is part of the stream: it must not drop the window (nothing would advise it again, and every
later read would fetch only its own bytes). The window stops where the advice ends: what comes after the
advised bytes (the next tensor's file, or nothing) is the handle's to say. A fetch ahead gives its origin
slot back once, when its body is in or when it ends. A stream's chunks its reader has read past are dropped
from memory, never one a late neighbouring request may still ask for. From a fast origin the window is what
the origin's measured speed asks for (``OriginLimit.reach``), not the whole budget.
"""

from __future__ import annotations

import threading

from conftest import wait_until

from ckptfs.sources.remote.store.chunks import CHUNK
from ckptfs.ahead.limits import OriginLimit
from ckptfs.ahead import fetch as fetch_ahead
from ckptfs.sources.remote.context import ReadContext, Slot
from ckptfs.ahead.fetch import ReadAhead, Run
from ckptfs.sources.remote.options import RemoteOptions

MiB = 1 << 20


class RecordingSource:
    """What ``ReadAhead`` needs of a source (``ckptfs.ahead.fetch.Fetches``); claims are recorded, fetches land at once."""

    def __init__(self, size: int) -> None:
        self.options = RemoteOptions()
        self.size = size
        self.piece_bytes = 4 * MiB
        self.chunk = CHUNK
        self.limit = OriginLimit(initial=4)
        self.claimed: set[int] = set()
        self.forgotten: set[int] = set()  # chunks read-ahead dropped from memory (``forget``)
        self.lock = threading.Lock()

    @property
    def closed(self) -> bool:
        return False

    def origin_limit(self) -> OriginLimit:
        return self.limit

    def claim(self, c0: int, c1: int) -> list[Run]:
        with self.lock:
            new = [i for i in range(c0, c1) if i not in self.claimed]
            self.claimed.update(new)
        return [(new[0], new[-1] + 1)] if new else []

    def fetch_claimed(self, runs: list[Run], memory: bool = True, slot: Slot | None = None) -> Exception | None:
        return None

    def abandon(self, runs: list[Run], error: BaseException) -> None:
        pass

    def forget(self, c0: int, c1: int) -> None:
        with self.lock:
            self.forgotten.update(range(c0, c1))

    def forget_fetches(self) -> None:
        pass

    def furthest(self) -> int:
        with self.lock:
            return max(self.claimed, default=-1) + 1


def _start_stream(ahead: ReadAhead) -> None:
    """The first two 1 MiB reads of a stream a mount's handle decided (``decided``, as their scope says)."""
    ahead.observe(0, MiB, decided=True)
    ahead.observe(MiB, MiB, decided=True)


def _settled(source: RecordingSource) -> None:
    assert wait_until(lambda: source.limit.in_flight == 0, timeout=10)


def test_a_read_behind_the_reader_keeps_the_window_of_a_decided_stream(monkeypatch):
    monkeypatch.setattr(fetch_ahead, "FETCH_BUDGET", 8 * MiB)  # the window: 8 MiB ahead of the reader
    source = RecordingSource(64 * MiB)
    ahead = ReadAhead(source)
    _start_stream(ahead)
    ahead.follow_advice(2 * MiB // CHUNK, 64 * MiB // CHUNK, decided=True)  # the handle advises the rest, once
    _settled(source)
    assert source.furthest() * CHUNK == 10 * MiB  # 8 MiB ahead of the reader
    ahead.observe(3 * MiB, MiB, decided=True)
    ahead.observe(2 * MiB, MiB, decided=True)  # arrived after its neighbour
    for offset in range(4 * MiB, 20 * MiB, MiB):
        ahead.observe(offset, MiB, decided=True)
        _settled(source)
    assert source.furthest() * CHUNK == 28 * MiB  # still 8 MiB ahead of the reader at 20 MiB


def test_the_window_of_a_decided_stream_stops_where_its_advice_ends(monkeypatch):
    monkeypatch.setattr(fetch_ahead, "FETCH_BUDGET", 8 * MiB)
    source = RecordingSource(64 * MiB)
    ahead = ReadAhead(source)
    _start_stream(ahead)
    ahead.follow_advice(2 * MiB // CHUNK, 12 * MiB // CHUNK, decided=True)  # a tensor's rest: 10 MiB
    for offset in range(2 * MiB, 12 * MiB, MiB):
        ahead.observe(offset, MiB, decided=True)
        _settled(source)
    assert source.furthest() * CHUNK == 12 * MiB  # nothing of what lies after the advised bytes


def test_a_fetch_ahead_gives_its_slot_back_once_when_its_body_is_in():
    limit = OriginLimit(initial=2)
    started = []
    assert limit.try_start()
    slot = limit.held(then=lambda: started.append(limit.in_flight))
    read = ReadContext.fetching_ahead(30.0, slot).bounded(10**9)  # an attempt's context carries the slot
    read.body_in()
    assert limit.in_flight == 0 and started == [0]  # given back, and the next piece may start now
    slot.release()  # the job's end: nothing more to give back
    read.body_in()
    assert limit.in_flight == 0 and started == [0]


class HeldSource(RecordingSource):
    """Fetches that land only when let go (``release``): the origin's slots stay taken meanwhile."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.gate = threading.Event()

    def fetch_claimed(self, runs: list[Run], memory: bool = True, slot: Slot | None = None) -> Exception | None:
        assert self.gate.wait(10)
        return None


def test_advice_away_from_the_reader_waits_for_a_slot_instead_of_being_dropped(monkeypatch):
    """A reader in file order has the files stored after the one it reads advised once, as ranges well past its
    window. Advice given while the origin's limit is taken by the stream's own pieces is started when those
    land; dropped, each of those files would be fetched only when read, one round trip each."""
    monkeypatch.setattr(fetch_ahead, "FETCH_BUDGET", 16 * MiB)
    source = HeldSource(256 * MiB)
    ahead = ReadAhead(source)
    advised = range(100 * MiB // CHUNK, 108 * MiB // CHUNK)
    _start_stream(ahead)
    ahead.follow_advice(2 * MiB // CHUNK, 18 * MiB // CHUNK, decided=True)  # the stream's rest: the limit's 4 slots taken
    assert wait_until(lambda: source.limit.in_flight == source.limit.limit, timeout=10)
    ahead.follow_advice(advised.start, advised.stop, decided=True)  # the files after it: no slot free now
    assert not any(c in source.claimed for c in advised)
    source.gate.set()  # the stream's pieces land
    for offset in range(2 * MiB, 90 * MiB, MiB):  # and the reader comes within the budget of the advice
        ahead.observe(offset, MiB, decided=True)
    assert wait_until(lambda: all(c in source.claimed for c in advised), timeout=10)
    _settled(source)


def test_advice_further_ahead_than_the_budget_waits_for_the_reader_to_come_near(monkeypatch):
    """Advice past ``FETCH_BUDGET`` from the reader is not fetched yet: with the rest of the reader's tensor
    advised up to the budget ahead, both would fill the chunk memory (twice the budget) with bytes not read
    yet and evict the ones the reader reaches next. It is fetched once the reader comes within the budget."""
    monkeypatch.setattr(fetch_ahead, "FETCH_BUDGET", 16 * MiB)
    source = RecordingSource(256 * MiB)
    ahead = ReadAhead(source)
    far = range(100 * MiB // CHUNK, 108 * MiB // CHUNK)
    _start_stream(ahead)
    ahead.follow_advice(far.start, far.stop, decided=True)  # the files stored after the reader's, advised once
    _settled(source)
    assert not any(c in source.claimed for c in far)
    for offset in range(2 * MiB, 90 * MiB, MiB):  # the reader goes on (its own bytes advised as it goes)
        ahead.follow_advice(offset // CHUNK, (offset + MiB) // CHUNK, decided=True)
        ahead.observe(offset, MiB, decided=True)
        _settled(source)
    assert all(c in source.claimed for c in far)


def test_a_stream_drops_the_chunks_its_reader_read_past_and_none_it_may_still_ask_for(monkeypatch):
    monkeypatch.setattr(fetch_ahead, "FETCH_BUDGET", 8 * MiB)
    source = RecordingSource(64 * MiB)
    ahead = ReadAhead(source)
    _start_stream(ahead)
    ahead.follow_advice(2 * MiB // CHUNK, 64 * MiB // CHUNK, decided=True)
    for offset in range(2 * MiB, 40 * MiB, MiB):
        ahead.observe(offset, MiB, decided=True)
    # the reader has read 40 MiB; a request up to SLACK_READS reads behind it still belongs to the stream
    slack = fetch_ahead.SLACK_READS * MiB // CHUNK
    assert source.forgotten == set(range(0, 40 * MiB // CHUNK - slack))
    ahead.observe(40 * MiB - slack * CHUNK, MiB, decided=True)  # a late neighbour: its chunks are still there
    assert not source.forgotten & set(range(40 * MiB // CHUNK - slack, 40 * MiB // CHUNK))


def test_a_read_elsewhere_drops_nothing_of_what_it_has_not_read(monkeypatch):
    """A new run starts where its first read is: the chunks before it (another reader's, the header) are not
    the new stream's to drop."""
    monkeypatch.setattr(fetch_ahead, "FETCH_BUDGET", 8 * MiB)
    source = RecordingSource(256 * MiB)
    ahead = ReadAhead(source)
    for offset in range(100 * MiB, 140 * MiB, MiB):  # a stream found here (no handle: sequential reads)
        ahead.observe(offset, MiB)
    assert min(source.forgotten) >= 100 * MiB // CHUNK  # nothing before where the stream began
    assert max(source.forgotten) < 140 * MiB // CHUNK
    source.forgotten.clear()
    for offset in range(10 * MiB, 20 * MiB, MiB):  # another stream, earlier in the file
        ahead.observe(offset, MiB)
    assert not source.forgotten  # not yet SLACK_READS reads past its start
    _settled(source)


def test_the_bytes_ahead_of_a_reader_are_what_the_origins_speed_asks_for():
    piece, budget = 4 * MiB, 128 * MiB
    limit = OriginLimit()
    assert limit.reach(piece, budget) == budget  # nothing timed yet
    limit.finished(MiB, MiB / 1.5e9)  # a short answer, out of the server's buffers at once: says nothing yet
    assert limit.reach(piece, budget) == budget
    limit.finished(4 * MiB, 4 * MiB / 20e6)  # 20 MB/s a request (a capped origin)
    assert limit.reach(piece, budget) == budget
    fast = OriginLimit()
    fast.finished(4 * MiB, 4 * MiB / 1.5e9)  # 1.5 GB/s a request (loopback)
    assert fast.reach(piece, budget) == fast_ahead(piece)
    fast.finished(4 * MiB, 4 * MiB / 100e6)  # a slower request later: the best one seen still says it
    assert fast.reach(piece, budget) == fast_ahead(piece)


def fast_ahead(piece: int) -> int:
    from ckptfs.ahead.limits import MIN_PIECES_AHEAD

    return MIN_PIECES_AHEAD * piece


def test_a_stream_from_a_fast_origin_keeps_fewer_bytes_ahead_than_the_budget(monkeypatch):
    monkeypatch.setattr(fetch_ahead, "FETCH_BUDGET", 128 * MiB)
    source = RecordingSource(512 * MiB)
    source.limit.finished(4 * MiB, 4 * MiB / 1.5e9)  # the origin answers a piece in under 3 ms
    ahead = ReadAhead(source)
    _start_stream(ahead)
    ahead.follow_advice(2 * MiB // CHUNK, 512 * MiB // CHUNK, decided=True)
    _settled(source)
    piece = fetch_ahead.piece_bytes(source.limit.limit, source.piece_bytes, CHUNK)
    assert source.furthest() * CHUNK == 2 * MiB + fast_ahead(piece)
