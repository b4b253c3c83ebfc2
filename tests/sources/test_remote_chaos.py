"""A mount of a remote checkpoint under a chaos of bad answers, read by many threads at once.

Debian's nginx on loopback serves a GGUF through ``faultproxy.FaultProxy`` in chaos mode: about 40% of the
requests get a fault (resets mid-body, 5xx, short bodies, stalls, a changed ETag, a 200 with the whole
file). Sixteen threads pread random ranges of the mount's files. What must hold:

- every answer is the file's right bytes from the offset asked: all of them, or a prefix when the kernel's
  page-by-page retry after a failed read-ahead returned what it had copied (the application's short count),
  or EIO — never other bytes;
- the daemon never sends a short reply (``short_replies`` 0 in the stats), so the kernel never takes one
  for the end of a file: every file's size is intact afterwards;
- once the faults stop, every byte of every file reads exact, and the daemon is alive.
"""

from __future__ import annotations

import errno
import os
import random
import threading

import numpy as np
import pytest

pytest.importorskip("urllib3")

from conftest import mount_stats, nginx_origin, pid_alive
from loopback.faultproxy import FaultProxy
from fixtures import write_gguf

MiB = 1 << 20
THREADS, READS = 16, 40
FAULTS = ("reset", "500", "503", "short", "stall:3", "etag", "norange")


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    def fill(root):
        rng = np.random.default_rng(5)
        write_gguf(root / "m.gguf", {f"t{i}": (rng.standard_normal((1024, 2048 + 256 * i)).astype(np.float32), "F32")
                                     for i in range(6)})

    with nginx_origin(tmp_path_factory, fill, "chaos-www") as (server, root, _):
        yield server, root


def _expected(mnt, root) -> dict[str, bytes]:
    """Every regular file of the mount and its bytes, from references: the GGUF itself, each tensor's .raw
    (its stored bytes, from gguf-py) and .npy (numpy's own file of the same array)."""
    import io

    import gguf

    reader = gguf.GGUFReader(str(root / "m.gguf"))
    files = {"m.gguf": (root / "m.gguf").read_bytes()}
    for tensor in reader.tensors:
        values = np.asarray(tensor.data)
        files[f"{tensor.name}.raw"] = values.tobytes()
        out = io.BytesIO()
        np.save(out, values)
        files[f"{tensor.name}.npy"] = out.getvalue()
    return files


def _hammer(mnt, files: dict[str, bytes], seed: int, tally: dict, lock: threading.Lock) -> None:
    rng = random.Random(seed)
    names = sorted(files)
    for _ in range(READS):
        name = rng.choice(names)
        want = files[name]
        size = rng.choice((4096, 65536, 300_000, MiB))
        offset = rng.randrange(0, max(1, len(want) - size // 2))
        fd = os.open(mnt / name, os.O_RDONLY)
        try:
            got = os.pread(fd, size, offset)
        except OSError as exc:
            assert exc.errno == errno.EIO, exc
            outcome = "eio"
        else:
            due = want[offset: offset + size]
            assert got == due[:len(got)], f"{name} @ {offset}: other bytes than the file's"
            outcome = "whole" if len(got) == len(due) else "prefix"
        finally:
            os.close(fd)
        with lock:
            tally[outcome] = tally.get(outcome, 0) + 1


def test_many_threads_under_chaos_get_right_bytes_no_short_reply_and_sizes_intact(origin, mounted):
    server, root = origin
    with FaultProxy(server.url) as proxy:
        mnt = mounted(proxy.url + "/m.gguf", "--timeout", "8", "--stall-timeout", "1", "--cache-size", "8M")
        files = _expected(mnt, root)
        assert sorted(files) == sorted(n for n in os.listdir(mnt) if n.endswith((".raw", ".npy", ".gguf")))
        proxy.chaos(0.4, FAULTS, seed=7)
        tally: dict[str, int] = {}
        lock = threading.Lock()
        errors: list[BaseException] = []

        def run(seed: int) -> None:
            try:
                _hammer(mnt, files, seed, tally, lock)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(seed,)) for seed in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert not any(thread.is_alive() for thread in threads), "a reader hung"
        assert not errors, errors[0]
        proxy.chaos(0)
        assert len(proxy.faults_used) > 20, proxy.faults_used  # the chaos was real
        stats = mount_stats(mnt)
        assert stats["short_replies"] == 0, stats
        for name, want in files.items():  # the kernel's size of each file is the file's
            assert os.stat(mnt / name).st_size == len(want), name
        for name, want in files.items():  # and with the origin well again, every byte is there
            with open(mnt / name, "rb") as fh:
                assert fh.read() == want, name
        assert pid_alive(stats["pid"])
        assert sum(tally.values()) == THREADS * READS, tally
