"""The mount's life cycle: daemon readiness (a mount whose root does not answer is a failure, options
that would break it are refused), one mount per mountpoint also when started at once, detaching, signals,
SIGKILL, umount (only of ckptfs mounts, also through a symlink), errors, permissions."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from cli_runs import mounts_at, one_error_line, run_cli
from conftest import (DEFAULT_SIGNALS, REPO, ckptfs_cli, cli_env, force_unmount, is_mounted, mount_stats, pid_alive,
                      require_fuse, skip_or_fail, wait_until)
from fixtures import Written, write_gguf
from mount_expect import big_tensors, expected_gguf, read_direct

from ckptfs.util import procinfo
from users import AS_NOBODY, NOBODY, public_dir  # noqa: F401

CLI = " ".join(shlex.quote(c) for c in ckptfs_cli())


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, *words: str) -> None:
    err = result.stderr.strip()
    assert result.returncode == code, (result.returncode, err)
    prefix = "ckptfs: usage error: " if code == 2 else "ckptfs: error: "
    assert "\n" not in err and "Traceback" not in err and err.startswith(prefix), err
    for word in words:
        assert word in err, err


@pytest.fixture(scope="module")
def big_gguf(tmp_path_factory) -> Written:
    return write_gguf(tmp_path_factory.mktemp("src") / "big.gguf", big_tensors(), {"general.name": "big"})


def daemon_pid(mnt: Path) -> int:
    return mount_stats(mnt)["pid"]


# ---------------------------------------------------------------------------------------- daemon mode


def test_mount_returns_when_ready(big_gguf, mountpoint):
    """`ckptfs mount a b && ls b` shows the files: the parent returns only once init has run."""
    result = subprocess.run(["bash", "-c", f"{CLI} mount {big_gguf.path} {mountpoint} && ls {mountpoint}"],
                            env=cli_env(), capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    assert "big.q4_k.npy" in result.stdout.split() and result.stderr == ""
    pid = daemon_pid(mountpoint)
    assert pid != os.getpid() and pid_alive(pid)
    with open(f"/proc/{pid}/stat") as fh:  # detached: its own session
        fields = fh.read().rsplit(") ", 1)[1].split()
    assert int(fields[3]) == pid  # session id


def test_command_substitution_returns(big_gguf, mountpoint):
    """The daemon's stdio is detached, so `$(ckptfs mount ...)` does not wait for it."""
    result = subprocess.run(["bash", "-c", f'out=$({CLI} mount {big_gguf.path} {mountpoint} 2>&1); echo "[$out]"'],
                            env=cli_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "[]\n"
    assert is_mounted(mountpoint)


def test_umount_command(big_gguf, mountpoint):
    assert run_cli("mount", str(big_gguf.path), str(mountpoint)).returncode == 0
    pid = daemon_pid(mountpoint)
    result = run_cli("umount", str(mountpoint))
    assert result.returncode == 0 and result.stderr == ""
    assert not is_mounted(mountpoint) and os.listdir(mountpoint) == []
    assert wait_until(lambda: not pid_alive(pid), timeout=10)  # the daemon noticed and exited
    assert_one_line_error(run_cli("umount", str(mountpoint)), 1, "not a mount point")


def test_log_file_and_eio_for_missing_bytes(tmp_path, mountpoint):
    """A truncated checkpoint is served around the hole; a read touching missing bytes is EIO with one
    log line naming the file and the byte range; every other byte is exact."""
    written = write_gguf(tmp_path / "cut.gguf", big_tensors(), {"general.name": "cut"})
    expected = expected_gguf(written, str(written.path))
    size = written.path.stat().st_size
    os.truncate(written.path, size - 5000)  # cuts into the last tensor (big.f32)
    log = tmp_path / "daemon.log"
    result = run_cli("mount", str(written.path), str(mountpoint), "--log-file", str(log))
    assert result.returncode == 0, result.stderr
    for name in ("big.q4_k.npy", "big.q6_k.raw", "big.bf16.npy"):
        assert (mountpoint / name).read_bytes() == expected.data[name]
    data = expected.data["big.f32.npy"]
    assert read_direct(mountpoint / "big.f32.npy", [(0, 4096)])[0] == data[:4096]  # present: exact
    before = log.read_text().splitlines()
    with pytest.raises(OSError) as info:
        read_direct(mountpoint / "big.f32.npy", [(len(data) - 100, 100)])
    assert info.value.errno == errno.EIO
    new = log.read_text().splitlines()[len(before):]
    assert len(new) == 1 and "EIO" in new[0] and "big.f32.npy" in new[0] and "bytes" in new[0], new
    assert "mounted" in before[0]


def test_files_changed_under_the_mount_give_eio_never_other_bytes(tmp_path, mountpoint):
    written = write_gguf(tmp_path / "live.gguf", big_tensors(), {"general.name": "live"})
    expected = expected_gguf(written, str(written.path))
    assert run_cli("mount", str(written.path), str(mountpoint)).returncode == 0
    assert (mountpoint / "big.q4_k.npy").read_bytes() == expected.data["big.q4_k.npy"]
    with open(written.path, "r+b") as fh:  # same size, other bytes, new mtime
        fh.seek(-4096, os.SEEK_END)
        fh.write(b"\xff" * 4096)
    os.utime(written.path, ns=(0, 1))
    with pytest.raises(OSError) as info:
        (mountpoint / "big.f32.raw").read_bytes()
    assert info.value.errno == errno.EIO
    assert (mountpoint / "big.q4_k.npy").read_bytes() == expected.data["big.q4_k.npy"]  # daemon alive


# ---------------------------------------------------------------------------------------- signals


def start_foreground(src: Path, mnt: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([*DEFAULT_SIGNALS, *ckptfs_cli(), "mount", "-f", str(src), str(mnt), *args],
                            env=env or cli_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait_until(lambda: is_mounted(mnt) or proc.poll() is not None, timeout=60) or proc.poll() is not None:
        proc.kill()
        pytest.fail(f"foreground mount failed: {proc.communicate()[1]}")
    os.listdir(mnt)  # blocks until init has answered
    return proc


class Readers:
    """Threads reading big files through O_DIRECT (every read reaches the daemon) until stopped."""

    def __init__(self, mnt: Path, names: list[str], count: int = 4):
        self.mnt, self.names = mnt, names
        self.stop = threading.Event()
        self.started = threading.Semaphore(0)
        self.errors: list[int] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)]
        for t in self.threads:
            t.start()
        for _ in self.threads:
            assert self.started.acquire(timeout=30)

    def _run(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        first = True
        while not self.stop.is_set():
            name = self.names[int(rng.integers(len(self.names)))]
            try:
                read_direct(self.mnt / name, [(int(rng.integers(0, 100_000)), 300_000)])
            except OSError as exc:
                self.errors.append(exc.errno)
                if exc.errno in (errno.ENOENT, errno.ENOTCONN):  # unmounted: the plain directory is back
                    break
            if first:
                self.started.release()
                first = False

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
            assert not t.is_alive(), "a reader hung on the mount"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_unmount_cleanly_with_reads_in_flight(big_gguf, mountpoint, signum):
    proc = start_foreground(big_gguf.path, mountpoint)
    readers = Readers(mountpoint, ["big.q4_k.npy", "big.q6_k.npy", "big.bf16.npy", "big.q8_0.npy"])
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    readers.join()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert wait_until(lambda: not is_mounted(mountpoint), timeout=5)
    assert os.listdir(mountpoint) == []  # a plain empty directory again: no ENOTCONN
    assert set(readers.errors) <= {errno.ENOENT, errno.ENOTCONN, errno.EIO, errno.ECONNABORTED, errno.ENODEV}


def test_sigterm_to_the_daemon(big_gguf, mountpoint, tmp_path):
    log = tmp_path / "d.log"
    assert run_cli("mount", str(big_gguf.path), str(mountpoint), "--log-file", str(log)).returncode == 0
    pid = daemon_pid(mountpoint)
    readers = Readers(mountpoint, ["big.q4_k.npy", "big.f16.npy"], count=2)
    os.kill(pid, signal.SIGTERM)
    assert wait_until(lambda: not pid_alive(pid), timeout=20)
    readers.join()
    assert not is_mounted(mountpoint) and os.listdir(mountpoint) == []
    text = log.read_text()
    assert "unmounted" in text and "ERROR" not in text and "Traceback" not in text, text


def test_sigkill_leaves_no_dead_mount(big_gguf, mountpoint):
    """auto_unmount: fusermount3 stays behind and unmounts when the daemon's /dev/fuse closes."""
    assert run_cli("mount", str(big_gguf.path), str(mountpoint)).returncode == 0
    pid = daemon_pid(mountpoint)
    (mountpoint / "big.q4_k.npy").read_bytes()
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not is_mounted(mountpoint), timeout=10)
    assert os.listdir(mountpoint) == [] and os.path.isdir(mountpoint)


def test_dead_mount_is_reported_and_umount_clears_it(big_gguf, mountpoint):
    """Kill the auto_unmount helper first, then the daemon: a dead mount. mount refuses it in one line;
    umount clears it."""
    assert run_cli("mount", str(big_gguf.path), str(mountpoint)).returncode == 0
    pid = daemon_pid(mountpoint)
    helpers = procinfo.children(pid)
    assert helpers, "no fusermount helper under the daemon"
    for helper in helpers:
        os.kill(helper, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(pid), timeout=10)
    with pytest.raises(OSError) as info:
        os.listdir(mountpoint)
    assert info.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    assert_one_line_error(run_cli("mount", str(big_gguf.path), str(mountpoint)), 1, "dead mount", "umount")
    assert run_cli("umount", str(mountpoint)).returncode == 0
    assert not is_mounted(mountpoint) and os.listdir(mountpoint) == []


# ---------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("options, words", [("rw", ["rw", "read-only"]), ("direct_io", ["direct_io", "mmap"]),
                                            ("allow_other,direct_io", ["direct_io"])])
