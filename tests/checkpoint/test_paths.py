"""How a source path is taken, and refused with the real reason in one line: FIFOs and sockets (refused
without blocking, by ``info``, ``mount`` and the API), symlink loops and long names, permission denied on a
parent folder or the file (acting as user nobody), ``bytes`` and PathLike paths, a newline in a path, an empty
mountpoint; block devices are read as checkpoints (their size is where they end).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from cli_runs import mounts_at, one_error_line, run_cli
from conftest import ckptfs_cli, cli_env, require_fuse, skip_or_fail

import ckptfs


NOBODY = 65534


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


def test_an_error_naming_a_path_with_a_newline_stays_one_line(tmp_path):
    one_error_line(run_cli("info", str(tmp_path / "two\nlines.gguf")), 1, "two\\nlines.gguf", "no such file")


def test_an_empty_mountpoint_is_refused(small, tmp_path):
    require_fuse()
    result = subprocess.run([*ckptfs_cli(), "mount", str(small.path), ""], env=cli_env(), cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    one_error_line(result, 2, "empty")
    assert mounts_at(tmp_path) == 0


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
