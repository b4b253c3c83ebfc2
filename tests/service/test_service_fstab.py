"""``mount -t fuse.ckptfs``, ``/etc/fstab`` lines and the helper mount(8) runs.

The real path: mount(8) (util-linux) finds ``/sbin/mount.fuse.ckptfs`` (``scripts/setup.sh`` runs ``ckptfs
install-mount-helper``), runs it with its own argument convention and a minimal environment, and the helper
runs ``ckptfs mount``. Where that helper is not installed (a development machine), the tests that need
mount(8) skip (and fail under CI=true); a helper installed to a temporary path is still run exactly as
mount(8) runs it: an empty environment, ``SRC MNT -o OPTS`` (and ``-o rw`` when no ro/rw is given, which
util-linux 2.38 does).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (ckptfs_cli, cli_env, force_unmount, is_mounted, mount_stats, pid_alive, require_fuse,
                      skip_or_fail, wait_until)
from fixtures import write_mixed_gguf

from ckptfs.commands.cli import mount as mount_command
from ckptfs.commands.fstab import HelperError, mount_arguments, parse_helper_argv
from ckptfs.commands.mount_helper import HELPER_MARK, HELPER_PATH, helper_script


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return Path(write_mixed_gguf(tmp_path_factory.mktemp("src") / "model.gguf").path)


def translate(*argv: str) -> list[str]:
    return mount_arguments(parse_helper_argv(list(argv)), mount_command)


def test_every_long_option_has_a_key_value_spelling():
    args = translate("/m/x.gguf", "/mnt/x", "-o", "rw,cache_size=1G,dtype=float16,log_file=/var/log/c.log",
                            "-o", "_netdev,nofail,x-systemd.automount,x-systemd.idle-timeout=60,dev,suid,noatime,"
                            "defaults,log_format=json,metrics=9101,allow_other,verbose,foreground=false")
    assert args == ["mount", "/m/x.gguf", "/mnt/x", "--cache-size", "1G", "--dtype", "float16", "--log-file",
                    "/var/log/c.log", "--log-format", "json", "--metrics", "9101", "--verbose", "-o", "allow_other"]
    # every long option of `ckptfs mount` is reachable, whoever added it
    for param in mount_command.params:
        for opt in param.opts:
            if opt.startswith("--"):
                key = opt[2:].replace("-", "_")
                spelled = f"{key}" if getattr(param, "is_flag", False) else f"{key}=v"
                args = translate("s", "m", "-o", spelled)
                assert opt in args, (opt, args)


def test_helper_arguments_as_mount8_passes_them():
    call = parse_helper_argv(["src", "mnt", "-n", "-sv", "-f", "-t", "fuse.ckptfs", "-oro"])
    assert (call.src, call.mountpoint, call.fake, call.verbose, call.options) == ("src", "mnt", True, True, ["ro"])
    with pytest.raises(HelperError):
        parse_helper_argv(["only-src"])
    with pytest.raises(HelperError):
        translate("s", "m", "-o", "cache_size")  # a value option without its value
    with pytest.raises(HelperError):
        translate("s", "m", "-o", "verbose=maybe")


def install(tmp_path: Path) -> Path:
    target = tmp_path / "mount.fuse.ckptfs"
    result = subprocess.run([*ckptfs_cli(), "install-mount-helper", "--target", str(target)], env=cli_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(target) and os.access(target, os.X_OK)
    return target


def wait_gone(mnt: Path, pid: int) -> None:
    force_unmount(mnt)
    assert wait_until(lambda: not pid_alive(pid), timeout=10)


def test_installed_helper_mounts_with_an_empty_environment(source, tmp_path):
    require_fuse()
    helper = install(tmp_path)
    text = helper.read_text()
    assert HELPER_MARK in text and "PATH=" in text and " -I -m ckptfs.commands.fstab " in text
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    result = subprocess.run(["env", "-i", str(helper), str(source), str(mnt), "-o",
                             f"rw,cache_size=32M,_netdev,nofail,x-systemd.automount,dev,suid,log_file={log}"],
                            cwd=elsewhere, capture_output=True, text=True, timeout=120)
    try:
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""  # mount(8)'s own rw: nothing to say (this helper runs the installed ckptfs)
        stats = mount_stats(mnt)
        assert stats["cache"]["capacity"] == 32 << 20
        assert "mounted" in log.read_text()
        assert "metadata.json" in os.listdir(mnt)
        options = next(line.split()[5] for line in open("/proc/self/mountinfo") if line.split()[4] == str(mnt))
        assert "ro" in options.split(",")
    finally:
        if is_mounted(mnt):
            wait_gone(mnt, mount_stats(mnt)["pid"])
    fake = subprocess.run(["env", "-i", str(helper), str(source), str(mnt), "-f", "-o", "ro"], capture_output=True,
                          timeout=60)
    assert fake.returncode == 0 and not is_mounted(mnt)
    bad = subprocess.run(["env", "-i", str(helper), str(source), str(mnt), "-o", "cache_size=lots"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and not is_mounted(mnt)


def test_rw_says_nothing_and_an_unknown_option_is_a_usage_error(source, tmp_path):
    """The helper module as mount(8) runs it (``SRC MNT -o rw,...``), from this checkout: rw says nothing;
    an option neither ckptfs nor libfuse knows is exit 2 and one usage-error line, through the helper and
    through ``ckptfs mount`` (in the background and with -f), and nothing is mounted."""
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    helper = [sys.executable, "-m", "ckptfs.commands.fstab"]
    result = subprocess.run([*helper, str(source), str(mnt), "-o", "rw,cache_size=16M"], env=cli_env(),
                            capture_output=True, text=True, timeout=120)
    try:
        assert result.returncode == 0, result.stderr
        assert result.stderr == "" and result.stdout == ""
        assert mount_stats(mnt)["cache"]["capacity"] == 16 << 20
    finally:
        if is_mounted(mnt):
            wait_gone(mnt, mount_stats(mnt)["pid"])
    for argv in ([*helper, str(source), str(mnt), "-o", "rw,bogus=1"],
                 [*ckptfs_cli(), "mount", str(source), str(mnt), "-o", "bogus=1"],
                 [*ckptfs_cli(), "mount", "-f", str(source), str(mnt), "-o", "allow_other,bogus"]):
        bad = subprocess.run(argv, env=cli_env(), capture_output=True, text=True, timeout=120)
        if is_mounted(mnt):
            force_unmount(mnt)
        assert bad.returncode == 2, (argv, bad.stderr)
        bogus = "bogus" if argv[-1].endswith(",bogus") else "bogus=1"
        assert bad.stderr == (f"ckptfs: usage error: -o {bogus}: not an option of ckptfs mount or of libfuse "
                              f"(see 'ckptfs mount --help')\n"), bad.stderr


def test_install_refuses_to_replace_a_foreign_helper(tmp_path):
    target = tmp_path / "mount.fuse.ckptfs"
    target.write_text("#!/bin/sh\necho someone else's\n")
    result = subprocess.run([*ckptfs_cli(), "install-mount-helper", "--target", str(target)], env=cli_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "not written by ckptfs" in result.stderr
    assert "someone else's" in target.read_text()
    target.unlink()
    install(tmp_path)
    install(tmp_path)  # ours: replaced in place


def test_a_helper_whose_python_is_gone_says_so_in_one_line(tmp_path):
    # the virtual environment it was installed with removed or moved: the fix named, not the shell's 127
    gone = tmp_path / "removed venv" / "bin" / "python"
    helper = tmp_path / "mount.fuse.ckptfs"
    helper.write_text(helper_script(str(gone)))
    helper.chmod(0o755)
    result = subprocess.run(["env", "-i", str(helper), "/m/x.gguf", "/mnt/x", "-o", "ro"], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(gone) in lines[0] and "ckptfs install-mount-helper" in lines[0], lines


def _helper_python(text: str) -> str | None:
    """The interpreter an installed helper runs (its ``PY=`` line, or an older helper's ``exec`` line)."""
    for line in text.splitlines():
        if line.startswith("PY="):
            return shlex.split(line[3:])[0]
        if line.startswith("exec ") and " -m ckptfs.commands.fstab" in line:
            return shlex.split(line)[1]
    return None


def system_helper() -> None:
    require_fuse()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        skip_or_fail("mount -t fuse.ckptfs needs root and util-linux mount")
    text = Path(HELPER_PATH).read_text(errors="replace") if os.path.exists(HELPER_PATH) else ""
    if HELPER_MARK not in text:
        skip_or_fail(f"{HELPER_PATH} is not installed (scripts/setup.sh runs `ckptfs install-mount-helper`)")
    python = _helper_python(text)
    if python is not None and not os.access(python, os.X_OK):
        skip_or_fail(f"{HELPER_PATH} runs {python}, which is gone: run `ckptfs install-mount-helper` again")


def test_mount_t_fuse_ckptfs(source, tmp_path):
    system_helper()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run(["mount", "-t", "fuse.ckptfs", str(source), str(mnt), "-o",
                             "cache_size=16M,_netdev,nofail,metrics=127.0.0.1:0"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    try:
        assert result.stderr == ""  # mount(8) passed -o rw itself: nothing to say about it
        stats = mount_stats(mnt)
        assert stats["cache"]["capacity"] == 16 << 20 and stats["metrics"].startswith("127.0.0.1:")
        assert (mnt / "q8_0.mat.npy").read_bytes()[:6] == b"\x93NUMPY"
        fstype = next(line.split(" - ")[1].split()[0] for line in open("/proc/self/mountinfo")
                      if line.split()[4] == str(mnt))
        assert fstype == "fuse.ckptfs"
    finally:
        wait_gone(mnt, mount_stats(mnt)["pid"])
    fake = subprocess.run(["mount", "-f", "-t", "fuse.ckptfs", str(source), str(mnt)], capture_output=True,
                          timeout=60)
    assert fake.returncode == 0 and not is_mounted(mnt)


def test_an_fstab_line(source, tmp_path):
    system_helper()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# an /etc/fstab line for a ckptfs mount\n"
                     f"{source} {mnt} fuse.ckptfs ro,cache_size=8M,dtype=float16,_netdev,nofail,"
                     f"x-systemd.automount,x-systemd.mount-timeout=30 0 0\n")
    result = subprocess.run(["mount", "-T", str(fstab), str(mnt)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    pid = mount_stats(mnt)["pid"]
    try:
        assert mount_stats(mnt)["cache"]["capacity"] == 8 << 20
        assert b"'descr': '<f2'" in (mnt / "q8_0.mat.npy").read_bytes()[:128]  # dtype=float16 took effect
    finally:
        umount = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=60)
        assert umount.returncode == 0, umount.stderr
        assert wait_until(lambda: not pid_alive(pid), timeout=10)
        force_unmount(mnt)
