"""The stress tests' random reader, in a module of its own so that reader processes can import it (test
modules are not imported by anything else)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

MAX_READ = 256 * 1024


def hammer(mnt: str, refs: str, seconds: float, seed: int) -> dict:
    """Random reads until ``seconds`` have passed; every byte compared. Runs in threads and in processes."""
    rng = random.Random(seed)
    reference = {p.name: p.read_bytes() for p in Path(refs).iterdir()}
    names = sorted(reference)
    reads = nbytes = 0
    wrong: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        name = rng.choice(names)
        data = reference[name]
        size = rng.choice((1, 7, 4096, 65536, MAX_READ, rng.randrange(1, MAX_READ)))
        offset = rng.randrange(0, len(data))
        if rng.random() < 0.125:
            # a whole file in one read: it covers whole block groups, which are decoded into the reply and
            # kept in the cache (a read that cuts a group decodes only the blocks under it and keeps nothing),
            # so the small cache fills and evicts under the load
            offset, size = 0, len(data)
        direct = rng.random() < 0.7  # O_DIRECT: the request reaches the daemon (FUSE takes any offset, size)
        fd = os.open(os.path.join(mnt, name), os.O_RDONLY | (os.O_DIRECT if direct else 0))
        try:
            got = os.pread(fd, size, offset)
        except OSError as exc:
            wrong.append(f"{name}[{offset}:+{size}] direct={direct}: {exc!r}")
            got = None
        finally:
            os.close(fd)
        if got is not None and got != data[offset:offset + size]:
            wrong.append(f"{name}[{offset}:+{size}] direct={direct}: {len(got)} bytes, not the reference's")
        reads += 1
        nbytes += len(got or b"")
    return {"reads": reads, "bytes": nbytes, "wrong": wrong[:20]}