def test_refused_options_are_usage_errors(big_gguf, mountpoint, options, words):
    assert_one_line_error(run_cli("mount", str(big_gguf.path), str(mountpoint), "-o", options), 2, *words)
    assert not is_mounted(mountpoint)


def test_mountpoint_errors(big_gguf, mountpoint, tmp_path):
    src = str(big_gguf.path)
    assert_one_line_error(run_cli("mount", src, str(tmp_path / "missing")), 1, "does not exist")
    assert_one_line_error(run_cli("mount", src, src), 1, "not a directory")
    (mountpoint / "file").write_text("x")
    assert_one_line_error(run_cli("mount", src, str(mountpoint)), 1, "not empty", "nonempty")
    assert run_cli("mount", src, str(mountpoint), "-o", "nonempty").returncode == 0
    assert "big.q4_k.npy" in os.listdir(mountpoint)
    assert_one_line_error(run_cli("mount", src, str(mountpoint)), 1, "already a mount point")


def test_checkpoint_errors(mountpoint, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(60)))
    assert_one_line_error(run_cli("mount", str(bad), str(mountpoint)), 1, str(bad))
    assert_one_line_error(run_cli("mount", str(tmp_path / "none.gguf"), str(mountpoint)), 1, "none.gguf")
    assert not is_mounted(mountpoint)


