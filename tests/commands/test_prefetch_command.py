"""``ckptfs prefetch URL --cache-dir DIR``: every stored byte of a remote checkpoint into the cache folder.

Debian's nginx serves generated GGUF files on loopback (its access log is what the origin saw, with the
Range of every request); the project's fault proxy stands in front of it where the origin must fail. The
oracle for values is gguf-py reading the files themselves. What is proved:

- after a prefetch, a fresh mount with the same ``--cache-dir`` serves every tensor, values equal to
  gguf-py's, with no request for bytes at the origin (only each open's 4 KiB probe of the first bytes and the 4 KiB tail
  nginx's weak ETag asks for);
- an interrupted run (the origin refuses every request after a few) fails with one line, and a second run
  fetches only the rest: each chunk the first run did not store, once, and none that it did;
- a split GGUF has every shard warmed;
- a 404, a dead server, a missing --cache-dir, a --cache-dir-size too small and a full disk are one line and
  a non-zero exit, and nothing wrong is left in the folder;
- ``mount --prefetch`` warms the folder in the background, and unmounting stops it cleanly; Ctrl-C ends a run
  with one line, nothing fetched after it;
- behind a per-request capped nginx (``limit_rate``) the warm-up keeps many ranges in flight (the fault
  proxy counts them), and an origin answering 503 now and then still gives every byte.
"""

from __future__ import annotations

import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("urllib3")

from cli_runs import one_error_line, run_cli
from conftest import REPO, nginx_origin, require_nginx, tmpfs, wait_until
from loopback.faultproxy import FaultProxy
from fixtures import quantized, write_gguf
from multifile_sets import gguf_reference, gguf_tensors, write_split_gguf
from loopback.servers import Nginx, OPEN_HEAD, WEAK_ETAG_TAIL, data_ranges, free_port

from ckptfs.sources.remote.store.chunks import CHUNK
from ckptfs.cache.disk import DiskStore
from ckptfs.sources.remote.store.sparse_store import HEADER_SIZE as SPARSE_HEADER, RECORD

MiB = 1 << 20


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    def fill(root):
        rng = np.random.default_rng(27)
        write_gguf(root / "model.gguf", {
            "blk.0.q8": (quantized("Q8_0", (256, 4096), rng), "Q8_0"),
            "blk.0.q4k": (quantized("Q4_K", (256, 4096), rng), "Q4_K"),
            "blk.1.f32": (rng.standard_normal((512, 1024)).astype(np.float32), "F32"),
            "blk.1.f16": (rng.standard_normal((300, 1000)).astype(np.float16), "F16"),
        })
        (root / "copy.gguf").write_bytes((root / "model.gguf").read_bytes())  # its own log lines per test
        (root / "other.gguf").write_bytes((root / "model.gguf").read_bytes())
        (root / "primary.gguf").write_bytes((root / "model.gguf").read_bytes())
        (root / "mirror.gguf").write_bytes((root / "model.gguf").read_bytes())
        (root / "early.gguf").write_bytes((root / "model.gguf").read_bytes())
        write_split_gguf(root / "split", gguf_tensors(count=6), per_shard=2)
        write_gguf(root / "big.gguf", {"w": (rng.standard_normal((1536, 4096)).astype(np.float32), "F32")})  # 24 MiB
        (root / "resume.gguf").write_bytes((root / "big.gguf").read_bytes())
        (root / "full.gguf").write_bytes((root / "big.gguf").read_bytes())
        (root / "spread.gguf").write_bytes((root / "big.gguf").read_bytes())
        (root / "junk.gguf").write_bytes(rng.integers(0, 256, 24 << 20, dtype=np.uint8).tobytes())  # no checkpoint

    with nginx_origin(tmp_path_factory, fill) as (server, root, _):
        yield server, root


def _stored_chunks(cache: Path) -> int:
    """The chunks the folder's store holds: the present records of every remote file's index
    (``sparse_store.py``: 24 bytes per chunk after a 64-byte header, a non-zero length for a stored one)."""
    count = 0
    for index in (cache / "remote").glob("*/*.idx"):
        raw = index.read_bytes()[SPARSE_HEADER:]
        count += sum(1 for at in range(0, len(raw) - RECORD + 1, RECORD) if raw[at + 16: at + 20] != bytes(4))
    return count


