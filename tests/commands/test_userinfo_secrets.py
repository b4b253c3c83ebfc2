"""A URL's password, however the user info is spelled, reaches no other user and nothing shown: a real mount of
an http:// source (nginx on 127.0.0.1) given by argv, ``--src-file -`` or ``$CKPTFS_SRC``, while a real second
user (nobody, through setpriv) reads ``/proc/mounts`` and every process's command line; and the mount's
files, ``ckptfs stats``, the metrics, its log, ``ckptfs info``, a manifest and an error line.

The user info is split as the standard library splits it (the last ``@`` ends it, the first ``:`` ends the
user, ``%40`` is ``@``): nginx's access log shows the Basic auth that reached it, decoded here."""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("urllib3")

from cli_runs import one_error_line, run_cli
from conftest import ckptfs_cli, cli_env, mount_stats, nginx_origin
from fixtures import write_gguf
from loopback.servers import Nginx, free_port
from users import AS_NOBODY, public_dir  # noqa: F401

VALUES = np.random.default_rng(48).standard_normal((64, 64)).astype(np.float32)

#: user info as typed -> (user, password) as HTTP Basic auth must send them. Each password holds both
#: SECRETS; the email-like user's domain is a third word nothing may show.
SPELLINGS = {
    "email-user": ("bob@example.com:pa55HUNTER2", ("bob@example.com", "pa55HUNTER2")),
    "at-in-password": ("alice:pa55@HUNTER2", ("alice", "pa55@HUNTER2")),
    "colon-in-password": ("alice:pa55:HUNTER2", ("alice", "pa55:HUNTER2")),
    "percent-40-in-password": ("alice:pa55%40HUNTER2", ("alice", "pa55@HUNTER2")),
}
SECRETS = ("pa55", "HUNTER2", "example.com")


def assert_no_secret(text: str, where: str) -> None:
    for word in SECRETS:
        assert word not in text, f"{word!r} in {where}: {text[-3000:]}"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with nginx_origin(tmp_path_factory, lambda root: write_gguf(root / "m.gguf", {"w": (VALUES, "F32")})) as made:
        yield made[0]


def url_of(server: Nginx, userinfo: str, name: str = "m.gguf") -> str:
    return server.url.replace("://", f"://{userinfo}@", 1) + "/" + name


def seen_by_nobody() -> str:
    """``/proc/mounts`` and every process's command line (``PID: args``), as uid 65534 reads them."""
    script = ('cat /proc/mounts; for p in /proc/[0-9]*; do '
              'printf "%s: " "${p#/proc/}"; tr "\\0" " " < "$p/cmdline" 2>/dev/null; echo; done')
    result = subprocess.run([*AS_NOBODY, "sh", "-c", script], capture_output=True, text=True, timeout=60,
                            errors="replace")
    assert result.returncode == 0, result.stderr
    return result.stdout


def basic_auth_sent(server: Nginx, before: int) -> set[str]:
    """The credentials (``user:password``) of the requests nginx logged since line ``before``."""
    sent = set()
    for line in server.access_log()[before:]:
        value = line.partition('auth="')[2].partition('"')[0]
        if value.startswith("Basic "):
            sent.add(base64.b64decode(value[len("Basic "):]).decode())
    return sent


