"""Remote sources as an attacker or a bad network finds them, against Debian's nginx on
loopback, through the project's fault proxy and real FUSE mounts:

- a URL's secrets (``user:password@``, a presigned query) never leave: not in the daemon's command line, a
  ``-v`` log (ckptfs's lines and urllib3's), ``info``/``stats``/``bench`` output, a manifest or a
  ``meta.json``; the user info is sent as Basic auth to that origin only;
- a file replaced by one of the same size within nginx's one-second ETag is never served mixed with the
  one opened, and a remount with the same ``--cache-dir`` serves the new bytes, not the cached old ones;
- a timeout says which bound ran out (``--timeout`` or ``--stall-timeout``) and its number;
- retries spend the deadline: a 3 s outage inside the timeout costs 3 s, not the read;
- a mirror that is down at mount time costs only its failover.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("urllib3")

import ckptfs
from ckptfs.core.errors import CheckpointError
from conftest import ckptfs_cli, cli_env, force_unmount, mount_stats, require_nginx
from loopback.faultproxy import FaultProxy
from fixtures import write_gguf
from loopback.servers import Nginx, Redirector, free_port

SECRET = "SEKRET123"
SHAPE = (1024, 1024)  # float32: 4 MiB of data, past the 2 MiB the open fetches
ROW = SHAPE[1] * 4


def _values(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def _write(path: Path, seed: int) -> np.ndarray:
    values = _values(seed)
    write_gguf(path, {"w": (values, "F32")})
    return values


def _secret_url(base: str, path: str) -> str:
    """``base`` + ``path`` with the secret planted in the user info and in a presigned-style query."""
    return base.replace("://", f"://alice:{SECRET}@", 1) + f"{path}?X-Amz-Signature={SECRET}&X-Amz-Expires=60"


def _replace_keeping_mtime(path: Path, seed: int) -> np.ndarray:
    """Replace ``path`` (rename over it, as a download tool does) by another file of the same size and the
    same modification time: nginx's ETag and Last-Modified stay the same."""
    before = path.stat()
    fresh = path.with_name(path.name + ".new")
    values = _write(fresh, seed)
    assert fresh.stat().st_size == before.st_size
    os.utime(fresh, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(fresh, path)
    return values


@pytest.fixture
def site(tmp_path):
    require_nginx()
    root = tmp_path / "www"
    root.mkdir()
    values = _write(root / "v.gguf", 1)
    with Nginx(root) as server:
        yield server, root, values


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*ckptfs_cli(), *args], env=cli_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)


# ------------------------------------------------------------------------------------ item 4: secrets

def test_a_urls_secrets_never_leave_a_mount(site, mounted, tmp_path):
    """ps, the -v log (retries and urllib3's request lines), meta.json, stats, info and a manifest: the
    planted secret appears nowhere; the requests carried it as Basic auth."""
    server, root, values = site
    log = tmp_path / "mount.log"
    with FaultProxy(server.url) as proxy:
        url = _secret_url(proxy.url, "/v.gguf")
        mnt = mounted(url, "-v", "--log-file", str(log), "--timeout", "20", "--stall-timeout", "5")
        pid = mount_stats(mnt)["pid"]
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().decode(errors="replace")
        assert f"127.0.0.1:{proxy.port}/v.gguf" in cmdline and SECRET not in cmdline, cmdline
        proxy.plan("503")  # the first read after the mount is retried: a retry line in the log
        np.testing.assert_array_equal(np.load(mnt / "w.npy"), values)
        meta = json.loads((mnt / "w.meta.json").read_text())
        stats = _cli("stats", str(mnt))
    assert proxy.faults_used == ["503"]
    assert meta["source"] == f"{proxy.url}/v.gguf?…"
    assert stats.returncode == 0 and SECRET not in stats.stdout + stats.stderr
    force_unmount(mnt)
    text = log.read_text()
    assert "retrying" in text and '"GET /v.gguf?…' in text  # ckptfs's retry line and urllib3's request lines
    assert SECRET not in text, [line for line in text.splitlines() if SECRET in line][:3]
    auth = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()
    assert all(f'auth="{auth}"' in line for line in server.access_log()), server.access_log()[:2]

    direct = _secret_url(server.url, "/v.gguf")
    text_info, json_info = _cli("info", direct), _cli("info", "--json", direct)
    for out in (text_info, json_info):
        assert out.returncode == 0, out.stderr
        assert SECRET not in out.stdout + out.stderr
    assert f"files: 1 ({server.url}/v.gguf?…)" in text_info.stdout
    assert json.loads(json_info.stdout)["files"] == [f"{server.url}/v.gguf?…"]
    manifest = tmp_path / "m.json"
    out = _cli("manifest", direct, "-o", str(manifest))
    assert out.returncode == 0, out.stderr
    recorded = json.loads(manifest.read_text())
    assert [f["name"] for f in recorded["files"]] == ["v.gguf"] and SECRET not in manifest.read_text()


