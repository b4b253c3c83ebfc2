"""Defects a new user found (issue 11), each pinned by a test that failed before its fix.

Row picks cost their rows, sizes and cache bounds are checked, readiness means a working mount, umount only
unmounts ckptfs, special files are refused without blocking, path errors say the real reason, usage errors
are one line, control characters never split a line, and bench reports damage instead of dying.
References: gguf-py's dequantize for values, tracemalloc for memory, /proc/self/mountinfo for mounts.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import (ckptfs_cli, cli_env, force_unmount, is_mounted, mount_stats, pid_alive, require_fuse,
                      skip_or_fail, wait_until)
from fixtures import random_blocks, write_gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

import ckptfs

NOBODY = 65534

ROWS, COLS = 8192, 1024                       # Q8_0: 32 blocks (1088 bytes) per row, 4 KiB decoded
ROW_BYTES = COLS * 4
GROUP_BYTES = 256 * 1024                      # blocks.GROUP_TARGET_BYTES: 64 rows of this tensor


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """An embedding-like Q8_0 table (32 MiB decoded) and its reference values from gguf-py."""
    rng = np.random.default_rng(11)
    stored = random_blocks("Q8_0", ROWS * COLS // 32, rng).reshape(ROWS, -1)
    path = tmp_path_factory.mktemp("rows") / "table.gguf"
    write_gguf(path, {"emb": (stored, "Q8_0")})
    return path, dequantize(stored, Q.Q8_0).reshape(ROWS, COLS)


def _peak_while(fn):
    """(result, peak bytes allocated while ``fn`` ran) as tracemalloc sees them (numpy reports its buffers)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        return result, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


# -- 1. row picks cost their rows ------------------------------------------------------------------------


@pytest.mark.parametrize("cache_size", [0, 1 << 20])
def test_a_stepped_slice_peaks_at_cache_plus_result(table, cache_size):
    path, ref = table
    with ckptfs.open(path, cache_size=cache_size) as ck:
        got, peak = _peak_while(lambda: ck["emb"][::16])
    assert np.array_equal(got, ref[::16])
    # before: every picked row kept its whole 256 KiB group alive until np.stack (512 groups = 128 MiB)
    assert peak <= cache_size + 2 * got.nbytes + 4 * GROUP_BYTES, peak


def test_an_embedding_lookup_costs_its_rows_not_their_groups(table):
    path, ref = table
    ids = [17, 3, 5000, 17]
    with ckptfs.open(path, cache_size=0) as ck:
        got, peak = _peak_while(lambda: ck["emb"][ids])
    assert np.array_equal(got, ref[ids])
    assert peak < GROUP_BYTES // 2, peak  # before: two whole groups decoded (512 KiB) for 16 KiB of rows


@pytest.mark.parametrize("key", [slice(None, None, 3), slice(100, 5000), slice(7000, 10, -7), slice(-3, None),
                                 (slice(10, 400, 2), slice(5, 9)), 4097, -1, (5, [1, 2]), [8191, 0, 0, 64],
                                 (np.array([5, 1]), slice(None, 8))])
def test_row_picks_still_index_like_numpy(table, key):
    path, ref = table
    with ckptfs.open(path, cache_size=0) as ck:
        got = ck["emb"][key]
    want = ref[key]
    assert got.shape == want.shape and np.array_equal(got, want)


def test_a_single_row_does_not_decode_its_group(table):
    path, ref = table
    with ckptfs.open(path, cache_size=0) as ck:
        got, peak = _peak_while(lambda: ck["emb"][4097])
    assert np.array_equal(got, ref[4097]) and peak < GROUP_BYTES // 2, peak


@pytest.mark.parametrize("bad", [-1, -(1 << 30)])
def test_a_negative_cache_size_is_refused(table, bad):
    with pytest.raises(ValueError, match="cache_size"):
        ckptfs.open(table[0], cache_size=bad)


def test_cache_size_zero_keeps_nothing(table):
    path, ref = table
    with ckptfs.open(path, cache_size=0) as ck:
        assert np.array_equal(ck["emb"][10:20], ref[10:20])
        stats = ck.cache.stats()
    assert (stats.entries, stats.bytes) == (0, 0)


# -- command-line plumbing shared by the items below ---------------------------------------------------------


