"""The backing file changes under a live mount: the daemon survives, and reads give mount-time bytes or EIO.

docs/interfaces.md: "If the backing file changes under a mount, a read returns the bytes as of mount time or EIO —
never other bytes; the daemon never dies (no SIGBUS)." Each test mounts a fresh copy of a GGUF, reads part of
it (so some pages sit in the kernel's page cache and some groups in the block cache: those may legitimately
keep serving mount-time bytes, the mount uses ``kernel_cache``), then changes the file while reader threads
are running, and checks every read made before, during and after the change:

- truncated (to half, to zero), rewritten in place (every data byte flipped, same size), appended to:
  each read is exactly the reference bytes of its range, or fails with EIO;
- replaced by a rename over its path, or deleted: the daemon holds the file as it was opened, so every read
  is exact (no EIO at all), also for files never read before the change;
- in every case the daemon stays alive, the listing, metadata.json and the meta.json files stay whole, and
  another mount is unaffected.

A buffered read that spans pages the kernel still caches and pages it must ask the daemon for, after the
change, returns the cached pages' bytes (a short count, ending on a page boundary) when the daemon answers
the rest with EIO: the kernel's rule for an I/O error part-way through any read. Such a read is judged
exact-then-EIO only when its bytes are exactly the mount-time prefix and a direct read at the offset where
it stopped gets EIO from the daemon (a short count that the file's end explained would be a wrong size).

References: gguf-py's writer and dequantization, np.save for the .npy bytes.
"""

from __future__ import annotations

import errno
import json
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import mount_stats, pid_alive
from fixtures import Written, quantized, write_gguf
from mount_expect import npy_bytes

SERVED_DTYPES = {"F32": "<f4", "F16": "<f2"}  # dtype "auto": exact types as stored, the rest float32
READERS = 3
PAGE = 4096


def write_model(path: Path) -> Written:
    rng = np.random.default_rng(21)
    return write_gguf(path, {
        "tok_embd": (rng.standard_normal((64, 512)).astype(np.float32), "F32"),        # served without decoding
        "blk.0.q4k": (quantized("Q4_K", (64, 512), rng), "Q4_K"),
        "blk.0.q8": (rng.standard_normal((96, 256)).astype(np.float32), "Q8_0"),
        "blk.0.f16": (rng.standard_normal((40, 300)).astype(np.float16), "F16"),
        "norm": (rng.standard_normal(512).astype(np.float32), "F32"),
    }, {"general.name": "live", "test.values": [1, 2, 3]})


def reference_files(written: Written) -> dict[str, bytes]:
    files = {}
    for name, ref in written.tensors.items():
        files[name + ".raw"] = ref.raw
        files[name + ".npy"] = npy_bytes(np.asarray(ref.array).astype(SERVED_DTYPES.get(ref.storage_type, "<f4")))
    return files


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Written, dict[str, bytes]]:
    written = write_model(tmp_path_factory.mktemp("live") / "model.gguf")
    return written, reference_files(written)


