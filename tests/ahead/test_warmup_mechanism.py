"""The byte warm-up's mechanism (``ckptfs.ahead.warmup``) handed files it knows only by its ``WarmFile``
protocol: an in-memory file and store that record what is claimed, fetched and stored, on the process's real
worker pools (its runtime's) and a real origin limit. The remote adapter over real servers is tests/commands/
test_prefetch_command.py's; here the mechanism's own rules: every missing chunk once, within the origin's
limit and the share; a failed piece or a full store ends it with its line; chunks still missing after the
passes are fetched once more, then reported; a background warm-up's status."""

from __future__ import annotations

import threading
import time

from ckptfs.ahead.limits import HeldSlot, OriginLimit
from ckptfs.ahead.warmup import BackgroundWarmup, Progress, StopSignal, WarmupReport, fetch_missing
from ckptfs.core.runtime import runtime
from ckptfs.workers.scheduler import WORKERS, Scheduler
from conftest import wait_until

CHUNK = 64 << 10
MiB = 1 << 20


class MemoryFile:
    """A ``WarmFile`` whose store is a set of chunk numbers: fetching a run stores its chunks, unless told to
    fail or to lose some. Records the runs fetched and the most pieces in flight at once."""

    chunk = CHUNK
    piece_bytes = MiB
    timeout = 5.0

    def __init__(self, size: int, stored: set[int] | None = None, limit: int = 4) -> None:
        self.name = "mem://model.gguf"
        self.size = size
        self.limit = OriginLimit(initial=limit, floor=limit, ceiling=limit)
        self.stored: set[int] = set(stored or ())
        self.fetched: list[tuple[int, int]] = []
        self.fail_at: int | None = None     # a run starting here fails
        self.lose: set[int] = set()         # chunks not kept the first time they are fetched
        self.never: set[int] = set()        # chunks the store never keeps
        self.full_after: int | None = None  # the store takes no more once this many runs were fetched
        self.most_in_flight = 0
        self._lock = threading.Lock()
        # with room for more than one, the first piece waits (a while at most) for a second to be started
        # beside it: pieces in parallel are then seen whatever the machine's load
        self._parallel = threading.Event()
        if limit == 1:
            self._parallel.set()

    @property
    def chunks(self) -> int:
        return -(-self.size // CHUNK)

    def origin_limit(self) -> OriginLimit:
        return self.limit

    def workers(self) -> Scheduler:
        return runtime().get(WORKERS)

    def unstored_chunks(self) -> list[int]:
        with self._lock:
            return [i for i in range(self.chunks) if i not in self.stored]

    def fetches_under_way(self, indexes: list[int]) -> list[object]:
        return []

    def claim(self, c0: int, c1: int) -> list[tuple[int, int]]:
        return [(c0, c1)]

    def abandon(self, runs: list[tuple[int, int]], error: BaseException) -> None:
        pass

    def fetch_piece(self, runs: list[tuple[int, int]], slot: HeldSlot) -> Exception | None:
        with self._lock:
            self.most_in_flight = max(self.most_in_flight, self.limit.in_flight)
            if self.limit.in_flight > 1:
                self._parallel.set()
        self._parallel.wait(5)
        time.sleep(0.001)  # a request's round trip: the other pieces start meanwhile
        with self._lock:
            self.most_in_flight = max(self.most_in_flight, self.limit.in_flight)
        slot.release()
        with self._lock:
            self.fetched += runs
            for a, b in runs:
                if a == self.fail_at:
                    return OSError(f"{self.name}: chunks {a}..{b}: connection reset")
                for i in range(a, b):
                    if i in self.never or i in self.lose:
                        self.lose.discard(i)
                        continue
                    self.stored.add(i)
        return None

    def store_trouble(self) -> str | None:
        with self._lock:
            full = self.full_after is not None and len(self.fetched) >= self.full_after
        return f"{self.name}: the cache folder takes no more bytes: full" if full else None

    def unstored_error(self, left: list[int]) -> str:
        return f"{self.name}: {len(left)} chunks are not in the cache folder after fetching"

    def fetched_chunks(self) -> list[int]:
        return sorted(i for a, b in self.fetched for i in range(a, b))


def run(file: MemoryFile, share: float = 1.0) -> WarmupReport:
    missing = file.unstored_chunks()
    report = WarmupReport(total=file.size, files=1, cached=file.size - len(missing) * CHUNK)
    fetch_missing([(file, missing)], report, share=share)
    return report


def test_every_missing_chunk_is_fetched_once_within_the_origins_limit():
    file = MemoryFile(16 * MiB, stored={0, 1, 2, 100, 101})
    seen: list[tuple[int, int]] = []
    missing = file.unstored_chunks()
    report = WarmupReport(total=file.size, files=1, cached=5 * CHUNK)
    fetch_missing([(file, missing)], report, progress=lambda done, total: seen.append((done, total)))
    assert report.errors == [] and not report.stopped
    assert file.fetched_chunks() == missing  # each missing chunk once, none of those stored before
    assert report.fetched == len(missing) * CHUNK
    assert file.unstored_chunks() == []
    assert 1 < file.most_in_flight <= file.limit.limit  # pieces in parallel, never past the origin's limit
    assert file.limit.in_flight == 0  # every slot given back
    assert seen[0] == (5 * CHUNK, file.size) and max(seen) == (file.size, file.size)


def test_a_mounts_share_leaves_the_readers_half_of_the_origins_slots():
    file = MemoryFile(16 * MiB, limit=8)
    report = run(file, share=0.5)
    assert report.errors == [] and file.unstored_chunks() == []
    assert file.most_in_flight <= 4


def test_a_failed_piece_ends_the_warm_up_with_its_line():
    file = MemoryFile(64 * MiB, limit=1)
    file.fail_at = 16  # the second piece (16 chunks of 64 KiB each)
    report = run(file)
    assert report.errors == [f"{file.name}: chunks 16..32: connection reset"]
    assert len(file.unstored_chunks()) > file.chunks // 2  # no piece started after it
    assert file.limit.in_flight == 0


def test_a_store_that_takes_no_more_ends_the_warm_up_at_once():
    file = MemoryFile(64 * MiB, limit=1)
    file.full_after = 2
    report = run(file)
    assert report.errors == [f"{file.name}: the cache folder takes no more bytes: full"]
    assert len(file.fetched) < 6


def test_a_chunk_lost_once_is_fetched_again_and_one_never_kept_is_reported():
    file = MemoryFile(4 * MiB)
    file.lose = {3, 40}
    report = run(file)
    assert report.errors == [] and file.unstored_chunks() == []
    assert file.fetched_chunks().count(3) == 2 and file.fetched_chunks().count(40) == 2

    stuck = MemoryFile(4 * MiB)
    stuck.never = {7}
    report = run(stuck)
    assert report.errors == [f"{stuck.name}: 1 chunks are not in the cache folder after fetching"]
    assert stuck.fetched_chunks().count(7) == 2  # the second pass tried it once more


class MemoryTarget:
    """A ``Target`` for a ``BackgroundWarmup``: the file above, warmed on the warm-up's thread."""

    def __init__(self, file: MemoryFile) -> None:
        self.file = file

    def warm(self, stop: StopSignal, progress: Progress, share: float) -> WarmupReport:
        missing = self.file.unstored_chunks()
        report = WarmupReport(total=self.file.size, files=1)
        fetch_missing([(self.file, missing)], report, stop=stop, progress=progress, share=share)
        return report

    def stored(self) -> int:
        return len(self.file.stored) * CHUNK


def test_a_background_warm_up_runs_its_target_and_says_how_it_went():
    file = MemoryFile(8 * MiB)
    warmup = BackgroundWarmup(lambda: MemoryTarget(file), "model", share=0.5).start()
    assert wait_until(lambda: not warmup.running, timeout=60)
    status = warmup.status()
    assert status["state"] == "done", status
    assert status["stored_bytes"] == status["total_bytes"] == file.size
    assert status["fetched_bytes"] == file.size and "error" not in status


def test_a_background_warm_up_whose_files_cannot_be_had_fails_with_one_line():
    def target() -> MemoryTarget:
        raise OSError("the folder's listing is gone")

    warmup = BackgroundWarmup(target, "model").start()
    assert wait_until(lambda: not warmup.running, timeout=60)
    status = warmup.status()
    assert status["state"] == "failed" and status["error"] == "OSError: the folder's listing is gone", status
    assert status["stored_bytes"] == 0