def run_cli(*args: str, timeout: float = 90, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ckptfs_cli(), *args], env=cli_env(**env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(result: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """The single stderr line of a failed command, checked for its exit code and words."""
    err = result.stderr.strip()
    assert result.returncode == code, (result.returncode, err)
    assert err and "\n" not in err and "Traceback" not in err and err.startswith("ckptfs: "), err
    for word in words:
        assert word in err, err
    return err


def mounts_at(path) -> int:
    """How many mounts the mount table has at ``path`` (a stacked one counts twice)."""
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in fh]
    return points.count(real)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    rng = np.random.default_rng(3)
    return write_gguf(tmp_path_factory.mktemp("small") / "small.gguf",
                      {"q": (rng.standard_normal((64, 256)).astype(np.float32), "Q8_0"),
                       "f": (np.arange(32, dtype=np.float32), "F32")}, {"general.name": "small"})


@pytest.fixture
def mountpoint(tmp_path) -> Iterator[Path]:
    """An empty directory for tests that run the CLI themselves; every mount there undone at the end."""
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    yield mnt
    for _ in range(4):  # stacked mounts, if a test made some
        if not is_mounted(mnt):
            break
        try:
            pid = mount_stats(mnt)["pid"]
        except OSError:
            pid = None
        force_unmount(mnt)
        if pid is not None and not wait_until(lambda: not pid_alive(pid), timeout=10):
            os.kill(pid, signal.SIGKILL)


# -- 4. "mounted" means a working mount ---------------------------------------------------------------------


@pytest.mark.parametrize("options, word", [("max_read=131072", "max_read"), ("max_read=4096", "max_read"),
                                           ("modules=subdir,subdir=/x", "modules"), ("subtype=x", "subtype")])
@pytest.mark.parametrize("foreground", [False, True])
def test_options_that_break_the_mount_are_refused(small, mountpoint, options, word, foreground):
    args = ["mount", str(small.path), str(mountpoint), "-o", options] + (["-f"] if foreground else [])
    one_error_line(run_cli(*args), 2, word)
    assert mounts_at(mountpoint) == 0


# The refusals above, lifted, to reach the check behind them: readiness is the root answering as our daemon.
_WITHOUT_REFUSALS = ("import sys, ckptfs.fs.options as o\n"
                     "for k in ('max_read', 'modules', 'subdir'): o.REFUSED.pop(k)\n"
                     "from ckptfs.commands.cli import main\nmain(sys.argv[1:])\n")


@pytest.mark.parametrize("options", ["max_read=131072", "modules=subdir,subdir=/x"])
@pytest.mark.parametrize("foreground", [False, True])
def test_a_mount_whose_root_does_not_answer_is_a_failure(small, mountpoint, options, foreground):
    args = ["mount", str(small.path), str(mountpoint), "-o", options] + (["-f"] if foreground else [])
    result = subprocess.run([sys.executable, "-c", _WITHOUT_REFUSALS, *args], env=cli_env(), capture_output=True,
                            text=True, timeout=90, stdin=subprocess.DEVNULL)
    one_error_line(result, 1, "does not answer", "not mounted")
    assert wait_until(lambda: mounts_at(mountpoint) == 0, timeout=10)


# -- 5. umount unmounts only ckptfs --------------------------------------------------------------------------


def test_umount_refuses_a_mount_that_is_not_ckptfs(tmp_path):
    if os.geteuid() != 0:
        skip_or_fail("mounting a tmpfs needs root")
    target = tmp_path / "tmpfs"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(target)], check=True)
    try:
        one_error_line(run_cli("umount", str(target)), 1, "tmpfs", "not a ckptfs mount")
        assert mounts_at(target) == 1
    finally:
        subprocess.run(["umount", str(target)], check=True)