@pytest.mark.parametrize("foreground", [False, True])
def test_libfuse_errors_come_back_as_one_line(big_gguf, mountpoint, foreground):
    """An option only libfuse can judge: its refusal, through the readiness pipe in daemon mode, is a usage
    error (exit 2) naming the option."""
    args = ["mount", str(big_gguf.path), str(mountpoint), "-o", "no_such_option"] + (["-f"] if foreground else [])
    assert_one_line_error(run_cli(*args), 2, "-o no_such_option: not an option of ckptfs mount or of libfuse")
    assert not is_mounted(mountpoint)


def test_fuse_unavailable_errors(big_gguf, mountpoint):
    src, mnt = str(big_gguf.path), str(mountpoint)
    assert_one_line_error(run_cli("mount", src, mnt, env=cli_env(FUSE_LIBRARY_PATH="/nonexistent/libfuse3.so.3")),
                          1, "libfuse3-3")
    assert_one_line_error(run_cli("mount", src, mnt, env=cli_env(CKPTFS_FUSE_BINDING="nope")), 2, "mfusepy")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip_or_fail("hiding /dev/fuse needs root and unshare")
    hidden = subprocess.run(["unshare", "--mount", "sh", "-c", f"mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && exec {CLI} mount {src} {mnt}"],
                            env=cli_env(), capture_output=True, text=True, timeout=60)
    assert_one_line_error(hidden, 1, "/dev/fuse")


def test_fork_happens_with_a_single_thread():
    """daemon.py forks after numpy is imported: numpy's OpenBLAS stops its threads in a pthread_atfork
    handler, so at the fork this process is single-threaded (threads restart lazily)."""
    code = ("import os, ckptfs.checkpoint.api\npid = os.fork()\nif pid == 0: os._exit(0)\nos.waitpid(pid, 0)\n"
            "print(len(os.listdir('/proc/self/task')))")
    out = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


# ---------------------------------------------------------------------------------------- permissions


def _as_nobody(*command: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*AS_NOBODY, *command], capture_output=True, timeout=60, **kwargs)