def test_errors_and_bench_output_show_no_secret(site):
    server, _, _ = site
    with pytest.raises(CheckpointError) as info:
        ckptfs.open(_secret_url(server.url, "/missing.gguf"), timeout=5)
    assert "HTTP 404" in str(info.value) and SECRET not in str(info.value)
    from conftest import require_fuse

    require_fuse()
    out = _cli("bench", "--json", "--timeout", "20", _secret_url(server.url, "/v.gguf"), timeout=300)
    assert out.returncode == 0, out.stderr
    assert SECRET not in out.stdout + out.stderr
    assert json.loads(out.stdout)["checkpoint"] == f"{server.url}/v.gguf?…"


def test_user_info_is_basic_auth_for_its_origin_only(site):
    server, _, values = site
    with Redirector(server.url) as origin:
        url = f"http://alice:{SECRET}@127.0.0.1:{origin.port}/v.gguf"
        with ckptfs.open(url, timeout=10) as ck:
            np.testing.assert_array_equal(np.asarray(ck["w"]), values)
    want = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()
    assert origin.auth and all(a == want for a in origin.auth), origin.auth
    server.wait_idle()  # every answered request is in the log
    assert server.access_log() and all('auth="-"' in line for line in server.access_log())  # not to the target


# ------------------------------------------------------------------ item 5: a file replaced, same ETag

def test_a_replaced_file_with_the_same_etag_is_never_served_mixed(site):
    server, root, v1 = site
    url = server.url + "/v.gguf"
    with ckptfs.open(url, timeout=10) as ck:
        t = ck["w"]
        np.testing.assert_array_equal(np.asarray(t[700]), v1[700])  # a fetch past the open's bytes
        _replace_keeping_mtime(root / "v.gguf", 2)
        with pytest.raises(CheckpointError, match="changed since it was opened"):
            np.asarray(t[900])
        np.testing.assert_array_equal(np.asarray(t[700]), v1[700])  # what was fetched before stays the old


def test_a_remount_with_the_same_cache_dir_serves_the_new_file(site, mounted, tmp_path):
    server, root, v1 = site
    url = server.url + "/v.gguf"
    cache = tmp_path / "cache"
    first = mounted(url, "--cache-dir", str(cache), "--timeout", "10")
    np.testing.assert_array_equal(np.load(first / "w.npy"), v1)
    force_unmount(first)
    v2 = _replace_keeping_mtime(root / "v.gguf", 2)
    second = mounted(url, "--cache-dir", str(cache), "--timeout", "10")
    np.testing.assert_array_equal(np.load(second / "w.npy"), v2)


def test_a_mount_answers_eio_for_bytes_of_a_replaced_file(site, mounted):
    server, root, v1 = site
    mnt = mounted(server.url + "/v.gguf", "--timeout", "10")
    npy = mnt / "w.npy"
    header = os.path.getsize(npy) - v1.nbytes
    with open(npy, "rb") as fh:
        fh.seek(header + 600 * ROW)
        assert fh.read(ROW) == v1[600].tobytes()
    _replace_keeping_mtime(root / "v.gguf", 2)
    with open(npy, "rb") as fh:
        fh.seek(header + 1000 * ROW)
        with pytest.raises(OSError) as info:
            fh.read(ROW)
    assert info.value.errno == errno.EIO


# ----------------------------------------------------------------------- items 6 and 7: time bounds

@pytest.fixture
def proxied(site):
    server, root, values = site
    with FaultProxy(server.url) as proxy:
        yield proxy, values


def _far_read(ck) -> np.ndarray:
    return np.asarray(ck["w"][800])


