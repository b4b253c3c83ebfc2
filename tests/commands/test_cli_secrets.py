"""A URL's secrets and the command line: every command rewrites its own command line at entry (what ``ps``
shows every user), and ``--src-file`` / ``$CKPTFS_SRC`` give a source that never enters it; real processes
against nginx on 127.0.0.1 and real mounts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("urllib3")

from cli_runs import one_error_line, run_cli
from conftest import ckptfs_cli, cli_env, mount_stats, require_nginx, wait_until
from fixtures import write_gguf
from loopback.servers import Nginx

SECRET = "SEKRET456"
VALUES = np.random.default_rng(9).standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB


def secret_url(server: Nginx) -> str:
    """The file's URL with the secret in its user info and in a presigned-style query."""
    return (server.url.replace("://", f"://alice:{SECRET}@", 1)
            + f"/m.gguf?X-Amz-Signature={SECRET}&X-Amz-Expires=60")


@pytest.fixture(scope="module")
def www(tmp_path_factory) -> Path:
    require_nginx()
    root = tmp_path_factory.mktemp("www")
    write_gguf(root / "m.gguf", {"w": (VALUES, "F32")})
    return root


@pytest.fixture
def site(www):
    with Nginx(www) as server:
        yield server


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode(errors="replace")


def test_a_running_prefetch_shows_no_secret_in_its_command_line(www, tmp_path):
    """``ckptfs prefetch URL`` against an origin slow enough to keep it running: once it has started, its
    command line names the file without the user info and query, for the rest of its run."""
    with Nginx(www, limit_rate="256k") as server:
        proc = subprocess.Popen([*ckptfs_cli(), "prefetch", secret_url(server), "--cache-dir", str(tmp_path / "c")],
                                env=cli_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            assert wait_until(lambda: SECRET not in cmdline(proc.pid) or proc.poll() is not None, timeout=60), \
                cmdline(proc.pid)
            assert wait_until(lambda: server.access_log() or proc.poll() is not None, timeout=60)
            shown = cmdline(proc.pid)
            assert proc.poll() is None, "prefetch ended before its command line was read"
            assert SECRET not in shown and f"127.0.0.1:{server.port}/m.gguf?…" in shown, shown
        finally:
            proc.terminate()
            proc.communicate(timeout=30)
    assert all(SECRET not in line for line in server.access_log() if "m.gguf?" not in line)


def test_a_source_by_stdin_and_by_environment(site, tmp_path, mountpoint):
    """``prefetch --src-file -`` fills the cache folder from the URL it reads on stdin; a mount whose source
    is ``$CKPTFS_SRC`` then serves the file (from the folder: no request for its data), and neither process
    ever had the URL in its command line."""
    cache = tmp_path / "cache"
    result = subprocess.run([*ckptfs_cli(), "prefetch", "--src-file", "-", "--cache-dir", str(cache), "-q"],
                            env=cli_env(), input=secret_url(site) + "\n", capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    before = len(site.access_log())
    mounted = run_cli("mount", str(mountpoint), "--cache-dir", str(cache), CKPTFS_SRC=secret_url(site))
    assert mounted.returncode == 0, mounted.stderr
    np.testing.assert_array_equal(np.load(mountpoint / "w.npy"), VALUES)
    assert site.ranges("m.gguf", before) == []  # served from what prefetch stored
    shown = cmdline(mount_stats(mountpoint)["pid"])
    assert "127.0.0.1" not in shown and SECRET not in shown, shown


def test_a_source_by_file_and_by_environment(site, tmp_path, mountpoint):
    """The other way round: ``prefetch`` with ``$CKPTFS_SRC``, a mount with ``--src-file FILE``."""
    cache = tmp_path / "cache"
    result = run_cli("prefetch", "--cache-dir", str(cache), "-q", CKPTFS_SRC=secret_url(site), timeout=120)
    assert result.returncode == 0, result.stderr
    source = tmp_path / "source"
    source.write_text(secret_url(site) + "\n")
    os.chmod(source, 0o600)
    before = len(site.access_log())
    mounted = run_cli("mount", "--src-file", str(source), str(mountpoint), "--cache-dir", str(cache))
    assert mounted.returncode == 0, mounted.stderr
    np.testing.assert_array_equal(np.load(mountpoint / "w.npy"), VALUES)
    assert site.ranges("m.gguf", before) == []


def test_a_source_on_the_command_line_wins_over_the_environment(site):
    result = run_cli("info", f"{site.url}/m.gguf", CKPTFS_SRC="/nonexistent/other.gguf")
    assert result.returncode == 0 and "tensors: 1" in result.stdout, result.stderr


@pytest.mark.parametrize("args, stdin, words", [
    (["info", "--src-file", "-", "m.gguf"], "/x.gguf\n", ["--src-file", "SRC is read from it"]),
    (["mount", "--src-file", "-"], "/x.gguf\n", ["MOUNTPOINT"]),
    (["info", "--src-file", "-"], "", ["--src-file standard input: empty"]),
    (["info", "--src-file", "-"], "/a.gguf\n/b.gguf\n", ["2 lines"]),
    (["info", "--src-file", "/nonexistent/src"], "", ["--src-file /nonexistent/src", "No such file"]),
    (["info"], "", ["Missing argument 'SRC'", "--src-file", "CKPTFS_SRC"]),
])
def test_source_usage_errors_are_one_line(args, stdin, words):
    env = cli_env()
    env.pop("CKPTFS_SRC", None)
    result = subprocess.run([*ckptfs_cli(), *args], env=env, input=stdin, capture_output=True, text=True, timeout=60)
    one_error_line(result, 2, *words)
