"""A loopback server's missing program is a ``loopback.servers.MissingTool`` naming it; in the tests it skips the
test that needed it, as ``skip_or_fail`` does, and fails it under ``CI=true``, where nothing may be skipped
silently."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import loopback.redis_server
import loopback.servers
from loopback.redis_server import RedisServer
from loopback.servers import MissingTool, MotoS3, Nginx

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("ci", "outcome"), [("", "1 skipped"), ("true", "1 failed")])
def test_a_missing_program_is_a_skip_or_in_ci_a_failure(tmp_path, ci, outcome):
    (tmp_path / "test_needs_a_tool.py").write_text(
        "from loopback.servers import MissingTool\n\n\n"
        "def test_needs_a_tool():\n"
        "    raise MissingTool('the openssl CLI is not installed')\n")
    env = {**os.environ, "CI": ci, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "-rs",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert outcome in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    if not ci:
        assert "the openssl CLI is not installed" in done.stdout  # the reason, as a skip states it


def test_each_server_names_its_missing_program(tmp_path, monkeypatch):
    monkeypatch.setattr(loopback.servers, "NGINX", str(tmp_path / "no-nginx"))
    monkeypatch.setattr(loopback.redis_server, "REDIS_SERVER", str(tmp_path / "no-redis-server"))
    for server, missing in ((Nginx(tmp_path), r"nginx is not installed \(.*no-nginx; Debian: apt-get install nginx"),
                            (RedisServer(), r"redis-server is not installed \(.*no-redis-server; Debian: apt-get")):
        try:
            with pytest.raises(MissingTool, match=missing):
                server.start()
        finally:
            server.stop()  # its folder
    monkeypatch.setattr(loopback.servers.importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(MissingTool, match=r"moto is not installed \(pip install 'moto\[server\]'"):
        MotoS3().start()
