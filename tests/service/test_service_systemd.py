"""The systemd unit of docs/service.md: ``systemd-analyze verify`` accepts it, and its commands work.

The unit is taken from the document itself (the ```ini block naming ``ckptfs-llama.service``), with the
example installation path replaced by this installation's ``ckptfs`` and the example checkpoint and
mountpoint by test ones. ``ExecStart``, ``ExecReload`` and ``ExecStop`` are then run as systemd runs a
``Type=forking`` service: ExecStart returns once the daemon is ready, ``$MAINPID`` is that daemon.

``systemd-analyze`` comes with Debian's ``systemd`` package (.ci/run installs it: in a container it is only
the tools, since systemd-sysv, which would make it the init, is not installed). Without it, or without the
``ckptfs`` console script, the tests skip, and under CI=true they fail.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import (REPO, cli_env, force_unmount, is_mounted, mount_stats, pid_alive, require_fuse, skip_or_fail,
                      wait_until)
from fixtures import write_mixed_gguf

DOC = REPO / "docs" / "service.md"
EXAMPLE_CKPTFS = "/opt/ckptfs/.venv/bin/ckptfs"


def documented_unit() -> str:
    text = DOC.read_text()
    match = re.search(r"```ini\n(# /etc/systemd/system/ckptfs-llama\.service\n.*?)```", text, re.S)
    assert match, "docs/service.md lost its unit example"
    return match.group(1)


def this_ckptfs() -> str:
    """The ``ckptfs`` console script of this installation (the unit names a command by absolute path)."""
    candidate = Path(sys.executable).parent / "ckptfs"
    if not candidate.exists():
        skip_or_fail("no ckptfs console script beside this Python (pip install the package)")
    return str(candidate)


def unit_for(src: Path, mnt: Path, log: Path) -> str:
    return (documented_unit().replace(EXAMPLE_CKPTFS, this_ckptfs()).replace("/srv/models/llama", str(src))
            .replace("/mnt/llama", str(mnt)).replace("/var/log/ckptfs/llama.log", str(log)))


def service_lines(unit: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(key + "=")]


def test_unit_passes_systemd_analyze_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:
        skip_or_fail("systemd-analyze is not installed (Debian: apt-get install --no-install-recommends systemd)")
    unit = tmp_path / "ckptfs-llama.service"
    unit.write_text(unit_for(tmp_path / "model.gguf", tmp_path / "mnt", tmp_path / "llama.log"))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ckptfs-llama.service" not in result.stderr, result.stderr  # no warning about the unit itself


def test_unit_commands_run_as_systemd_runs_them(tmp_path):
    require_fuse()
    src = Path(write_mixed_gguf(tmp_path / "model.gguf").path)
    mnt, log = tmp_path / "mnt", tmp_path / "llama.log"
    unit = unit_for(src, mnt, log)
    assert service_lines(unit, "Type") == ["forking"]
    env = cli_env()
    pre, = service_lines(unit, "ExecStartPre")
    subprocess.run(shlex.split(pre), check=True, timeout=30, env=env)
    start, = service_lines(unit, "ExecStart")
    port_free = start.replace("--metrics 9101", "--metrics 127.0.0.1:0")  # the port of the example may be taken
    result = subprocess.run(shlex.split(port_free), capture_output=True, text=True, timeout=120, env=env,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    try:
        main_pid = mount_stats(mnt)["pid"]
        assert (mnt / "metadata.json").read_bytes() and "mounted" in log.read_text()
        reload, = service_lines(unit, "ExecReload")
        log.rename(tmp_path / "llama.log.1")
        subprocess.run(shlex.split(reload.replace("$MAINPID", str(main_pid))), check=True, timeout=30)
        assert wait_until(lambda: log.exists() and "reopened log file" in log.read_text(), timeout=10)
        stop, = service_lines(unit, "ExecStop")
        subprocess.run(shlex.split(stop), check=True, timeout=60, env=env)
        assert wait_until(lambda: not pid_alive(main_pid), timeout=10)
        assert not is_mounted(mnt) and os.listdir(mnt) == []
    finally:
        force_unmount(mnt)