@pytest.fixture(scope="module")
def bystander(module_mounted, model, tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    """Another mount of another copy, which no change touches."""
    written, files = model
    copy = tmp_path_factory.mktemp("bystander") / "other.gguf"
    copy.write_bytes(written.path.read_bytes())
    return module_mounted(copy), files


# ------------------------------------------------------------------------------------------ the changes

def data_start(written: Written) -> int:
    data = written.path.read_bytes()
    return min(data.find(ref.raw) for ref in written.tensors.values())


def flipped(data: bytes, start: int) -> bytes:
    """The same file with every byte of the data section inverted: any byte served from it is wrong."""
    body = np.frombuffer(data, np.uint8, offset=start) ^ np.uint8(0xFF)
    return data[:start] + body.tobytes()


def truncate_half(path: Path, start: int) -> None:
    os.truncate(path, (path.stat().st_size + start) // 2)


def truncate_zero(path: Path, start: int) -> None:
    os.truncate(path, 0)


def rewrite_in_place(path: Path, start: int) -> None:
    new = flipped(path.read_bytes(), start)
    with open(path, "r+b") as fh:
        fh.seek(start)
        fh.write(new[start:])


def append(path: Path, start: int) -> None:
    with open(path, "ab") as fh:
        fh.write(b"\xa5" * 10_000)


def replace(path: Path, start: int) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_bytes(flipped(path.read_bytes(), start))
    os.replace(tmp, path)


def delete(path: Path, start: int) -> None:
    os.unlink(path)


#: change -> (what it does, whether EIO is allowed afterwards: False where the old bytes stay reachable)
CHANGES: dict[str, tuple[Callable[[Path, int], None], bool]] = {
    "truncated to half": (truncate_half, True),
    "truncated to zero": (truncate_zero, True),
    "rewritten in place": (rewrite_in_place, True),
    "appended to": (append, True),
    "replaced by rename": (replace, False),
    "deleted": (delete, False),
}


# ------------------------------------------------------------------------------------------- reading

class Outcomes:
    """Every read made, judged: exact, EIO, or wrong (the one outcome that must never happen)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.exact = self.eio = self.partial = 0
        self.wrong: list[str] = []
        self.eio_before_change: list[str] = []
        self.changed = threading.Event()

    def judge(self, read: Callable[[], bytes], expected: bytes, what: str,
              eio_at: Callable[[int], bool] | None = None) -> None:
        """``eio_at(k)``: whether a direct read ``k`` bytes into the range fails with EIO (for a short read:
        see the module docstring)."""
        try:
            data = read()
        except OSError as exc:
            before = not self.changed.is_set()  # set before the change starts: this read ended before it
            with self.lock:
                if exc.errno != errno.EIO:
                    self.wrong.append(f"{what}: {exc!r}")
                elif before:
                    self.eio_before_change.append(what)
                self.eio += 1
            return
        if data != expected and self._partial_then_eio(data, expected, eio_at):
            with self.lock:
                self.partial += 1
            return
        with self.lock:
            if data == expected:
                self.exact += 1
            else:
                self.wrong.append(f"{what}: {len(data)} bytes, not the {len(expected)} of mount time")

    def _partial_then_eio(self, data: bytes, expected: bytes, eio_at: Callable[[int], bool] | None) -> bool:
        return (eio_at is not None and self.changed.is_set() and 0 < len(data) < len(expected)
                and data == expected[:len(data)] and eio_at(len(data)))


def pread_direct(path: Path, offset: int, size: int) -> bytes:
    """O_DIRECT: the request reaches the daemon whatever the page cache holds."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def pread_cached(path: Path, offset: int, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def whole(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def random_reads(mnt: Path, files: dict[str, bytes], outcomes: Outcomes, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    names = sorted(files)
    while not stop.is_set():
        name = rng.choice(names)
        data = files[name]
        offset = rng.randrange(0, len(data))
        size = rng.choice([1, 100, PAGE, 3 * PAGE + 5, 128 * 1024])
        expected = data[offset:offset + size]
        if rng.random() < 0.5:
            outcomes.judge(lambda: pread_direct(mnt / name, offset, size), expected, f"{name}[{offset}:+{size}]")
        else:
            outcomes.judge(lambda: pread_cached(mnt / name, offset, size), expected, f"{name}[{offset}:+{size}]",
                           eio_at=lambda k: (offset + k) % PAGE == 0 and direct_eio(mnt / name, offset + k))


def direct_eio(path: Path, offset: int) -> bool:
    """Whether the daemon answers a direct read at ``offset`` with EIO."""
    try:
        pread_direct(path, offset, PAGE)
    except OSError as exc:
        return exc.errno == errno.EIO
    return False


def check_everything(mnt: Path, files: dict[str, bytes], outcomes: Outcomes, eio_allowed: bool) -> None:
    """Whole files, then every page through O_DIRECT; what is not exact must be EIO (or nothing, if
    ``eio_allowed`` is False)."""
    for name, data in sorted(files.items()):
        outcomes.judge(lambda: whole(mnt / name), data, f"{name} whole")
        for offset in range(0, len(data), 16 * PAGE):
            outcomes.judge(lambda: pread_direct(mnt / name, offset, 16 * PAGE), data[offset:offset + 16 * PAGE],
                           f"{name}[{offset}] direct")
    assert not outcomes.wrong, outcomes.wrong[:5]
    if not eio_allowed:
        assert outcomes.eio == 0 and outcomes.partial == 0


def check_alive_and_whole(mnt: Path, written: Written, files: dict[str, bytes], pid: int) -> None:
    assert pid_alive(pid) and mount_stats(mnt)["pid"] == pid
    names = set(os.listdir(mnt))
    assert names == (set(files) | {n[:-4] + ".meta.json" for n in files if n.endswith(".raw")}
                     | {"metadata.json", "model.gguf"})  # the mounted file itself is there too
    metadata = json.loads((mnt / "metadata.json").read_bytes())
    assert metadata == {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in written.metadata.items()}
    for name, ref in written.tensors.items():
        meta = json.loads((mnt / f"{name}.meta.json").read_bytes())
        assert (meta["name"], meta["storage_type"], meta["shape"]) == (name, ref.storage_type, list(ref.shape))
        assert meta["stored_nbytes"] == len(ref.raw) and meta["damaged"] is None


# --------------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("change", list(CHANGES))
def test_backing_file_changed_under_a_live_mount(mounted, model, bystander, tmp_path, change):
    written, files = model
    path = tmp_path / "model.gguf"
    path.write_bytes(written.path.read_bytes())
    mnt = mounted(path)
    pid = mount_stats(mnt)["pid"]
    # warm some caches: one whole .npy (kernel page cache and block cache), half of a .raw
    assert whole(mnt / "blk.0.q4k.npy") == files["blk.0.q4k.npy"]
    half = len(files["tok_embd.raw"]) // 2
    assert pread_cached(mnt / "tok_embd.raw", 0, half) == files["tok_embd.raw"][:half]

    outcomes = Outcomes()
    stop = threading.Event()
    files = {**files, "model.gguf": written.path.read_bytes()}  # the file itself: exact or EIO, as the views
    readers = [threading.Thread(target=random_reads, args=(mnt, files, outcomes, stop, seed)) for seed in
               range(READERS)]
    for reader in readers:
        reader.start()
    try:
        time.sleep(0.5)
        outcomes.changed.set()
        do_change, eio_allowed = CHANGES[change]
        do_change(path, data_start(written))
        time.sleep(1.0)
    finally:
        stop.set()
        for reader in readers:
            reader.join(timeout=60)
    assert outcomes.exact > 0 and not outcomes.eio_before_change
    check_everything(mnt, files, outcomes, eio_allowed)
    check_alive_and_whole(mnt, written, files, pid)

    other, other_files = bystander
    for name, data in sorted(other_files.items()):
        assert whole(other / name) == data, name


def test_rewritten_file_is_detected_not_served(mounted, model, tmp_path):
    """The sharpest case: same size, every data byte different, nothing read before. Only EIO can come back
    for tensor data (no cache holds mount-time bytes), each logged naming the tensor, and nothing in the mount
    is lost besides."""
    written, files = model
    path = tmp_path / "model.gguf"
    path.write_bytes(written.path.read_bytes())
    log = tmp_path / "daemon.log"
    mnt = mounted(path, "--log-file", str(log))
    pid = mount_stats(mnt)["pid"]
    time.sleep(0.05)  # a later mtime tick for the rewrite (file timestamps are coarse-grained)
    rewrite_in_place(path, data_start(written))
    for name in sorted(files):
        before = log.stat().st_size
        with pytest.raises(OSError) as info:
            whole(mnt / name)
        assert info.value.errno == errno.EIO, name
        lines = log.read_bytes()[before:].decode().splitlines()
        tensor = name.rsplit(".", 1)[0]
        assert lines and all(f"EIO: /{name} bytes " in line and f"tensor {tensor!r}: the file changed since it "
                             "was opened" in line for line in lines), lines
    check_alive_and_whole(mnt, written, files, pid)


@pytest.mark.parametrize("change", ["replaced by rename", "deleted"])
def test_file_gone_before_the_first_read_still_serves_mount_time_bytes(mounted, model, tmp_path, change):
    """The file is held from the moment the header is read, not from the first data read: replaced or
    deleted before anything was read, every byte still comes from the file that was mounted."""
    written, files = model
    path = tmp_path / "model.gguf"
    path.write_bytes(written.path.read_bytes())
    mnt = mounted(path)
    CHANGES[change][0](path, data_start(written))
    for name, data in sorted(files.items()):
        assert whole(mnt / name) == data, name
