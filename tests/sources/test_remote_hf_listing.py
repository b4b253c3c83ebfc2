"""An ``hf://`` repository's listing against the Hub stand-in on loopback (``servers.HubStandIn``, its LFS
files on an nginx as its CDN): names as the mount names files, and a listing bounded by ``--timeout``.

- The stand-in lists names no file system could hold: 300 bytes long, holding a NUL, holding bytes that are
  not UTF-8, and, in a listing that should be one level deep, ``sub/b.gguf`` beside ``b.gguf``. The mount
  lists each within 255 bytes (a hash suffix), escaped as ``%XX`` (the NUL, each byte that is not UTF-8),
  the second ``b.gguf`` numbered (``b~2.gguf``) with one log line; every file reads its own bytes, online
  and offline from the listing kept in ``--cache-dir``.
- A Hub that takes the connection and never answers, or where nothing listens: ``mount hf://ORG/REPO
  --timeout 2`` exits non-zero with one line on stderr (no retry lines from huggingface_hub, whose own
  client retries for half a minute).
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("huggingface_hub")

from cli_runs import one_error_line, run_cli
from fixtures import write_gguf
from hub_origin import hub_origin
from loopback.servers import free_port

from ckptfs.util.names import NAME_MAX

LONG = "x" * 300 + ".bin"
WITH_NUL = "nul\x00name.bin"
NOT_UTF8 = "latin-\udce9t\udce9.bin"  # the bytes b"latin-\xe9t\xe9.bin", as surrogateescape holds them


def _gguf(path: Path, seed: int) -> None:
    values = np.random.default_rng(seed).normal(size=(4, 8)).astype(np.float32)
    write_gguf(path, {"token_embd.weight": (values, "F32")}, arch="llama")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_listed_names_follow_the_mount_name_rules(tmp_path, mounted):
    def fill(repo: Path) -> None:
        _gguf(repo / "b.gguf", 1)
        (repo / "sub").mkdir()
        _gguf(repo / "sub" / "b.gguf", 2)
        (repo / "plain.bin").write_bytes(b"plain")

    with hub_origin(tmp_path, "org/odd", fill) as (stand_in, _, repo):
        odd = {LONG: b"long", WITH_NUL: b"nul", NOT_UTF8: b"latin"}
        for i, (name, data) in enumerate(odd.items()):
            (tmp_path / f"odd{i}").write_bytes(data)
            stand_in._add("org/odd", name, tmp_path / f"odd{i}")
        listing = stand_in._entries

        def hostile(name: str, prefix: str) -> list[dict]:
            """One level, as asked, but also the sub-folder's file under its path (a Hub that lists deeper)."""
            entries = listing(name, prefix)
            if prefix == "":
                info = stand_in.files[("org/odd", "sub/b.gguf")]
                entries.append({"type": "file", "oid": info["oid"], "size": info["size"], "path": "sub/b.gguf",
                                "lfs": {"oid": info["sha256"], "size": info["size"], "pointerSize": 134}})
            return entries

        stand_in._entries = hostile
        log = tmp_path / "mount.log"
        cache = tmp_path / "cache"
        mnt = mounted("hf://org/odd", "--timeout", "30", "--log-file", str(log), "--cache-dir", str(cache))
        names = set(os.listdir(mnt))
        assert all(len(os.fsencode(n)) <= NAME_MAX for n in names), names
        assert not any("\x00" in n or "\udce9" in n for n in names), names
        long_name = next(n for n in names if n.startswith("x" * 200) and n.endswith(".bin"))
        expected = {"b.gguf": (repo / "b.gguf").read_bytes(), "b~2.gguf": (repo / "sub" / "b.gguf").read_bytes(),
                    "plain.bin": b"plain", long_name: b"long", "nul%00name.bin": b"nul", "latin-%E9t%E9.bin": b"latin"}
        assert set(expected) <= names, names
        for name, data in expected.items():
            assert _sha((mnt / name).read_bytes()) == _sha(data), name
        lines = [line for line in log.read_text().splitlines() if "its name is taken" in line]
        assert len(lines) == 1 and "sub/b.gguf is listed as b~2.gguf" in lines[0], lines
        # offline, from the listing kept in the cache folder: each name still reads its own file (the numbered
        # and the shortened names cannot be derived from the name alone)
        offline = mounted("hf://org/odd", "--offline", "--cache-dir", str(cache))
        assert set(os.listdir(offline)) == names
        for name, data in expected.items():
            assert _sha((offline / name).read_bytes()) == _sha(data), name


def _silent_listener() -> tuple[socket.socket, int]:
    """A loopback port that takes connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock, sock.getsockname()[1]


@pytest.mark.parametrize("hub", ["silent", "nothing-listens"])
def test_a_dead_hub_is_one_line_within_the_timeout(mountpoint, hub):
    if hub == "silent":
        sock, port = _silent_listener()
    else:
        sock, port = None, free_port()
    try:  # run_cli's bound (60 s) is the generous one: a listing that waits on the Hub forever fails there
        done = run_cli("mount", "hf://org/repo", str(mountpoint), "--timeout", "2", timeout=60,
                       HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_TOKEN="", HF_HUB_DISABLE_TELEMETRY="1")
    finally:
        if sock is not None:
            sock.close()
    one_error_line(done, 1, "cannot list the repository", "within 2 s (--timeout)")


@pytest.mark.parametrize("answer", [b"<html>not a listing</html>", b"[" * 100_000 + b"]" * 100_000, b'{"a": 1}'])
def test_a_listing_that_is_no_listing_is_one_line(tmp_path, mountpoint, answer):
    """A Hub whose tree answer is not a JSON list (HTML, nesting past the parser's bound, an object): one
    line, exit 1, never a traceback."""
    def fill(repo: Path) -> None:
        (repo / "plain.bin").write_bytes(b"plain")

    with hub_origin(tmp_path, "org/odd", fill) as (stand_in, _, _):
        def garbage(req, repo: str, rev: str, rel: str, head: bool) -> None:
            stand_in._send(req, 200, {"Content-Type": "application/json"}, answer, head)

        stand_in._tree = garbage
        done = run_cli("mount", "hf://org/odd", str(mountpoint), "--timeout", "10", timeout=60)
    one_error_line(done, 1, "cannot list the repository", "the listing")