def test_a_slow_body_past_the_deadline_is_a_timeout_not_a_stall(proxied):
    proxy, _ = proxied
    with ckptfs.open(proxy.url + "/v.gguf", timeout=3, stall_timeout=2) as ck:
        proxy.always("slow:16")  # a piece every second: never silent for 2 s, never done in 3
        start = time.monotonic()
        with pytest.raises(CheckpointError) as info:
            _far_read(ck)
        proxy.always(None)
    message = str(info.value)
    assert "--timeout 3 s" in message and "stall" not in message, message
    assert time.monotonic() - start < 3 + 5


@pytest.mark.parametrize("timeout, stall", [(4, 1), (2, 5)])
def test_a_frozen_server_names_each_bound_with_its_number(proxied, timeout, stall):
    proxy, _ = proxied
    with ckptfs.open(proxy.url + "/v.gguf", timeout=timeout, stall_timeout=stall) as ck:
        proxy.always("stall:30")
        with pytest.raises(CheckpointError) as info:
            _far_read(ck)
        proxy.always(None)
    message = str(info.value)
    assert f"--timeout {timeout} s" in message, message
    if stall < timeout:  # the stalls before the deadline were stalls, with their own number
        assert f"no data for {stall} s, --stall-timeout" in message, message
    else:  # the deadline came first: nothing was a stall of 5 s
        assert "stall" not in message, message


def test_an_outage_shorter_than_the_timeout_is_survived(proxied):
    proxy, values = proxied
    with ckptfs.open(proxy.url + "/v.gguf", timeout=30) as ck:
        proxy.plan("refuse:3")  # the next request dropped, then nothing listens for 3 s
        start = time.monotonic()
        np.testing.assert_array_equal(_far_read(ck), values[800])
        took = time.monotonic() - start
    assert proxy.faults_used == ["refuse:3"]
    assert took >= 2.5  # the outage was real; the retries outlasted it (backoff capped: no long oversleep)


def test_an_outage_longer_than_the_timeout_ends_at_the_timeout(proxied):
    proxy, _ = proxied
    with ckptfs.open(proxy.url + "/v.gguf", timeout=3) as ck:
        proxy.plan("refuse:30")
        start = time.monotonic()
        with pytest.raises(CheckpointError, match=r"connection failed.*--timeout 3 s"):
            _far_read(ck)
        took = time.monotonic() - start
    assert 2 <= took < 3 + 3  # retried for the whole deadline, and not past it


# --------------------------------------------------------------------------- item 8: a dead mirror

def test_a_mirror_down_at_mount_time_does_not_refuse_a_healthy_primary(site, mounted, tmp_path):
    _, root, values = site
    local = tmp_path / "local.gguf"
    local.write_bytes((root / "v.gguf").read_bytes())
    dead = f"http://127.0.0.1:{free_port()}/v.gguf"
    start = time.monotonic()
    mnt = mounted(str(local), "--mirror", dead, "--timeout", "10")
    assert time.monotonic() - start < 10  # the dead mirror did not cost the open's deadline
    np.testing.assert_array_equal(np.load(mnt / "w.npy"), values)


def test_a_mirror_down_at_open_is_warned_about_once(site, tmp_path):
    """An open reads each file several times over (detection, the header, the pool): the dead mirror is asked
    and warned about once, by the mount command as by ``ckptfs.open``."""
    _, root, values = site
    local = tmp_path / "local.gguf"
    local.write_bytes((root / "v.gguf").read_bytes())
    dead = f"http://127.0.0.1:{free_port()}/v.gguf"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = _cli("mount", str(local), str(mnt), "--mirror", dead, "--timeout", "10")
    try:
        assert done.returncode == 0, done.stderr
        warned = [line for line in done.stderr.splitlines() if "is unavailable" in line]
        assert len(warned) == 1 and dead in warned[0], done.stderr
        np.testing.assert_array_equal(np.load(mnt / "w.npy"), values)
    finally:
        force_unmount(mnt)


def test_a_mirror_down_at_open_is_used_once_it_answers(site):
    """A mirror down when the checkpoint is opened is opened by the first read that fails over to it."""
    server, _, values = site
    with FaultProxy(server.url) as primary, FaultProxy(server.url) as mirror:
        mirror.plan("refuse:2")
        with ckptfs.open(primary.url + "/v.gguf", mirrors=[mirror.url + "/v.gguf"], timeout=10) as ck:
            assert mirror.faults_used == ["refuse:2"]
            time.sleep(2.2)
            primary.always("503")
            np.testing.assert_array_equal(np.asarray(ck["w"][1000]), values[1000])
            assert mirror.requests["GET"] >= 2  # the failed attempt at open, then the mirror's answers
