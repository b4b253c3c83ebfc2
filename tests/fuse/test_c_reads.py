"""Reads of plain ranges of local files answered in C (``ckptfs/fuse/_direct.c``, ``ckptfs/fuse/direct.py``).

Real mounts of generated checkpoints, through the real CLI daemon (mfusepy on libfuse 3, ckptfs's choice):

- every tensor's ``.raw`` and the checkpoint's own file give exactly the file's bytes, at odd offsets and
  sizes, at and past the end, with O_DIRECT (each read reaches the daemon as asked) and buffered — and the C
  path served them (``c_reads`` in the stats), with nothing handed back to Python;
- a ``.npy`` of a type served as stored (F32: header, then the stored bytes) is read in C, a decoded one not;
- a split set's merged ``model.gguf`` (header in memory, shard ranges, zero padding) read in C is the file
  Python serves (which gguf-py reads as the merged set), across every seam;
- ``CKPTFS_C_READS=0``: the same bytes, not one read served in C;
- ``ckptfs_read_bytes_total{kind}`` counts exactly the bytes readers got, C-served ones included, and
  ``ckptfs_c_reads_total`` counts the C path's requests;
- a ``--manifest`` mount keeps verifying: its reads are never the C path's, and a flipped byte is EIO
  (``test_integrity_checked.py``'s mount test, which asserts the C path served nothing);
- a file changed under the mount (same size, new mtime) is not served from C: the read is handed to Python,
  which answers EIO;
- threads and processes reading many ``.raw`` files at once get the exact bytes;
- opening and closing files many times leaves the daemon's descriptor count where it was;
- fusepy (libfuse 2) and a tensor past the end of a truncated file: reads are Python's, as before.
"""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import mount_stats, wait_until
from fixtures import write_gguf, write_mixed_gguf
from integrity_fixtures import reference_tensors
from mount_expect import read_direct

from ckptfs.fuse import direct
from metrics_samples import scrape, value

pytestmark = pytest.mark.skipif(direct._direct is None, reason="the C helper ckptfs.fuse._direct is not built")


def c_reads(mnt: Path) -> dict:
    return mount_stats(mnt)["c_reads"]