def test_allow_other_lets_another_user_read(big_gguf, public_dir):
    require_fuse()
    expected = expected_gguf(big_gguf, str(big_gguf.path))
    source = public_dir / "big.gguf"  # a file the other user can read directly (pytest's folders are 0700)
    shutil.copyfile(big_gguf.path, source)
    source.chmod(0o644)
    for options, readable in (("allow_other", True), ("", False)):
        mnt = public_dir / f"mnt{options}"
        mnt.mkdir()
        args = ["mount", str(source), str(mnt)] + (["-o", options] if options else [])
        assert run_cli(*args).returncode == 0
        result = _as_nobody("cat", str(mnt / "big.q4_k.npy"))
        if readable:
            assert result.returncode == 0 and result.stdout == expected.data["big.q4_k.npy"]
        else:
            assert result.returncode != 0 and b"Permission denied" in result.stderr
        assert run_cli("umount", str(mnt)).returncode == 0


def _python_for_nobody() -> tuple[list[str], dict[str, str]] | None:
    """An interpreter another user can run with this checkout and the venv's packages importable."""
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = cli_env(PYTHONPATH=os.pathsep.join([str(REPO), site]))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, shutil.which(f"python{version}") or "", "/usr/bin/python3"):
        if python and _as_nobody(python, "-c", "import ckptfs.service.mount, mfusepy", env=env).returncode == 0:
            return [python, "-m", "ckptfs.commands.cli"], env
    return None


def test_mount_by_an_unprivileged_user(big_gguf, public_dir):
    """fusermount3 (setuid) mounts for a user who owns the mountpoint; other users, root included, are
    kept out unless allow_other."""
    require_fuse()
    if _as_nobody("test", "-r", "/dev/fuse", "-a", "-w", "/dev/fuse").returncode != 0:
        skip_or_fail("/dev/fuse is not accessible to unprivileged users here (mode "
                     f"{oct(os.stat('/dev/fuse').st_mode & 0o777)}; Debian's udev rule makes it 0666)")
    found = _python_for_nobody()
    if found is None:
        skip_or_fail("no Python interpreter runnable by an unprivileged user sees this checkout")
    cli, env = found
    src = public_dir / "model.gguf"
    shutil.copy(big_gguf.path, src)
    src.chmod(0o644)
    mnt = public_dir / "mnt"
    mnt.mkdir()
    os.chown(mnt, NOBODY, NOBODY)
    result = _as_nobody(*cli, "mount", str(src), str(mnt), env=env, text=True)
    assert result.returncode == 0, result.stderr
    try:
        expected = expected_gguf(big_gguf, str(src))
        read = _as_nobody("cat", str(mnt / "big.q6_k.npy"))
        assert read.returncode == 0 and read.stdout == expected.data["big.q6_k.npy"]
        with pytest.raises(PermissionError):
            os.listdir(mnt)  # root is another user here
        unmounted = _as_nobody(*cli, "umount", str(mnt), env=env, text=True)
        assert unmounted.returncode == 0, unmounted.stderr
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)


@pytest.mark.parametrize("options, word", [("max_read=131072", "max_read"), ("max_read=4096", "max_read"),
                                           ("modules=subdir,subdir=/x", "modules"), ("subtype=x", "subtype")])
@pytest.mark.parametrize("foreground", [False, True])
def test_options_that_break_the_mount_are_refused(small, mountpoint, options, word, foreground):
    args = ["mount", str(small.path), str(mountpoint), "-o", options] + (["-f"] if foreground else [])
    one_error_line(run_cli(*args), 2, word)
    assert mounts_at(mountpoint) == 0


_WITHOUT_REFUSALS = ("import sys, ckptfs.service.options as o\n"
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


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_daemon_started_with_the_signal_ignored_still_unmounts_on_it(big_gguf, mountpoint, signum):
    """``nohup ckptfs mount ...`` (SIGHUP ignored) or a caller ignoring SIGTERM: the detached daemon does not
    inherit the "ignore", so the signal unmounts as documented."""
    name = signal.Signals(signum).name[3:]
    result = subprocess.run(["env", f"--ignore-signal={name}", *ckptfs_cli(), "mount", str(big_gguf.path),
                             str(mountpoint)], env=cli_env(), stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    pid = daemon_pid(mountpoint)
    assert (mountpoint / "big.q8_0.npy").stat().st_size > 0
    os.kill(pid, signum)
    assert wait_until(lambda: not pid_alive(pid), timeout=20)
    assert wait_until(lambda: not is_mounted(mountpoint), timeout=5)
    assert os.listdir(mountpoint) == []
