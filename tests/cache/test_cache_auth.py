"""Who may change what the shared tiers serve: a cache folder another user made is
refused, entries rewritten with a forged payload and recomputed crc32s are never served (disk and Redis,
through real FUSE mounts), and what ckptfs creates is 0700/0600 whatever the umask.

The attacker here writes entries as ``ckptfs/cache/entry.py`` documents them: everything but the key is
public, so the crc32s are recomputed and only the MAC (which needs the key) is left as it was.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runs import one_error_line, run_cli
from conftest import REPO, force_unmount, mount_stats
from loopback.redis_server import RedisServer
from redis_fixtures import require_redis_server
from users import AS_NOBODY, NOBODY
from users import public_dir as _public_dir
from tier_models import expected_files, read_all, settled
from tier_models import forge, write_model

import ckptfs
from ckptfs.cache.auth import CacheRefused


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.gguf"
    return path, write_model(path, seed=21)


public_dir = _public_dir  # the fixture (root, setpriv), made sticky below


@pytest.fixture
def sticky_dir(public_dir) -> Path:
    """A world-writable sticky folder like /dev/shm or /tmp, that other users can create folders in."""
    public_dir.chmod(0o1777)
    return public_dir


def test_a_folder_another_user_made_first_is_refused(model, sticky_dir, tmp_path):
    """A second user makes the recipe's cache folder (docs/caches.md) before root mounts with it."""
    path, _ = model
    trap = sticky_dir / "ckptfs"
    made = subprocess.run([*AS_NOBODY, "mkdir", "-m", "0755", str(trap)], capture_output=True, timeout=30,
                          check=False)
    assert made.returncode == 0, made.stderr
    assert trap.stat().st_uid == NOBODY
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        result = run_cli("mount", str(path), str(mnt), "--cache-dir", str(trap))
        one_error_line(result, 1, str(trap), "owned by nobody", "chown")
    finally:
        force_unmount(mnt)
    for command in (("prefetch", str(path)), ("cache", "clear")):
        one_error_line(run_cli(*command, "--cache-dir", str(trap)), 1, "owned by nobody")
    with pytest.raises(CacheRefused, match="owned by nobody"):
        ckptfs.open(path, cache_dir=str(trap))
    assert list(trap.iterdir()) == []  # nothing was written into it: no key, no entry
    # a key file of another user's is refused the same way
    key = sticky_dir / "key"
    subprocess.run([*AS_NOBODY, "sh", "-c", f"umask 077; head -c 32 /dev/urandom > {key}"], check=True, timeout=30)
    with pytest.raises(CacheRefused, match=r"key file .* owned by nobody"):
        ckptfs.open(path, cache_dir=str(tmp_path / "mine"), cache_key_file=str(key))


@pytest.mark.parametrize("mode, fix", [(0o770, "chmod 700"), (0o757, "chmod 700")])
def test_a_folder_writable_by_others_is_refused(model, tmp_path, mode, fix):
    path, _ = model
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(mode)
    with pytest.raises(CacheRefused, match=fix):
        ckptfs.open(path, cache_dir=str(cache))
    cache.chmod(0o700)
    with ckptfs.open(path, cache_dir=str(cache)):
        pass


def test_a_folder_under_a_folder_others_can_replace_is_refused(model, tmp_path):
    path, _ = model
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)  # anyone could rename cache away and put theirs in its place
    with pytest.raises(CacheRefused, match=f"{parent} above it .* chmod go-w"):
        ckptfs.open(path, cache_dir=str(parent / "cache"))


def test_a_key_file_others_can_read_or_a_short_one_is_refused(model, tmp_path):
    path, _ = model
    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o644)
    with pytest.raises(CacheRefused, match="chmod 600"):
        ckptfs.open(path, cache_dir=str(tmp_path / "cache"), cache_key_file=str(key))
    key.chmod(0o600)
    key.write_bytes(b"short")
    with pytest.raises(CacheRefused, match="5 bytes"):
        ckptfs.open(path, cache_dir=str(tmp_path / "cache"), cache_key_file=str(key))


def test_created_folders_are_0700_and_entries_0600_whatever_the_umask(model, tmp_path):
    path, refs = model
    cache = tmp_path / "a" / "b" / "cache"
    old = os.umask(0)
    try:
        with ckptfs.open(path, cache_size=0, cache_dir=str(cache)) as ck:
            for name, ref in refs.items():
                np.testing.assert_array_equal(ck[name].numpy(), ref.astype(np.float32))
            ck["blk.0.q4k"].shared()
            for tier in ck.cache.tiers:
                getattr(tier, "flush", lambda: None)()
    finally:
        os.umask(old)
    folders = [tmp_path / "a", tmp_path / "a" / "b", cache, *(p for p in cache.rglob("*") if p.is_dir())]
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert len(folders) > 4 and any(p.suffix == ".e" for p in files) and cache / ".key" in files
    assert any(p.parent.parent.name == "tensors" for p in files)
    for p in folders:
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o700, p
    for p in files:
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p
    assert len((cache / ".key").read_bytes()) == 32


