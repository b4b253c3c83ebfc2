"""What every fuzz target shares: the property, the mutations, and the valid seed files.

The property (``exercise``): opening a file as a user does (``ckptfs.open``) and touching everything a mount
would serve — every metadata value, metadata.json, every NAME.meta.json, the first and last 64 KiB of every
.raw and .npy — either works or raises ``CheckpointError``. Anything else escaping is a finding, and so is a
``CheckpointError`` made by the readers' last-resort conversion of an unexpected exception (it chains the
original as ``__cause__``): that net keeps a daemon alive, but a file reaching it found a missing check.

This module imports only ckptfs, numpy and the standard library, so the coverage-guided targets (run in their
own process under an address-space limit) can use it; the seed writers need gguf-py and live in ``seeds.py``.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ckptfs
from ckptfs.core.errors import CheckpointError
from ckptfs.util.jsonutil import dumps_bytes
from ckptfs.tree.mount_tree import MountTree

READ_BYTES = 64 * 1024
#: Per input, in CPU seconds: a well-behaved reader needs milliseconds for these small files.
INPUT_CPU_SECONDS = 5.0


class Finding(AssertionError):
    """The property does not hold for this input."""


class Hang(Finding):
    pass


def _explicit(exc: CheckpointError) -> None:
    if exc.__cause__ is not None and not isinstance(exc.__cause__, CheckpointError):
        raise Finding(f"refused by the catch-all, not by a check: {exc}") from exc


def exercise(path: str | Path) -> str:
    """Open ``path`` and touch everything a mount serves; ``"opened"`` or ``"refused"`` (see the module doc)."""
    try:
        ck = ckptfs.open(str(path))
    except CheckpointError as exc:
        _explicit(exc)
        return "refused"
    with ck:
        for key in ck.metadata:
            ck.metadata[key]
        dumps_bytes(dict(ck.metadata))
        tree = MountTree(ck)
        for name in tree.names():
            try:
                view = tree.view(name)
                for offset in sorted({0, max(0, view.size - READ_BYTES)}):
                    view.read(offset, READ_BYTES)
            except CheckpointError as exc:
                _explicit(exc)
    return "opened"


@contextlib.contextmanager
def cpu_alarm(seconds: float = INPUT_CPU_SECONDS) -> Iterator[None]:
    """Raise ``Hang`` in the middle of an input that burns ``seconds`` of CPU.

    A profiling timer (SIGPROF), not SIGALRM: libFuzzer owns SIGALRM for its own wall-clock ``-timeout``
    (the backstop for a hang inside C code, where a Python handler cannot run), and pytest-timeout may own it
    in-process.
    """
    def on_alarm(signum, frame):
        raise Hang(f"input still running after {seconds} s of CPU")

    previous = signal.signal(signal.SIGPROF, on_alarm)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


# ------------------------------------------------------------------------------------------ mutations

#: Values at the edges of the integer types the headers hold: counts, lengths, dims, offsets, type ids.
INTERESTING = (0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 30, 31, 32, 33, 42, 43, 64, 127, 128, 255, 256, 4095, 4096,
               2**15, 2**16 - 1, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**53, 2**62, 2**63 - 1, 2**63,
               2**64 - 1)


def mutate_bytes(data: bytes, rng: random.Random, hot_end: int, max_edits: int = 6) -> bytes:
    """A few random edits, four in five inside ``[0, hot_end)`` (the header): byte values, bit flips,
    interesting 32/64-bit integers in either byte order, insertions, deletions, a cut, a copied chunk."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, max_edits)):
        if not buf:
            buf.append(rng.randrange(256))
            continue
        limit = min(len(buf), hot_end) if hot_end > 0 and rng.random() < 0.8 else len(buf)
        pos = rng.randrange(max(1, limit))
        kind = rng.randrange(7)
        if kind == 0:
            buf[pos] = rng.randrange(256)
        elif kind == 1:
            buf[pos] ^= 1 << rng.randrange(8)
        elif kind == 2:
            width = rng.choice((4, 8))
            value = rng.choice(INTERESTING) & ((1 << (8 * width)) - 1)
            packed = struct.pack(rng.choice("<>") + ("I" if width == 4 else "Q"), value)
            buf[pos:pos + width] = packed
        elif kind == 3:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif kind == 4:
            del buf[pos:pos + rng.randint(1, 16)]
        elif kind == 5:
            del buf[pos:]
        else:
            start = rng.randrange(len(buf))
            chunk = buf[start:start + rng.randint(1, 32)]
            buf[pos:pos + len(chunk)] = chunk
    return bytes(buf)