def _assert_values_equal_gguf_py(mnt: Path, paths: list[str]) -> int:
    count = 0
    for name, values, _, _ in gguf_reference(paths):
        served = np.load(mnt / f"{name}.npy")
        np.testing.assert_array_equal(served, np.asarray(values, dtype=served.dtype))
        count += 1
    return count


def test_a_prefetched_folder_serves_every_tensor_without_a_request_for_bytes(origin, tmp_path, mounted):
    server, root = origin
    url, cache = f"{server.url}/model.gguf", tmp_path / "cache"
    size = (root / "model.gguf").stat().st_size
    before = len(server.access_log())
    result = run_cli("prefetch", url, "--cache-dir", str(cache), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("prefetch: fetched ") and result.stdout.count("\n") == 1, result.stdout
    assert "0 B already cached" in result.stdout
    fetched = data_ranges(server.ranges("model.gguf", before), size)
    assert sum(b - a for a, b in fetched) == size  # every byte once, none twice
    assert _stored_chunks(cache) == -(-size // CHUNK)
    before = len(server.access_log())
    again = run_cli("prefetch", url, "--cache-dir", str(cache), timeout=120)  # complete: nothing to fetch
    # one probe of the first 4 KiB, which the warm-up started before the open and the open share, and the weak
    # ETag's tail check; no byte of data
    assert again.returncode == 0 and "fetched 8.0 KiB" in again.stdout, (again.stdout, again.stderr)
    server.wait_idle()  # nginx logs a request once its answer is sent
    assert sorted(server.ranges("model.gguf", before)) == [(0, OPEN_HEAD), (size - WEAK_ETAG_TAIL, size)]

    before = len(server.access_log())
    mnt = mounted(url, "--cache-dir", str(cache), "--cache-size", "0")
    assert _assert_values_equal_gguf_py(mnt, [str(root / "model.gguf")]) == 4
    assert (mnt / "model.gguf").read_bytes() == (root / "model.gguf").read_bytes()  # the header bytes too
    seen = server.ranges("model.gguf", before)
    assert seen and data_ranges(seen, size) == [], seen  # the open's probe and tail check only


def test_the_first_request_goes_out_before_numpy_and_the_formats_are_imported():
    """What ``ckptfs prefetch URL`` imports before its first request (the command line, the remote layer, the
    store) leaves numpy, the formats and the codecs out: they are imported beside the first requests
    (about 40 ms of a 2-core machine's start, before the first byte of a small model)."""
    code = ("import sys\n"
            "import ckptfs.commands.cli, ckptfs.commands.prefetch, ckptfs.sources.plan\n"
            "import ckptfs.sources.remote.http, ckptfs.sources.remote.warmup\n"
            "print(sorted(m for m in ('numpy', 'ckptfs.formats', 'ckptfs.quant', 'ckptfs.checkpoint.api')"
            " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_what_the_open_stores_is_not_counted_as_already_cached(origin, tmp_path, monkeypatch):
    """The summary's "already cached" is what the folder held before the run. The checkpoint's open stores
    the header chunks it reads, and it may do so before the early warm-up's source is made (forced here: a
    source made off the main thread waits until the open has returned); those chunks are this run's."""
    import threading

    from click.testing import CliRunner

    import ckptfs.checkpoint.api as api
    from ckptfs.commands.cli import main
    from ckptfs.sources.plan import SourcePlan

    server, root = origin
    opened = threading.Event()
    real_open, real_opener = api.open_with, SourcePlan.opener

    def open_then_tell(*args, **kwargs):
        try:
            return real_open(*args, **kwargs)
        finally:
            opened.set()

    def opener_after_the_open(self, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            assert opened.wait(60)
        return real_opener(self, *args, **kwargs)

    monkeypatch.setattr(api, "open_with", open_then_tell)
    monkeypatch.setattr(SourcePlan, "opener", opener_after_the_open)
    cache = tmp_path / "cache"
    result = CliRunner().invoke(main, ["prefetch", f"{server.url}/early.gguf", "--cache-dir", str(cache)])
    assert result.exit_code == 0, result.output
    assert "0 B already cached" in result.output, result.output
    assert opened.is_set() and _stored_chunks(cache) == -(-(root / "early.gguf").stat().st_size // CHUNK)


def test_an_interrupted_run_is_finished_by_the_next_fetching_only_the_rest(origin, tmp_path):
    import threading

    server, root = origin
    size = (root / "resume.gguf").stat().st_size
    cache = tmp_path / "cache"
    # 0.2 s before each request and one piece in flight at a time: the run stores its chunks piece by piece
    with FaultProxy(server.url, first_byte_delay=0.2) as proxy:
        url = f"{proxy.url}/resume.gguf"
        before = len(server.access_log())
        runs: dict = {}
        runner = threading.Thread(target=lambda: runs.update(first=run_cli(
            "prefetch", url, "--cache-dir", str(cache), "--timeout", "10", timeout=120,
            CKPTFS_REMOTE_IN_FLIGHT="1")))
        runner.start()
        try:
            # a first piece is in (entries looked for, not a store made on the folder the run is creating) ...
            assert wait_until(lambda: _stored_chunks(cache) > 0, timeout=60)
        finally:
            proxy.always("403")  # ... then the origin refuses everything
            runner.join(120)
        first = runs["first"]
        # the 403 of a piece, or of the open's own reads when they came after it: one line, what was stored kept
        one_error_line(first, 1, "resume.gguf", "403", "in the cache folder")
        run1 = data_ranges(server.ranges("resume.gguf", before), size)
        stored = _stored_chunks(cache)
        assert 0 < stored < -(-size // CHUNK)

        proxy.always(None)
        before = len(server.access_log())
        second = run_cli("prefetch", url, "--cache-dir", str(cache), "--timeout", "10", timeout=120)
        assert second.returncode == 0, second.stderr
        run2 = data_ranges(server.ranges("resume.gguf", before), size)
        import ckptfs
        from ckptfs.sources.remote.warmup import remote_of

        with ckptfs.open(url, cache_dir=str(cache)) as ck:  # keys name the URL: asked through the proxy's
            assert remote_of(ck.sources.get(ck.files[0])).unstored_chunks() == []
            assert ck.sources.get(ck.files[0]).pread(0, size) == (root / "resume.gguf").read_bytes()
    chunks = -(-size // CHUNK)
    refetched = [i for a, b in run2 for i in range(a // CHUNK, -(-b // CHUNK))]
    # the second run fetched each chunk the first did not store, once, and none that it did store
    assert len(refetched) == len(set(refetched)) == chunks - stored, (stored, run2)
    assert 0 < sum(b - a for a, b in run2) < size and run1
    assert _stored_chunks(cache) == chunks


def test_pieces_the_primary_fails_come_from_the_mirror_and_are_kept_as_the_primarys(origin, tmp_path, mounted):
    server, root = origin
    size = (root / "primary.gguf").stat().st_size
    cache = tmp_path / "cache"
    with FaultProxy(server.url) as proxy:
        primary = f"{proxy.url}/primary.gguf"
        proxy.plan(*[""] * 4)  # the primary opens (probe, tail, header and its tail check) ...
        proxy.always("403")    # ... and then refuses every piece
        before = len(server.access_log())
        result = run_cli("prefetch", primary, "--mirror", f"{server.url}/mirror.gguf", "--cache-dir", str(cache),
                         "--timeout", "10", timeout=120)
        assert result.returncode == 0, result.stderr
        from_mirror = data_ranges(server.ranges("mirror.gguf", before), size)
        assert from_mirror and proxy.faults_used.count("403") >= 1
        proxy.always(None)
        before = len(server.access_log())
        mnt = mounted(primary, "--cache-dir", str(cache), "--cache-size", "0")  # the primary alone, healthy now
        assert _assert_values_equal_gguf_py(mnt, [str(root / "primary.gguf")]) == 4
        assert data_ranges(server.ranges("primary.gguf", before), size) == []


def test_every_shard_of_a_split_gguf_is_warmed(origin, tmp_path, mounted):
    server, root = origin
    shards = sorted((root / "split").glob("model-*-of-*.gguf"))
    assert len(shards) == 3
    cache = tmp_path / "cache"
    url = f"{server.url}/split/{shards[0].name}"
    result = run_cli("prefetch", url, "--cache-dir", str(cache), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "3 remote files" in result.stdout, result.stdout
    assert _stored_chunks(cache) == sum(-(-p.stat().st_size // CHUNK) for p in shards)
    before = len(server.access_log())
    mnt = mounted(url, "--cache-dir", str(cache), "--cache-size", "0")
    assert _assert_values_equal_gguf_py(mnt, [str(p) for p in shards]) == 6
    for shard in shards:
        seen = server.ranges(f"split/{shard.name}", before)
        assert data_ranges(seen, shard.stat().st_size) == [], (shard.name, seen)


def test_the_warm_ups_last_round_is_spread_over_the_origins_slots(origin, tmp_path):
    """Behind an origin that caps each request, a warm-up's end is as slow as its largest last request: the
    rest is split over the limit's slots (here pinned at 2) once, so its last requests are smaller than its
    first and one per slot (not smaller and smaller as each starts), and every byte is still asked for once."""
    server, root = origin
    size = (root / "spread.gguf").stat().st_size
    before = len(server.access_log())
    result = run_cli("prefetch", f"{server.url}/spread.gguf", "--cache-dir", str(tmp_path / "cache"),
                     CKPTFS_REMOTE_IN_FLIGHT="2", timeout=120)
    assert result.returncode == 0, result.stderr
    fetched = sorted(data_ranges(server.ranges("spread.gguf", before), size))
    assert sum(b - a for a, b in fetched) == size and all(a == b for (_, a), (b, _) in pairwise(fetched))
    sizes = [b - a for a, b in fetched]
    assert max(sizes) == 4 * MiB and sizes[-1] < 4 * MiB and sizes[-2] < 4 * MiB, sizes
    # the last round: one piece per slot. (The first 4 MiB may come in smaller requests too: the open reads
    # the header's first 2 MiB beside the warm-up, and on a loaded machine it can ask before the warm-up has
    # claimed them; the warm-up then fetches the rest of that piece.)
    assert len([b - a for a, b in fetched if b - a < 4 * MiB and a >= 4 * MiB]) == 2, fetched


def test_a_file_that_is_no_checkpoint_is_refused_after_its_first_read_not_fetched_whole(origin, tmp_path):
    """The format check judges the file's first bytes, which the open's first request brought, before the
    warm-up starts a piece: a file that is no checkpoint (24 MiB here) costs that request and nothing more,
    with the origin's limit pinned at 2 requests or not."""
    server, root = origin
    size = (root / "junk.gguf").stat().st_size
    before = len(server.access_log())
    for pinned in ({"CKPTFS_REMOTE_IN_FLIGHT": "2"}, {}):
        result = run_cli("prefetch", f"{server.url}/junk.gguf", "--cache-dir", str(tmp_path / "cache"), **pinned)
        one_error_line(result, 1, "junk.gguf", "not a GGUF or safetensors file")
    server.wait_idle()  # nginx logs a request once its answer is sent
    asked = server.ranges("junk.gguf", before)
    assert asked and data_ranges(asked, size) == [], asked  # the probes of the first bytes (and the tail's)


def test_failures_are_one_line_and_leave_nothing_wrong(origin, tmp_path):
    server, _ = origin
    cache = tmp_path / "cache"
    one_error_line(run_cli("prefetch", f"{server.url}/missing.gguf", "--cache-dir", str(cache)), 1,
                   "missing.gguf", "404")
    dead = f"http://127.0.0.1:{free_port()}/model.gguf"
    one_error_line(run_cli("prefetch", dead, "--cache-dir", str(cache), "--timeout", "3", timeout=60), 1,
                   "model.gguf")
    one_error_line(run_cli("prefetch", f"{server.url}/model.gguf"), 2, "--cache-dir")
    assert _stored_chunks(cache) == 0


def test_a_cache_dir_size_too_small_is_refused_before_fetching(origin, tmp_path):
    server, root = origin
    size = (root / "other.gguf").stat().st_size
    before = len(server.access_log())
    result = run_cli("prefetch", f"{server.url}/other.gguf", "--cache-dir", str(tmp_path / "c"),
                     "--cache-dir-size", str(size))  # the file fits, but not with its entries' headers in 90 %
    one_error_line(result, 1, "--cache-dir-size", "give a larger")
    fetched = data_ranges(server.ranges("other.gguf", before), size)
    assert sum(b - a for a, b in fetched) <= 2 * MiB  # the open's header read, then nothing


def test_a_checkpoint_bigger_than_the_file_system_is_refused_before_it_fetches(origin, tmp_path):
    server, root = origin
    size = (root / "full.gguf").stat().st_size  # 24 MiB into a 3 MiB file system
    with tmpfs(tmp_path / "small", "3m") as small:
        cache = small / "cache"
        before = len(server.access_log())
        result = run_cli("prefetch", f"{server.url}/full.gguf", "--cache-dir", str(cache), timeout=120)
        one_error_line(result, 1, "full.gguf", "24.0 MiB to fetch do not fit", "3.0 MiB free",
                       "--cache-dir-min-free 5%", "give a --cache-dir on a file system with room")
        server.wait_idle()
        assert data_ranges(server.ranges("full.gguf", before), size) == []  # its size probe alone
        assert _stored_chunks(cache) == 0


def test_a_read_only_cache_folder_is_one_line_that_says_what_to_do(origin, tmp_path):
    import subprocess

    server, _ = origin
    with tmpfs(tmp_path / "ro", "8m") as ro:
        DiskStore(ro / "cache", 1 << 30, "bytes")  # a folder made before (its key in place) ...
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)  # ... then mounted read-only
        before = len(server.access_log())
        result = run_cli("prefetch", f"{server.url}/copy.gguf",
                         "--cache-dir", str(ro / "cache"), timeout=120)
        one_error_line(result, 1, "copy.gguf", "takes no more bytes", "not writable", "make it writable")
        size = (origin[1] / "copy.gguf").stat().st_size
        fetched = sum(b - a for a, b in data_ranges(server.ranges("copy.gguf", before), size))
        assert fetched < 2 * size  # ended at the first piece, not after four passes over the whole file


def test_chunks_a_reader_is_fetching_are_waited_for_not_called_missing(origin, tmp_path):
    """A reader's fetch under way (its read-ahead claimed the chunks, so the warm-up leaves them to it) lands
    after the warm-up's own pieces: the warm-up waits for it and ends complete, every chunk in the store,
    none fetched twice."""
    import threading

    import ckptfs
    from ckptfs.sources.remote.warmup import checkpoint_sources, remote_of, warm

    server, root = origin
    cache = tmp_path / "cache"
    size = (root / "primary.gguf").stat().st_size
    with ckptfs.open(f"{server.url}/primary.gguf", cache_dir=str(cache)) as ck:
        sources = checkpoint_sources(ck)
        remote = remote_of(sources[0])
        last = -(-size // CHUNK)
        runs = remote.claim(last - 8, last)  # a reader's fetch of the file's last 8 chunks, under way ...
        assert runs == [(last - 8, last)]
        before = len(server.access_log())
        lands = threading.Timer(2.0, remote.fetch_claimed, args=(runs,))  # ... landing after the warm-up's
        lands.start()
        try:
            report = warm(sources)
        finally:
            lands.join()
    assert report.ok, report.errors
    assert _stored_chunks(cache) == last
    fetched = data_ranges(server.ranges("primary.gguf", before), size)
    covered = sorted(c for a, b in fetched for c in range(a // CHUNK, -(-b // CHUNK)))
    assert len(covered) == len(set(covered)), fetched  # every chunk fetched once: the reader's by the reader


def test_mount_prefetch_fills_the_folder_in_the_background(origin, tmp_path, mounted):
    server, root = origin
    cache = tmp_path / "cache"
    size = (root / "other.gguf").stat().st_size
    log = tmp_path / "mount.log"
    mnt = mounted(f"{server.url}/other.gguf", "--cache-dir", str(cache), "--prefetch", "--log-file", str(log))
    assert wait_until(lambda: _stored_chunks(cache) == -(-size // CHUNK), timeout=60)
    assert wait_until(lambda: "warm-up of" in log.read_text() and "done" in log.read_text(), timeout=30), \
        log.read_text()
    assert "failed" not in log.read_text()
    # the mount's stats say so too: its state, and the bytes in the folder (measured there) of the total
    from conftest import mount_stats

    stats = mount_stats(mnt)
    status = stats["warmup"]
    assert status["state"] == "done" and status["stored_bytes"] == status["total_bytes"] == size, status
    assert stats["prefetch"] == status  # the key's older name, kept as an alias
    shown = run_cli("stats", str(mnt))
    assert shown.returncode == 0 and "warm-up: done, " in shown.stdout, shown.stdout


def test_mount_prefetch_into_a_full_disk_says_so_in_its_stats_and_keeps_serving(origin, tmp_path, mounted):
    from conftest import mount_stats

    server, root = origin
    with tmpfs(tmp_path / "small", "3m") as small:
        mnt = mounted(f"{server.url}/copy.gguf", "--cache-dir", str(small / "cache"), "--prefetch")
        assert wait_until(lambda: mount_stats(mnt)["warmup"]["state"] == "failed", timeout=60), \
            mount_stats(mnt)["warmup"]
        status = mount_stats(mnt)["warmup"]
        assert "do not fit in the cache folder" in status["error"], status  # refused before fetching
        assert 0 < status["stored_bytes"] < 3 * MiB, status  # the open's header chunks, measured
        assert "warm-up: failed; " in run_cli("stats", str(mnt)).stdout
        # and reads go on: every tensor as gguf-py reads it, the bytes fetched as they are needed
        _assert_values_equal_gguf_py(mnt, [str(root / "copy.gguf")])


def test_mount_prefetch_needs_a_cache_dir(origin, tmp_path):
    server, _ = origin
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    one_error_line(run_cli("mount", f"{server.url}/other.gguf", str(mnt), "--prefetch"), 2, "--cache-dir")


def test_unmount_stops_a_background_prefetch_cleanly(origin, tmp_path, mounted):
    from conftest import mount_stats, pid_alive

    server, _ = origin
    log = tmp_path / "mount.log"
    with FaultProxy(server.url) as proxy:
        proxy.plan(*[""] * 4)       # the open at its pace ...
        proxy.always("slow:2")      # ... then every piece (and each version check after one) takes 2 s
        mnt = mounted(f"{proxy.url}/big.gguf", "--cache-dir", str(tmp_path / "cache"), "--prefetch",
                      "--log-file", str(log))
        pid = mount_stats(mnt)["pid"]
        assert wait_until(lambda: "warm-up of" in log.read_text(), timeout=30), log.read_text()
        result = run_cli("umount", str(mnt))
        assert result.returncode == 0, result.stderr
        assert wait_until(lambda: not pid_alive(pid), timeout=60)  # the pieces in flight end, nothing new starts
    text = log.read_text()
    assert "warm-up of" in text and "stopped" in text and "Traceback" not in text, text


def _settled(proxy: FaultProxy, quiet: float = 0.5):
    """A predicate: no new request reached the proxy for ``quiet`` seconds."""
    seen = {"n": -1, "at": time.monotonic()}

    def check() -> bool:
        n = proxy.requests["GET"]
        if n != seen["n"]:
            seen["n"], seen["at"] = n, time.monotonic()
        return time.monotonic() - seen["at"] >= quiet

    return check


SLOW_PIECE_S = 8


def test_ctrl_c_ends_a_run_at_once_and_keeps_what_it_stored(origin, tmp_path):
    import signal
    import subprocess

    from conftest import DEFAULT_SIGNALS, ckptfs_cli, cli_env

    server, root = origin
    size = (root / "big.gguf").stat().st_size
    cache = tmp_path / "cache"
    with FaultProxy(server.url) as proxy:
        proxy.plan(*[""] * 4)
        # every piece takes 8 s: the first round is still in flight when the interrupt is sent, however loaded
        # the machine
        proxy.always(f"slow:{SLOW_PIECE_S}")
        env = cli_env()
        env.pop("CKPTFS_CACHE_DIR", None)
        # (SIGINT as at a terminal: run as a shell's background job, the suite's children ignore it)
        proc = subprocess.Popen([*DEFAULT_SIGNALS, *ckptfs_cli(), "prefetch", f"{proxy.url}/big.gguf", "--cache-dir",
                                 str(cache)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert wait_until(lambda: proxy.requests["GET"] >= 8, timeout=30)  # the open, the first pieces
            assert wait_until(_settled(proxy), timeout=30)  # every piece of the first round is on its way
            server.wait_idle()  # and in nginx's log (it logs a request once it has sent the answer to the proxy)
            at_interrupt = len(server.access_log())
            assert proc.poll() is None, proc.communicate()  # the run is under way: its first round in flight
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        later = data_ranges(server.ranges("big.gguf", at_interrupt), size)
    assert proc.returncode == 130, (out, err)
    assert err.strip().count("\n") == 0 and "interrupted" in err and "Traceback" not in err, err
    assert later == []  # the pieces in flight ended; none was started on the way out
    assert 0 < _stored_chunks(cache) <= -(-size // CHUNK)


# -- against a per-request capped origin (as a CDN or object store is) ---------------------------------------

@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """96 MiB behind nginx's ``limit_rate 6m`` (a 4 MiB piece takes 0.7 s): speed comes only from ranges in
    flight at once."""
    require_nginx()
    root = tmp_path_factory.mktemp("capped")
    rng = np.random.default_rng(3)
    write_gguf(root / "wide.gguf", {"w": (rng.standard_normal((6144, 4096)).astype(np.float32), "F32")})
    (root / "throttled.gguf").write_bytes((root / "wide.gguf").read_bytes())
    with Nginx(root, limit_rate="6m") as server:
        yield server, root


def _read_back(url: str, cache: Path, expected: bytes) -> None:
    import ckptfs

    with ckptfs.open(url, cache_dir=str(cache)) as ck:
        assert ck.sources.get(ck.files[0]).pread(0, len(expected)) == expected


def test_a_capped_origin_gets_many_ranges_in_flight(capped, tmp_path):
    server, root = capped
    cache = tmp_path / "cache"
    with FaultProxy(server.url) as proxy:
        result = run_cli("prefetch", f"{proxy.url}/wide.gguf", "--cache-dir", str(cache), timeout=300)
        assert result.returncode == 0, result.stderr
        # the origin's whole initial limit from the first round on (the scheduler's old 4 workers kept 4);
        # how far it climbs from there is the limit's to learn (tests/sources/test_remote_parallel.py)
        assert proxy.peak_in_flight >= 8, proxy.peak_in_flight
        _read_back(f"{proxy.url}/wide.gguf", cache, (root / "wide.gguf").read_bytes())


def test_an_origin_that_says_503_now_and_then_still_gets_every_byte(capped, tmp_path):
    server, root = capped
    cache = tmp_path / "cache"
    with FaultProxy(server.url) as proxy:
        proxy.every(7, "503")  # one request in seven refused: retried, and the origin's limit steps back
        result = run_cli("prefetch", f"{proxy.url}/throttled.gguf", "--cache-dir", str(cache), timeout=300)
        assert result.returncode == 0, result.stderr
        assert "503" in proxy.faults_used
        proxy.every(7, None)
        _read_back(f"{proxy.url}/throttled.gguf", cache, (root / "throttled.gguf").read_bytes())


def test_decode_after_the_bytes_fills_the_decoded_tier_too(origin, tmp_path):
    server, root = origin
    cache = tmp_path / "cache"
    url = f"{server.url}/model.gguf"
    result = run_cli("prefetch", url, "--cache-dir", str(cache), "--decode", timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("prefetch: fetched ") and lines[1].startswith("prefetched 4 tensors"), lines
    assert _stored_chunks(cache) == -(-(root / "model.gguf").stat().st_size // CHUNK)
    assert DiskStore(cache, 1 << 40, "bytes").usage()["blocks"]["files"] > 0  # the quantized tensors' groups
