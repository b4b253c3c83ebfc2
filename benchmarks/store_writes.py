"""What the ``--cache-dir`` store's write of fetched bytes costs against a downloader's, on this machine's disk.

A warm-up (``ckptfs prefetch``) writes each run of fetched chunks into the remote file's sparse file
(``SparseStore.put_chunks``: one ``pwritev`` at the chunks' offsets, an ``fdatasync``, then their index
records with each chunk's HMAC-SHA256); a parallel downloader writes one file at offsets. This times, in
one process and one thread, the same bytes written:

- ``store``: through ``SparseStore.put_chunks``, as the warm-up does (runs of ``STORED_RUN`` chunks, 1 MiB,
  unless ``--run-mib`` says otherwise);
- ``entry files``: one file per run (create, ``pwritev``, rename), a file-per-entry layout,
  without checksums;
- ``one file``: ``pwritev`` at offsets into one new file, as a downloader.

Before each case, ``--deleted`` small files are created and deleted in the folder, as a bench round (or a
store's prune) leaves it. Prints MB/s and CPU seconds (user, system) per case, rounds alternated.

Usage: python -m benchmarks store_writes [--dir DIR] [--mib 2048] [--run-mib N] [--rounds 2] [--deleted 4500]
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from ckptfs.sources.remote.store.chunks import CHUNK, STORED_RUN
from ckptfs.sources.remote.store.sparse_store import SparseStore


def _leave_deleted(folder: Path, count: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"old{i}").write_bytes(b"x" * 4096)
    os.sync()
    for i in range(count):
        (folder / f"old{i}").unlink()


def _store(folder: Path, runs: int, parts: list[bytes]) -> None:
    store = SparseStore(folder, 1 << 50)
    per_run = len(parts)
    for r in range(runs):
        if not store.put_chunks("bench-content", r * per_run, parts, runs * per_run):
            raise RuntimeError("the store refused a run of chunks (see its log)")
    for r in {0, runs - 1}:  # what was timed is the store's real chunks: they read back, MAC checked
        for k, part in enumerate(parts):
            if store.get("bench-content", r * per_run + k) != part:
                raise RuntimeError(f"run {r} did not read back as written")
    if store.sealed_path("bench-content") is None:
        raise RuntimeError("the store's file was not sealed once complete")


def _entry_files(folder: Path, runs: int, parts: list[bytes]) -> None:
    subdirs = [folder / f"{k:02x}" for k in range(256)]
    for d in subdirs:
        d.mkdir(parents=True, exist_ok=True)
    for r in range(runs):
        final = subdirs[r % 256] / f"{r:08d}.e"
        tmp = final.with_name(f".tmp.{final.name}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.pwritev(fd, [bytes(64), *parts], 0)
        finally:
            os.close(fd)
        os.rename(tmp, final)


def _one_file(folder: Path, runs: int, parts: list[bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / "download", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    step = sum(len(p) for p in parts)
    try:
        for r in range(runs):
            os.pwritev(fd, parts, r * step)
    finally:
        os.close(fd)


CASES = {"store": _store, "entry files": _entry_files, "one file": _one_file}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/ckptfs-bench-store-writes")
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--run-mib", type=int, default=None, help="entry size [the store's: STORED_RUN chunks]")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--deleted", type=int, default=4500)
    args = parser.parse_args(argv)
    per_run = STORED_RUN if args.run_mib is None else max(1, args.run_mib * (1 << 20) // CHUNK)
    parts = [os.urandom(CHUNK) for _ in range(per_run)]
    runs = max(1, args.mib * (1 << 20) // sum(len(p) for p in parts))
    nbytes = runs * sum(len(p) for p in parts)
    root = Path(args.dir)
    print(f"{nbytes >> 20} MiB as {runs} runs of {len(parts)} chunks; {args.deleted} files deleted before each case")
    try:
        for r in range(args.rounds):
            names = list(CASES) if r % 2 == 0 else list(CASES)[::-1]
            for name in names:
                shutil.rmtree(root, ignore_errors=True)
                _leave_deleted(root / "case", args.deleted)
                before, start = os.times(), time.perf_counter()
                CASES[name](root / "case", runs, parts)
                seconds, after = time.perf_counter() - start, os.times()
                print(f"round {r + 1} {name:12s} {nbytes / seconds / 1e6:7.0f} MB/s  user "
                      f"{after.user - before.user:5.2f} s  system {after.system - before.system:5.2f} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0