def random_json(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value, biased to what headers hold: small and huge ints, names, short lists."""
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.choice(INTERESTING) * rng.choice((1, 1, -1))
    if kind == 1:
        return rng.choice(("F32", "F16", "BF16", "F8_E4M3", "F4", "F6_E2M3", "U8", "I64", "BOOL", "C64", "f32", "",
                           "Q4_K", "x" * 300, "\u00e9", "\ud800"))
    if kind == 2:
        return rng.choice((None, True, False))
    if kind == 3:
        return rng.choice((0.5, -0.0, 1e300, 2.0))
    if kind == 4:
        return rng.choice(("model.safetensors", "../x.safetensors", "/etc/passwd", ".", "", "a/b", "a\x00b"))
    if kind in (5, 6):
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(("dtype", "shape", "data_offsets", "__metadata__", "k", "")): random_json(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def mutate_safetensors_header(data: bytes, rng: random.Random) -> bytes:
    """Edit the parsed header of a valid safetensors file (entry fields, offsets, shapes, whole entries), then
    write it back with its length recomputed, or kept (so it no longer matches) one time in five."""
    (length,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + length])
    names = [n for n in header if n != "__metadata__"] or ["t"]
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(names)
        entry = header.get(name)
        kind = rng.randrange(6)
        if kind == 0 or not isinstance(entry, dict):
            header[name] = random_json(rng)
        elif kind == 1:
            entry[rng.choice(("dtype", "shape", "data_offsets"))] = random_json(rng)
        elif kind == 2:
            entry["shape"] = [rng.choice(INTERESTING) for _ in range(rng.randint(0, 9))]
        elif kind == 3:
            offsets = entry.get("data_offsets")
            begin, end = offsets if isinstance(offsets, list) and len(offsets) == 2 else (0, 0)
            if isinstance(begin, int) and isinstance(end, int):
                entry["data_offsets"] = [begin + rng.randint(-3, 3), end + rng.choice((-8, -1, 1, 8, 2**40))]
        elif kind == 4:
            header.pop(name, None)
        else:
            header["__metadata__"] = random_json(rng)
    text = json.dumps(header).encode()
    new_length = length if rng.random() < 0.2 else len(text)
    return struct.pack("<Q", new_length) + text + data[8 + length:]


def mutate_index(doc: dict, rng: random.Random, shard_names: list[str]) -> bytes:
    """An edited sharded-checkpoint index: weight_map values, the map itself, metadata; as JSON text, byte
    edits on top one time in four."""
    doc = json.loads(json.dumps(doc))
    weight_map = doc["weight_map"]
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        if kind == 0 and weight_map:
            weight_map[rng.choice(list(weight_map))] = rng.choice(shard_names + [random_json(rng)])
        elif kind == 1:
            weight_map[rng.choice(("new.tensor", "", "a/b", "t0"))] = rng.choice(shard_names + [random_json(rng)])
        elif kind == 2 and weight_map:
            weight_map.pop(rng.choice(list(weight_map)))
        elif kind == 3:
            doc["metadata"] = random_json(rng)
        elif kind == 4:
            doc["weight_map"] = random_json(rng)
        else:
            doc[rng.choice(("weight_map", "metadata", "other"))] = random_json(rng)
    text = json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    return mutate_bytes(text, rng, len(text), 3) if rng.random() < 0.25 else text