def test_the_folder_key_is_made_once_and_kept(model, tmp_path):
    path, _ = model
    cache = tmp_path / "cache"
    with ckptfs.open(path, cache_dir=str(cache)):
        pass
    first = (cache / ".key").read_bytes()
    reopen = "import sys, ckptfs; ckptfs.open(sys.argv[1], cache_dir=sys.argv[2]).close()"
    opened = subprocess.run([sys.executable, "-c", reopen, str(path), str(cache)], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})  # a new process: key read again
    assert opened.returncode == 0, opened.stderr
    assert (cache / ".key").read_bytes() == first


def test_forged_disk_entries_are_not_served_after_a_remount(mounted, model, tmp_path):
    """Item 1: entries rewritten with a forged payload and recomputed crc32s; a remount serves gguf-py's
    values and counts what it refused."""
    path, refs = model
    expected = expected_files(refs)
    cache = tmp_path / "cache"
    first = mounted(path, "--cache-dir", str(cache), "--cache-size", "0")
    read_all(first, expected)
    assert settled(first, "disk")["tiers"]["disk"]["stored"] > 0
    force_unmount(first)
    entries = list((cache / "blocks").rglob("*.e"))
    assert entries
    for p in entries:
        p.write_bytes(forge(p.read_bytes()))
    second = mounted(path, "--cache-dir", str(cache), "--cache-size", "0")
    read_all(second, expected)  # exact bytes: np.save of gguf-py's values
    disk = mount_stats(second)["tiers"]["disk"]
    assert disk["forged"] >= len(entries) and disk["corrupt"] == 0  # (hits: the groups decoded again)


def _redis_values(server: RedisServer) -> dict[bytes, bytes]:
    import redis

    from ckptfs.cache.redis_tier import KEY_PREFIX

    client = redis.Redis(host="127.0.0.1", port=server.port)
    return {k: client.get(k) for k in client.keys(KEY_PREFIX + "*")}  # the entries, not the decoders' leases


def test_forged_redis_values_are_not_served_with_a_key_file(mounted, model, tmp_path):
    """Item 2: whoever can write to the Redis rewrites every value (crc32s recomputed); mounts given
    --cache-key-file serve gguf-py's values and count the forgeries."""
    require_redis_server()
    redis = pytest.importorskip("redis")
    path, refs = model
    expected = expected_files(refs)
    key = tmp_path / "fleet.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    with RedisServer() as server:
        args = ("--redis", server.url, "--cache-key-file", str(key), "--cache-size", "0")
        first = mounted(path, *args)
        read_all(first, expected)
        assert settled(first, "redis")["tiers"]["redis"]["stored"] > 0
        force_unmount(first)
        values = _redis_values(server)
        assert values
        client = redis.Redis(host="127.0.0.1", port=server.port)
        for name, data in values.items():
            client.set(name, forge(data))
        second = mounted(path, *args)
        read_all(second, expected)
        tier = mount_stats(second)["tiers"]["redis"]
        assert tier["forged"] >= len(values)


def test_a_redis_without_a_key_file_is_said_to_be_trusted(model, tmp_path, caplog):
    require_redis_server()
    pytest.importorskip("redis")
    path, _ = model
    with RedisServer() as server, caplog.at_level("WARNING", logger="ckptfs.cache.redis_tier"), \
            ckptfs.open(path, redis=server.url):
        pass
    lines = [r.getMessage() for r in caplog.records if "trusted as-is" in r.getMessage()]
    assert len(lines) == 1 and "--cache-key-file" in lines[0]


@pytest.mark.parametrize("url, words", [("redis://127.0.0.1:99999", ["99999", "out of range"]),
                                        ("redis://127.0.0.1:http/0", ["http", "redis://HOST:PORT/DB"]),
                                        ("redis://127.0.0.1:0/0", ["port 0"]),
                                        ("redis://127.0.0.1:6379/zero", ["not a number"])])
def test_a_bad_redis_url_is_refused_at_mount(model, tmp_path, url, words):
    pytest.importorskip("redis")
    path, _ = model
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        one_error_line(run_cli("mount", str(path), str(mnt), "--redis", url), (1, 2), *words)
    finally:
        force_unmount(mnt)
    with pytest.raises(ValueError):
        ckptfs.open(path, redis=url)


def test_fstab_maps_cache_key_file():
    from ckptfs.commands.cli import mount as mount_command
    from ckptfs.commands.fstab import mount_arguments, parse_helper_argv

    args = mount_arguments(parse_helper_argv(["/m/x.gguf", "/mnt/x", "-o", "cache_dir=/c,cache_key_file=/k"]),
                           mount_command)
    assert args[args.index("--cache-key-file") + 1] == "/k" and "-o" not in args