def odd_ranges(size: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    ranges = [(0, 1), (1, 1), (0, 3), (7, 4093), (4095, 2), (0, size), (size - 1, 1), (size - 1, 10), (size, 10),
              (size + 4096, 10), (size // 2, size), (0, 0), (size // 3, 0)]
    ranges += [(int(rng.integers(0, size)), int(rng.integers(1, 300_000))) for _ in range(10)]
    return [(o, s) for o, s in ranges if o >= 0]


def test_raw_and_own_file_are_the_file_bytes_served_in_c(mounted, tmp_path):
    written = write_mixed_gguf(tmp_path / "mixed.gguf")
    data = written.path.read_bytes()
    mnt = mounted(written.path)
    rng = np.random.default_rng(0)
    asked = 0
    for name, ref in written.tensors.items():
        path = mnt / f"{name}.raw"
        assert path.read_bytes() == ref.raw, name
        ranges = odd_ranges(len(ref.raw), rng)
        for (offset, size), got in zip(ranges, read_direct(path, ranges)):
            assert got == ref.raw[offset:offset + size], (name, offset, size)
            asked += len(got)
    own = mnt / "mixed.gguf"
    assert own.read_bytes() == data
    ranges = odd_ranges(len(data), rng)
    for (offset, size), got in zip(ranges, read_direct(own, ranges)):
        assert got == data[offset:offset + size], (offset, size)
    served = c_reads(mnt)
    assert served["enabled"] and served["handed_back"] == 0
    assert served["by_kind"]["raw"]["reads"] >= len(written.tensors) and served["by_kind"]["file"]["reads"] > 0
    assert served["by_kind"]["raw"]["bytes"] >= asked  # the O_DIRECT bytes alone, besides the buffered reads
    assert served["handles"] == 0 or wait_until(lambda: c_reads(mnt)["handles"] == 0)  # all released


def test_npy_of_a_type_served_as_stored_is_read_in_c(mounted, tmp_path):
    written = write_mixed_gguf(tmp_path / "mixed.gguf")
    mnt = mounted(written.path)

    def expected(name: str) -> bytes:
        out = io.BytesIO()
        np.save(out, written.tensors[name].array)
        return out.getvalue()

    assert (mnt / "q8_0.mat.npy").read_bytes() == expected("q8_0.mat")  # decoded: Python's
    assert "npy" not in c_reads(mnt)["by_kind"]
    data = expected("f32.mat")
    assert (mnt / "f32.mat.npy").read_bytes() == data  # header, then the stored F32 bytes: C's
    ranges = odd_ranges(len(data), np.random.default_rng(2)) + [(120, 16), (127, 2)]  # around the header's end
    for (offset, size), got in zip(ranges, read_direct(mnt / "f32.mat.npy", ranges)):
        assert got == data[offset:offset + size], (offset, size)
    served = c_reads(mnt)["by_kind"]["npy"]
    assert served["reads"] > 1 and served["bytes"] >= len(data)


def test_switched_off_every_read_is_python_s(mounted, tmp_path):
    written = write_mixed_gguf(tmp_path / "mixed.gguf")
    mnt = mounted(written.path, env={"CKPTFS_C_READS": "0"})
    for name, ref in written.tensors.items():
        assert (mnt / f"{name}.raw").read_bytes() == ref.raw, name
    assert (mnt / "mixed.gguf").read_bytes() == written.path.read_bytes()
    assert c_reads(mnt) == {"enabled": False, "reads": 0, "bytes": 0, "by_kind": {}, "handed_back": 0, "handles": 0}


def test_fusepy_reads_are_python_s(mounted, tmp_path):
    written = write_mixed_gguf(tmp_path / "mixed.gguf")
    mnt = mounted(written.path, binding="fusepy")
    for name, ref in written.tensors.items():
        assert (mnt / f"{name}.raw").read_bytes() == ref.raw, name
    assert c_reads(mnt)["reads"] == 0


def test_mfusepy_on_libfuse2_reads_in_c(mounted, tmp_path):
    """libfuse 2's fuse_file_info has another layout: fh's offset comes from mfusepy's ctypes struct."""
    import ctypes.util

    if ctypes.util.find_library("fuse") is None:
        pytest.skip("libfuse2 is not installed")
    written = write_mixed_gguf(tmp_path / "mixed.gguf")
    mnt = mounted(written.path, binding="mfusepy", env={"FUSE_LIBRARY_NAME": "fuse"})
    assert mount_stats(mnt)["libfuse"] == 2
    rng = np.random.default_rng(3)
    for name, ref in written.tensors.items():
        assert (mnt / f"{name}.raw").read_bytes() == ref.raw, name
        ranges = odd_ranges(len(ref.raw), rng)
        for (offset, size), got in zip(ranges, read_direct(mnt / f"{name}.raw", ranges)):
            assert got == ref.raw[offset:offset + size], (name, offset, size)
    served = c_reads(mnt)
    assert served["by_kind"]["raw"]["reads"] >= len(written.tensors) and served["handed_back"] == 0


def test_read_bytes_counted_exactly_with_c_reads(mounted, tmp_path):
    pytest.importorskip("prometheus_client")
    written = write_mixed_gguf(tmp_path / "mixed.gguf")
    mnt = mounted(written.path, "--metrics", "127.0.0.1:0")
    before = scrape(mnt)
    rng = np.random.default_rng(1)
    got = {"raw": 0, "file": 0}
    for name, ref in written.tensors.items():
        ranges = odd_ranges(len(ref.raw), rng)
        got["raw"] += sum(len(b) for b in read_direct(mnt / f"{name}.raw", ranges))
    size = written.path.stat().st_size
    got["file"] += sum(len(b) for b in read_direct(mnt / "mixed.gguf", odd_ranges(size, rng)))
    after = scrape(mnt)
    for kind, n in got.items():
        assert value(after, "ckptfs_read_bytes_total", kind=kind) - value(before, "ckptfs_read_bytes_total", kind=kind) == n
    assert value(after, "ckptfs_c_reads_total", kind="raw") > value(before, "ckptfs_c_reads_total", kind="raw")
    assert c_reads(mnt)["bytes"] == sum(got.values())  # every one of these reads was the C path's


def test_file_changed_under_the_mount_is_handed_back_and_eio(mounted, tmp_path):
    written = write_mixed_gguf(tmp_path / "m.gguf")
    ref = written.tensors["q8_0.mat"].raw
    mnt = mounted(written.path)
    fd = os.open(mnt / "q8_0.mat.raw", os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.pread(fd, 4096, 0) == ref[:4096]
        before = c_reads(mnt)
        assert before["by_kind"]["raw"]["reads"] >= 1
        st = written.path.stat()
        os.utime(written.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # "rewritten"
        with pytest.raises(OSError) as info:
            os.pread(fd, 4096, 0)
        assert info.value.errno == errno.EIO
    finally:
        os.close(fd)
    after = c_reads(mnt)
    assert after["handed_back"] == before["handed_back"] + 1
    assert after["by_kind"]["raw"]["reads"] == before["by_kind"]["raw"]["reads"]


def test_a_tensor_past_the_end_of_a_cut_file_is_eio_not_c(mounted, tmp_path):
    rng = np.random.default_rng(5)
    written = write_gguf(tmp_path / "cut.gguf", {"a": (rng.standard_normal((64, 256)).astype(np.float32), "Q8_0"),
                                                 "b": (rng.standard_normal((64, 256)).astype(np.float32), "Q8_0")})
    offsets = {n: o for n, o, _ in reference_tensors(written.path)}
    last = max(offsets, key=offsets.get)
    os.truncate(written.path, offsets[last] + 100)  # the last tensor's bytes mostly gone
    mnt = mounted(written.path)
    first = min(offsets, key=offsets.get)
    assert (mnt / f"{first}.raw").read_bytes() == written.tensors[first].raw
    with pytest.raises(OSError) as info:
        (mnt / f"{last}.raw").read_bytes()
    assert info.value.errno == errno.EIO
    assert c_reads(mnt)["handed_back"] == 0  # never registered: Python answered it


READER = """
import os, sys
import numpy as np
mnt, names, seed = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
rng = np.random.default_rng(seed)
for _ in range(200):
    name = names[int(rng.integers(0, len(names)))]
    path = os.path.join(mnt, name + ".raw")
    size = os.path.getsize(path)
    offset, n = int(rng.integers(0, size + 10)), int(rng.integers(1, 70_000))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        sys.stdout.write(f"{name} {offset} {n} {os.pread(fd, n, offset).hex()}\\n")
    finally:
        os.close(fd)
"""


def test_concurrent_threads_and_processes_read_exact_bytes(mounted, tmp_path):
    written = write_mixed_gguf(tmp_path / "mixed.gguf")
    mnt = mounted(written.path)
    names = sorted(written.tensors)
    refs = {n: written.tensors[n].raw for n in names}
    failures: list[str] = []
    inside = [0]  # reads that start inside their file: the kernel asks the daemon for each (past the end: no)

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(300):
            name = names[int(rng.integers(0, len(names)))]
            size = len(refs[name])
            offset, n = int(rng.integers(0, size + 10)), int(rng.integers(1, 70_000))
            (got,) = read_direct(mnt / f"{name}.raw", [(offset, n)])
            inside[0] += offset < size
            if got != refs[name][offset:offset + n]:
                failures.append(f"{name} {offset} {n}")

    processes = [subprocess.Popen([sys.executable, "-c", READER, str(mnt), ",".join(names), str(100 + i)],
                                  stdout=subprocess.PIPE, text=True) for i in range(2)]
    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    outputs = [p.communicate(timeout=120)[0] for p in processes]
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures[:5]
    assert all(p.returncode == 0 for p in processes)
    lines = [line.split(" ") for out in outputs for line in out.splitlines()]
    assert len(lines) == 400
    for name, offset, n, hexed in lines:
        offset, n = int(offset), int(n)
        assert bytes.fromhex(hexed) == refs[name][offset:offset + n], (name, offset, n)
        inside[0] += offset < len(refs[name])
    assert c_reads(mnt)["by_kind"]["raw"]["reads"] >= inside[0] > 1000


def descriptor_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_open_and_release_many_times_leaks_no_descriptor(mounted, tmp_path):
    written = write_mixed_gguf(tmp_path / "mixed.gguf")
    mnt = mounted(written.path)
    pid = mount_stats(mnt)["pid"]
    names = sorted(written.tensors)
    (mnt / f"{names[0]}.raw").read_bytes()  # the source's descriptor, opened once
    baseline = descriptor_count(pid)
    held = [open(mnt / f"{name}.raw", "rb") for name in names]  # many handles at once on one source
    try:
        assert all(f.read(1) for f in held)
        assert descriptor_count(pid) == baseline  # registered handles share the source's descriptor
    finally:
        for f in held:
            f.close()
    for i in range(500):
        with open(mnt / f"{names[i % len(names)]}.raw", "rb") as f:
            f.read(16)
    assert wait_until(lambda: c_reads(mnt)["handles"] == 0, timeout=10)
    assert descriptor_count(pid) == baseline
    assert c_reads(mnt)["reads"] > 0
    assert wait_until(lambda: mount_stats(mnt)["open_handles"] == 0, timeout=10)


def test_merged_model_gguf_of_a_split_set_is_read_in_c(mounted, tmp_path):
    from gguf import GGUFReader
    from multifile_sets import gguf_tensors, write_split_gguf
    from multifile_sets import check_merged

    shards = write_split_gguf(tmp_path / "set", gguf_tensors(count=9), per_shard=2)
    in_c = mounted(str(shards[0]))
    in_python = mounted(str(shards[0]), env={"CKPTFS_C_READS": "0"})
    expected = (in_python / "model.gguf").read_bytes()  # Python's merge: gguf-py reads it (test_hf_merge)
    assert c_reads(in_c)["reads"] == 0
    assert (in_c / "model.gguf").read_bytes() == expected
    check_merged(GGUFReader(str(in_c / "model.gguf")), shards)
    ranges = odd_ranges(len(expected), np.random.default_rng(7))
    ranges += [(o - 3, 7) for o in range(4096, len(expected), 4096)]  # across header, tensor and padding seams
    for (offset, size), got in zip(ranges, read_direct(in_c / "model.gguf", ranges)):
        assert got == expected[offset:offset + size], (offset, size)
    served = c_reads(in_c)
    asked = sum(1 for offset, size in ranges if offset < len(expected) and size > 0)  # the others never come
    assert served["reads"] >= asked and served["handed_back"] == 0
    assert c_reads(in_python)["reads"] == 0