def mount(server: Nginx, userinfo: str, way: str, mnt: Path, *more: str) -> subprocess.CompletedProcess:
    src = url_of(server, userinfo)
    env = cli_env()
    env.pop("CKPTFS_SRC", None)
    args, stdin = [*ckptfs_cli(), "mount"], None
    if way == "argv":
        args += [src, str(mnt)]
    elif way == "stdin":
        args += ["--src-file", "-", str(mnt)]
        stdin = src + "\n"
    else:
        args += [str(mnt)]
        env["CKPTFS_SRC"] = src
    return subprocess.run([*args, *more], env=env, input=stdin, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("way", ["argv", "stdin", "environment"])
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_another_user_sees_no_password_in_the_mount_table_or_any_command_line(site, public_dir, spelling, way):
    """While the mount is up, nobody's view of ``/proc/mounts`` and of every process's command line (the
    daemon's and fusermount3's among them) names the file without any part of the user info; nginx got the
    user and password the standard library's split gives."""
    userinfo, (user, password) = SPELLINGS[spelling]
    mnt = public_dir / "mnt"
    mnt.mkdir()
    before = len(site.access_log())
    result = mount(site, userinfo, way, mnt)
    assert result.returncode == 0, result.stderr
    assert_no_secret(result.stdout + result.stderr, "the mount command's output")
    np.testing.assert_array_equal(np.load(mnt / "w.npy"), VALUES)
    shown = seen_by_nobody()
    assert_no_secret(shown, "what uid 65534 reads")
    mount_line = [line for line in shown.splitlines() if f" {mnt} " in line]
    assert mount_line and mount_line[0].startswith(f"ckptfs:{site.url}/m.gguf "), mount_line
    daemon = str(mount_stats(mnt)["pid"])
    assert any(line.startswith(daemon + ": ") and "mount" in line for line in shown.splitlines()), shown[-2000:]
    assert basic_auth_sent(site, before) == {f"{user}:{password}"}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_nothing_shown_names_the_password(site, public_dir, tmp_path, spelling):
    """Everything a mount and the commands show of a source given on the command line: the files of the
    mount (``meta.json``'s ``source``), ``ckptfs stats``, the metrics' ``ckptfs_info{source}``, the log
    file, ``ckptfs info``, a manifest, a failure's one line and the library's ``repr`` of the checkpoint."""
    userinfo, _ = SPELLINGS[spelling]
    mnt = public_dir / "mnt"
    mnt.mkdir()
    log, port = tmp_path / "mount.log", free_port()
    result = mount(site, userinfo, "argv", mnt, "--log-file", str(log), "--metrics", f"127.0.0.1:{port}")
    assert result.returncode == 0, result.stderr
    for path in sorted(mnt.rglob("*.json")):
        assert_no_secret(path.read_text(), str(path))
    meta = json.loads((mnt / "w.meta.json").read_text())
    assert meta["source"] == f"{site.url}/m.gguf", meta
    assert_no_secret(json.dumps(mount_stats(mnt)), "ckptfs stats")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    assert_no_secret(metrics, "the metrics")
    assert f'source="{site.url}/m.gguf"' in metrics
    stats = run_cli("stats", str(mnt))
    assert stats.returncode == 0 and stats.stdout, stats.stderr
    assert_no_secret(stats.stdout + stats.stderr, "ckptfs stats")

    info = run_cli("info", url_of(site, userinfo))
    assert info.returncode == 0 and "tensors: 1" in info.stdout, info.stderr
    assert_no_secret(info.stdout + info.stderr, "ckptfs info")
    manifest = run_cli("manifest", url_of(site, userinfo))
    assert manifest.returncode == 0 and "m.gguf" in manifest.stdout, manifest.stderr
    assert_no_secret(manifest.stdout + manifest.stderr, "the manifest")
    import ckptfs

    with ckptfs.open(url_of(site, userinfo)) as ck:
        assert repr(ck).startswith(f"<ckptfs.Checkpoint '{site.url}/m.gguf'"), repr(ck)
    missing = run_cli("info", url_of(site, userinfo, "missing.gguf"))
    assert_no_secret(one_error_line(missing, 1, f"{site.url}/missing.gguf", "404"), "an error line")
    run_cli("umount", str(mnt))
    assert log.read_text().strip() and f"{site.url}/m.gguf" in log.read_text()
    assert_no_secret(log.read_text(), "the log file")


@pytest.mark.parametrize("url", [
    "http://bob@example.com:pa55HUNTER2@127.0.0.1:8080/m.gguf",
    "https://alice:pa55@HUNTER2@host/a/m.gguf?X-Amz-Signature=pa55",
    "http://alice:pa55:HUNTER2@[::1]:80/m.gguf#pa55",
    "http://alice:pa55%40HUNTER2@host/m.gguf",
    "http://alice@host/m.gguf",
    "hf://org/repo@main/m.gguf",
])
def test_the_split_is_the_standard_librarys_and_the_shown_form_has_none_of_it(url):
    """The one split (util.redact.split_source) against urllib's own: user, password (percent-decoded) and
    host; the public name, the record name and free text around the URL keep none of the user info."""
    from urllib.parse import unquote, urlsplit

    from ckptfs.util.redact import public_name, redact, split_source, strip_url

    parts, oracle = split_source(url), urlsplit(url)
    assert (parts.user, parts.password) == (
        unquote(oracle.username) if oracle.username is not None else None,
        unquote(oracle.password) if oracle.password is not None else None)
    assert parts.host == oracle.netloc.rpartition("@")[2]
    for shown in (public_name(url), strip_url(url), redact(f"GET of {url}: HTTP 404 ({url})")):
        assert_no_secret(shown, shown)
        assert "alice" not in shown and "bob" not in shown
    assert public_name(url).startswith(f"{oracle.scheme}://{parts.host}{oracle.path}")


def test_a_password_with_a_raw_slash_shows_no_part_of_it():
    """``http://u:pa55/HUNTER2@host/``: the standard library reads ``u:pa55`` as the authority (a port that is
    not a number; RFC 3986 wants ``/`` as ``%2F``): only the host name before it is shown."""
    from ckptfs.util.redact import public_name, redact

    url = "http://u:pa55/HUNTER2@host/m.gguf"
    assert public_name(url) == "http://u:…"
    assert_no_secret(redact(f"open {url} failed"), "free text")


@pytest.mark.parametrize("url", ["http://u:pa55?HUNTER2@host/m.gguf", "http://u:pa55#HUNTER2@host/m.gguf"])
def test_a_password_with_a_raw_query_or_fragment_mark_shows_no_part_of_it(url):
    from ckptfs.util.redact import public_name, redact

    assert public_name(url) == "http://u:…"
    assert_no_secret(redact(f"open {url} failed"), "free text")


def test_a_url_with_a_bad_port_and_no_user_info_is_shown_as_it_is():
    """Nothing to hide: a message about a bad port names it (``--redis redis://HOST:PORT/DB``)."""
    from ckptfs.util.redact import redact

    assert redact("port of redis://127.0.0.1:99999 out of range (want redis://HOST:PORT/DB)") == \
        "port of redis://127.0.0.1:99999 out of range (want redis://HOST:PORT/DB)"
