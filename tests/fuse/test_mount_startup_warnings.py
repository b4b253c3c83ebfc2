"""What a mount warns about while it opens the checkpoint (before its daemon is forked) reaches ``--log-file``
as well as stderr: a mount started by fstab or systemd has a stderr nobody keeps."""

from __future__ import annotations

import json
import subprocess

import pytest

pytest.importorskip("redis")

from cli_runs import run_cli
from conftest import ckptfs_cli, cli_env, force_unmount, is_mounted, wait_until
from loopback.redis_server import RedisServer

WARNING = "no --cache-key-file, so its values are trusted as-is"


@pytest.fixture
def redis_url():
    with RedisServer() as server:
        yield server.url


def test_the_redis_trusted_as_is_warning_reaches_the_log_file(small, mountpoint, redis_url, tmp_path):
    log = tmp_path / "mount.log"
    result = run_cli("mount", str(small.path), str(mountpoint), "--redis", redis_url, "--log-file", str(log))
    assert result.returncode == 0, result.stderr
    assert WARNING in result.stderr
    lines = log.read_text().splitlines()
    warned = [line for line in lines if WARNING in line]
    assert warned and " WARNING ckptfs.cache.redis_tier: redis 127.0.0.1:" in warned[0], lines
    assert lines.index(warned[0]) < next(i for i, line in enumerate(lines) if "mounted" in line)


def test_json_logs_get_it_as_json_and_a_foreground_mount_too(small, mountpoint, redis_url, tmp_path):
    log = tmp_path / "mount.log"
    proc = subprocess.Popen([*ckptfs_cli(), "mount", "-f", str(small.path), str(mountpoint), "--redis", redis_url,
                             "--log-file", str(log), "--log-format", "json"], env=cli_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: is_mounted(mountpoint) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.communicate()[1]
    finally:
        force_unmount(mountpoint)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    warned = [r for r in records if WARNING in r["message"]]
    assert warned and warned[0]["level"] == "WARNING" and warned[0]["logger"] == "ckptfs.cache.redis_tier", records
    assert WARNING in err