def test_umount_through_a_symlink_as_mount_does(small, mountpoint, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(mountpoint)
    assert run_cli("mount", str(small.path), str(link)).returncode == 0
    assert mounts_at(mountpoint) == 1 and "q.npy" in os.listdir(link)
    result = run_cli("umount", str(link))
    assert result.returncode == 0, result.stderr
    assert mounts_at(mountpoint) == 0


# -- 6. special files are refused without blocking ----------------------------------------------------------------


def _special_files(tmp_path) -> list[Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    sock.close()
    return [fifo, sock_path]


def test_info_refuses_a_fifo_or_a_socket_without_blocking(tmp_path):
    for path, kind in zip(_special_files(tmp_path), ("FIFO", "socket")):
        one_error_line(run_cli("info", str(path), timeout=30), 1, str(path), kind)  # before: blocked in open()


def test_mount_refuses_a_fifo_without_blocking(tmp_path, mountpoint):
    fifo = _special_files(tmp_path)[0]
    one_error_line(run_cli("mount", str(fifo), str(mountpoint), timeout=30), 1, "FIFO")
    assert mounts_at(mountpoint) == 0


def test_the_api_refuses_a_fifo(tmp_path):
    fifo = _special_files(tmp_path)[0]
    code = f"import ckptfs\ntry:\n    ckptfs.open({str(fifo)!r})\nexcept ckptfs.CheckpointError as e:\n    print(e)\n"
    out = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=30)
    assert "is a FIFO" in out.stdout, out


# -- 7. one mount per mountpoint, also when started at once ----------------------------------------------------------


def test_simultaneous_mounts_at_one_mountpoint_make_one_mount(small, mountpoint):
    command = [*ckptfs_cli(), "mount", str(small.path), str(mountpoint)]
    procs = [subprocess.Popen(command, env=cli_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [(p.wait(timeout=90), p.stderr.read().strip()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    assert sorted(code for code, _ in results) == [0, 1, 1, 1], results
    assert all("already a mount point" in err for code, err in results if code), results
    assert mounts_at(mountpoint) == 1  # before: several stacked mounts, only the top one visible


# -- 8. path errors say the real reason ---------------------------------------------------------------------------


def test_a_symlink_loop_and_a_long_name_say_so(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    one_error_line(run_cli("info", str(tmp_path / "a")), 1, "too many levels of symbolic links")
    one_error_line(run_cli("info", str(tmp_path / ("x" * 300))), 1, "file name too long")


def _in_a_fork_as_nobody(fn) -> tuple[int, str]:
    """Run ``fn()`` in a forked child as user nobody (no exec: this process's modules stay usable): its exit
    code (SystemExit's, 0 when it returns) and what it wrote to stdout and stderr."""
    if os.geteuid() != 0:
        skip_or_fail("acting as another user needs root")
    with tempfile.TemporaryFile() as out:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)  # not pytest's capture objects
                sys.stderr = open(2, "w", closefd=False)
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                try:
                    fn()
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
            except BaseException as exc:  # noqa: BLE001 - report it to the parent
                print(f"{type(exc).__name__}: {exc}")
                code = 99
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        return os.waitstatus_to_exitcode(status), out.read().decode()


def test_permission_denied_on_a_parent_folder_says_so(small, tmp_path):
    locked = tmp_path / "locked"
    (locked / "sub").mkdir(parents=True)
    shutil.copy(small.path, locked / "sub" / "m.gguf")
    tmp_path.chmod(0o755)
    locked.chmod(0o700)  # root's: nobody cannot pass through it

    def open_it():
        try:
            ckptfs.open(str(locked / "sub" / "m.gguf"))
        except ckptfs.CheckpointError as exc:
            print(exc)

    code, out = _in_a_fork_as_nobody(open_it)
    assert code == 0 and "permission denied" in out and "no such file" not in out, out


def test_an_unreadable_file_is_one_line_not_a_usage_block(small, tmp_path):
    from ckptfs.commands.cli import main

    path = tmp_path / "unreadable.gguf"
    shutil.copy(small.path, path)
    tmp_path.chmod(0o755)
    path.chmod(0o600)
    code, out = _in_a_fork_as_nobody(lambda: main(["info", str(path)], prog_name="ckptfs"))
    lines = out.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "permission denied" in lines[0].lower(), out


def test_bytes_and_pathlike_paths(small):
    for src in (bytes(small.path), small.path, os.fsencode(str(small.path))):
        with ckptfs.open(src) as ck:
            assert ck.src == str(small.path) and np.array_equal(ck["f"][:], np.arange(32, dtype=np.float32))
    with pytest.raises(ckptfs.CheckpointError) as info:
        ckptfs.open(b"/nonexistent/m.gguf")
    assert str(info.value).startswith("/nonexistent/m.gguf: no such file")


# -- 9. usage errors are one line -----------------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["info"], ["Missing argument"]), (["mount", "SRC"], ["Missing argument"]),
    (["info", "SRC", "--dtype", "bf16"], ["--dtype"]), (["mount", "SRC", "MNT", "--dtype", "bf16"], ["bf16"]),
    (["mount", "SRC", "MNT", "--cache-size", "10X"], ["10X"]), (["mount", "SRC", "MNT", "--bad"], ["--bad"]),
    (["bogus"], ["bogus"]), (["bench", "SRC", "--cache-size", "64MB"], ["64MB", "ambiguous"]),
])
def test_usage_errors_are_one_line_with_exit_code_2(args, words):
    err = one_error_line(run_cli(*args), 2, *words)
    assert "--help" in err


def test_help_is_still_whole():
    result = run_cli("mount", "--help")
    assert result.returncode == 0 and "Usage:" in result.stdout and "--cache-size" in result.stdout
    assert "keep their stored dtype" in " ".join(result.stdout.split())  # item 12: --dtype float16, said plainly


# -- 10. control characters never split a line ----------------------------------------------------------------------


def test_info_escapes_control_characters_in_names_and_values(tmp_path):
    template = "{% for m in messages %}\n{{ m.content }}\r\n{% endfor %}"
    path = tmp_path / "odd.gguf"
    write_gguf(path, {"bad\nname": (np.ones((4, 32), np.float32), "Q8_0")},
               {"tokenizer.chat_template": template, "odd\nkey\x1b[31m": "v\tw"})
    os.truncate(path, path.stat().st_size - 60)  # the tensor is damaged: info lists its name
    result = run_cli("info", str(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "  tokenizer.chat_template = {% for m in messages %}\\n{{ m.content }}\\r\\n{% endfor %}" in lines
    assert "  odd\\nkey\\x1b[31m = v\\tw" in lines
    assert any(line.startswith("  'bad\\nname' (Q8_0): truncated") for line in lines), lines
    assert "\x1b" not in result.stdout and "\r" not in result.stdout


def test_an_error_naming_a_path_with_a_newline_stays_one_line(tmp_path):
    one_error_line(run_cli("info", str(tmp_path / "two\nlines.gguf")), 1, "two\\nlines.gguf", "no such file")


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


# -- 11. bench on a damaged checkpoint ------------------------------------------------------------------------------


def test_bench_serves_what_is_intact_and_marks_what_is_damaged(tmp_path):
    pytest.importorskip("gguf")
    rng = np.random.default_rng(5)
    path = tmp_path / "dmg.gguf"
    write_gguf(path, {"a": (rng.standard_normal((64, 256)).astype(np.float32), "Q8_0"),
                      "b": (rng.standard_normal((64, 256)).astype(np.float32), "Q8_0")})
    os.truncate(path, path.stat().st_size - 3000)  # cuts into b
    result = run_cli("bench", str(path), "--json", "--cache-size", "8M", timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [d["name"] for d in data["damaged"]] == ["b"] and "truncated" in data["damaged"][0]["reason"]
    assert data["mount"]["npy_bytes"] > 0 and data["mount"]["files"] == 7
    text = run_cli("bench", str(path), "--cache-size", "8M", timeout=300)
    assert text.returncode == 0 and "damaged tensors, left out of every read: 1" in text.stdout, text.stderr


def test_bench_names_the_file_and_tensor_when_a_read_fails(small, monkeypatch, capsys):
    """A read failing anyway (a file changed under the mount) names the phase, the file and the tensor."""
    require_fuse()
    from ckptfs import bench

    def failing_scan(paths, progress, *more):
        raise OSError(errno.EIO, "Input/output error", paths[0])

    monkeypatch.setattr(bench.run, "scan", failing_scan)  # the run looks scan up in its own module
    monkeypatch.setenv("PYTHONPATH", cli_env()["PYTHONPATH"])
    assert bench.run_bench(str(small.path), cache_size=8 << 20) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("ckptfs: error: scan every .npy: reading ") and "Input/output error" in err, err
    assert "(tensor " in err and ".npy" in err, err


# -- 12. sizes, an empty mountpoint --------------------------------------------------------------------------------


@pytest.mark.parametrize("text, size", [("512M", 512 << 20), ("64MiB", 64 << 20), ("1.5G", 3 << 29), ("0", 0),
                                        ("4096", 4096), ("1P", 1 << 50), ("7E", 7 << 60), ("2k", 2048)])
def test_sizes_in_binary_units(text, size):
    from ckptfs.util.sizes import parse_size

    assert parse_size(text) == size


@pytest.mark.parametrize("text, words", [("64MB", "ambiguous"), ("1GB", "ambiguous"), ("99999999999T", "too large"),
                                         ("8E", "too large"), ("-1", "not a size"), ("10X", "not a size")])
def test_sizes_refused(text, words):
    from ckptfs.util.sizes import parse_size

    with pytest.raises(ValueError, match=words):
        parse_size(text)


def test_an_empty_mountpoint_is_refused(small, tmp_path):
    require_fuse()
    result = subprocess.run([*ckptfs_cli(), "mount", str(small.path), ""], env=cli_env(), cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    one_error_line(result, 2, "empty")
    assert mounts_at(tmp_path) == 0


# -- 2. descriptors: released when a checkpoint is dropped, never reopened after close() ------------------------------


def _descriptors_on(path) -> int:
    """How many of this process's descriptors point at ``path``."""
    target, count = os.path.realpath(path), 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:
            pass
    return count


_OPEN_AND_DROP = """
import gc, os, resource, sys
import ckptfs
gc.disable()  # released at once by reference counting, not by a later collection
resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
for i in range(400):
    ck = ckptfs.open(sys.argv[1])
    row = ck["q"][i % 64]
    first = ck.tensors[1][:2]
    t = ck["q"]
    del ck  # the tensor keeps its checkpoint; dropping both releases it
    assert t[1].shape == (256,)
    del t
print("ok", len(os.listdir("/proc/self/fd")))
"""


def test_dropped_checkpoints_release_their_descriptors(small):
    out = subprocess.run([sys.executable, "-c", _OPEN_AND_DROP, str(small.path)], env=cli_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]  # before: Too many open files


def test_a_tensor_keeps_its_checkpoint_until_it_is_dropped(small):
    before = _descriptors_on(small.path)
    t = ckptfs.open(small.path)["q"]
    gc.collect()
    assert np.array_equal(t[3], small.tensors["q"].array[3]) and _descriptors_on(small.path) == before + 1
    del t
    gc.collect()
    assert _descriptors_on(small.path) == before


def test_reads_after_close_are_refused_and_reopen_nothing(small):
    before = _descriptors_on(small.path)
    ck = ckptfs.open(small.path)
    t = ck["q"]
    assert np.array_equal(t[1:3], small.tensors["q"].array[1:3])
    ck.close()
    assert ck.closed and _descriptors_on(small.path) == before
    for read in (lambda: t[0], lambda: t.raw(), lambda: np.asarray(ck["f"]), lambda: ck.tensors[1][:1]):
        with pytest.raises(ckptfs.CheckpointError, match="checkpoint is closed"):
            read()
    assert _descriptors_on(small.path) == before  # before: each read reopened the file, never to close it
    ck.close()  # closing twice is harmless
    assert ck["q"].shape == (64, 256) and ck.metadata["general.name"] == "small"  # what needs no read still works


def test_unpickled_tensors_work_after_their_origin_is_closed(small):
    with ckptfs.open(small.path) as ck:
        data = pickle.dumps(ck["q"])
    t = pickle.loads(data)  # reopens in this process, as a worker would
    assert np.array_equal(t[5], small.tensors["q"].array[5])


def test_a_block_device_is_read_as_a_checkpoint(small, tmp_path):
    """Item 6's exception: block devices are not refused, and they work (their size is where they end)."""
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        skip_or_fail("attaching a loop device needs root and losetup")
    image = tmp_path / "image.bin"
    data = small.path.read_bytes()
    image.write_bytes(data + bytes(-len(data) % 4096))  # a loop device is a whole number of sectors
    attached = subprocess.run(["losetup", "--find", "--show", "--read-only", str(image)], capture_output=True,
                              text=True)
    if attached.returncode != 0:
        skip_or_fail(f"no loop device: {attached.stderr.strip()}")
    device = attached.stdout.strip()
    try:
        with ckptfs.open(device) as ck:
            assert np.array_equal(ck["q"][:], small.tensors["q"].array)  # before: "empty file"
            assert np.array_equal(np.asarray(ck["f"]), small.tensors["f"].array)
        result = run_cli("info", device)
        assert result.returncode == 0 and "tensors: 2" in result.stdout, result.stderr
    finally:
        subprocess.run(["losetup", "--detach", device], check=True)
