"""The daemon's log as a service runs it: JSON lines, one line per EIO cause, reopened on SIGUSR1.

A tensor name with a newline is escaped in its EIO line. A real daemon mount of a GGUF cut in the middle of its last tensor (where the cut lies comes from gguf-py's
reader, not from ckptfs). Failed reads go through the page cache (each reaches the daemon more than once:
the kernel's readahead, then its retry) and through O_DIRECT; the log must hold one line per distinct cause
while ``ckptfs_fuse_errors_total`` counts every failed request.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from cli_runs import run_cli
from conftest import mount_stats, pid_alive, wait_until
from fixtures import quantized, write_gguf

PAGE = 4096


@pytest.fixture
def cut_gguf(tmp_path) -> tuple[Path, str, int]:
    """A GGUF whose last tensor (Q4_K) lost its second half: (path, tensor name, .raw offset of the cut)."""
    rng = np.random.default_rng(3)
    written = write_gguf(tmp_path / "full.gguf", {
        "tok_embd.weight": (rng.standard_normal((16, 256)).astype(np.float32), "Q8_0"),
        "blk.0.attn_q.weight": (quantized("Q4_K", (256, 256), rng), "Q4_K"),
    }, {"general.name": "cut"})
    tensor = next(t for t in GGUFReader(written.path).tensors if t.name == "blk.0.attn_q.weight")
    start = int(tensor.data_offset)
    keep = int(tensor.n_bytes) // 2
    data = Path(written.path).read_bytes()[: start + keep]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data)
    return cut, "blk.0.attn_q.weight", keep


def records(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def eio_records(log: Path) -> list[dict]:
    return [r for r in records(log) if r["level"] == "ERROR" and r["message"].startswith("EIO:")]


def errors_counted(mnt: Path) -> float:
    address = mount_stats(mnt)["metrics"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "ckptfs_fuse_errors_total" and s.labels == {"op": "read", "errno": "EIO"})


def failing_read(path: Path, offset: int, direct: bool = False) -> None:
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags)
    try:
        if not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        with pytest.raises(OSError) as info:
            os.pread(fd, PAGE, offset)
        assert info.value.errno == errno.EIO
    finally:
        os.close(fd)


def test_json_lines_and_one_line_per_eio_cause(mounted, cut_gguf, tmp_path):
    pytest.importorskip("prometheus_client")
    src, name, keep = cut_gguf
    log = tmp_path / "daemon.log"
    mnt = mounted(str(src), "--log-file", str(log), "--log-format", "json", "--metrics", "127.0.0.1:0")
    raw = mnt / f"{name}.raw"
    missing = (keep // PAGE + 1) * PAGE  # a page wholly past the cut
    fd = os.open(raw, os.O_RDONLY | os.O_DIRECT)  # (no readahead: it would ask for the missing half too)
    assert len(os.pread(fd, PAGE, 0)) == PAGE     # the intact half is served
    os.close(fd)

    failing_read(raw, missing)            # page cache: readahead, then the kernel's own retry
    failing_read(raw, missing)            # the same read again
    failing_read(raw, missing, direct=True)  # the same range once more, straight to the daemon
    lines = eio_records(log)
    assert len(lines) == 1, lines
    assert errors_counted(mnt) >= 3       # every failed request counted
    line = lines[0]
    assert line["op"] == "read" and line["errno"] == "EIO" and line["path"] == f"/{name}.raw"
    assert f"bytes {missing}..{missing + PAGE}" in line["message"] and name in line["message"]

    failing_read(raw, missing + PAGE, direct=True)  # another range: another cause, one more line
    assert len(eio_records(log)) == 2
    failing_read(mnt / f"{name}.npy", os.stat(mnt / f"{name}.npy").st_size - PAGE, direct=True)
    assert len(eio_records(log)) == 3

    for record in records(log):  # every line is one JSON object with the shipper's fields
        assert {"time", "level", "logger", "pid", "message"} <= set(record)
        assert record["time"].endswith("Z") and record["pid"] == mount_stats(mnt)["pid"]


def test_sigusr1_reopens_the_log_and_keeps_the_mount(mounted, cut_gguf, tmp_path):
    src, name, keep = cut_gguf
    log = tmp_path / "daemon.log"
    mnt = mounted(str(src), "--log-file", str(log))
    pid = mount_stats(mnt)["pid"]
    assert "mounted" in log.read_text()
    rotated = tmp_path / "daemon.log.1"
    log.rename(rotated)                                  # what logrotate does (create mode)
    os.kill(pid, signal.SIGUSR1)
    assert wait_until(lambda: log.exists() and "reopened log file" in log.read_text(), timeout=10)
    failing_read(mnt / f"{name}.raw", (keep // PAGE + 2) * PAGE, direct=True)
    assert "EIO: " in log.read_text() and "EIO: " not in rotated.read_text()
    os.kill(pid, signal.SIGUSR1)                         # again, with nothing rotated: same file, appended
    assert wait_until(lambda: log.read_text().count("reopened log file") == 2, timeout=10)
    assert pid_alive(pid) and mount_stats(mnt)["pid"] == pid
    assert (mnt / "metadata.json").read_bytes()          # still serving


def test_the_eio_log_entry_escapes_a_tensor_name(tmp_path, mountpoint):
    path = tmp_path / "odd.gguf"
    write_gguf(path, {"bad\nname": (np.ones((64, 256), np.float32), "F32")})
    os.truncate(path, path.stat().st_size - 4096)
    log = tmp_path / "daemon.log"
    assert run_cli("mount", str(path), str(mountpoint), "--log-file", str(log)).returncode == 0
    before = len(log.read_text().splitlines())
    with pytest.raises(OSError) as info:
        with open(mountpoint / "bad\nname.npy", "rb", buffering=0) as f:
            f.read()
    assert info.value.errno == errno.EIO
    new = log.read_text().splitlines()[before:]
    # one entry per failed range the kernel asked for, each whole on its line (before: split at the newline)
    assert new and all(" ERROR " in line and "EIO: /bad\\nname.npy bytes " in line for line in new), new
