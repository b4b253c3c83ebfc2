"""The bulk byte path through libcurl (``ckptfs.sources.remote.curl``, the ``_curl`` C extension): range GETs of
``http(s)://`` sources go through it, with the file's bytes, and every rule of the urllib3 path holds.

Real servers on loopback: Debian's nginx (plain and ``https://`` with a CA made at test time), the fault proxy
in front of it (a trickling body, a short body, another range), and a redirector to another origin. The
extension's own counters say how many transfers it carried; ``CKPTFS_CURL=0`` turns it off. Without the
extension these tests skip (they fail under ``CI=true``, where setup.sh installs libcurl4-openssl-dev).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("urllib3")

from conftest import cli_env, require_nginx, wait_until
from loopback.faultproxy import FaultProxy
from loopback.servers import Nginx, Redirector, TestCA

from ckptfs.sources.remote.store.chunks import CHUNK
from ckptfs.core.errors import CheckpointError
from ckptfs.core.options import OpenOptions
from ckptfs.sources.remote import curl
from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.http import HttpSource
from ckptfs.sources.remote.options import RemoteOptions
from ckptfs.sources.remote.odd import OddAnswer
from ckptfs.sources.remote.origin import Retryable

MiB = 1 << 20
SIZE = 24 * MiB + 12345  # not a whole number of chunks: the last part of a range is shorter


@pytest.fixture(autouse=True)
def native(libcurl):
    """Every test here runs with libcurl carrying the range GETs (``conftest.libcurl``)."""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    require_nginx()
    root = tmp_path_factory.mktemp("www")
    data = random.Random(7).randbytes(SIZE)
    (root / "blob.bin").write_bytes(data)
    with Nginx(root) as server:
        yield server, root, data


def _options(**given) -> RemoteOptions:
    return RemoteOptions(OpenOptions(**given))


def _in(seconds: float) -> ReadContext:
    return ReadContext(time.monotonic() + seconds)


def test_range_reads_go_through_libcurl_with_the_files_bytes(site, monkeypatch):
    server, _, data = site
    src = HttpSource(f"{server.url}/blob.bin", options=_options(timeout=30))
    assert src.range.native
    rng = random.Random(3)
    before = curl.counters()
    spans = [(0, SIZE), (SIZE - 1, SIZE), (4 * MiB - 1, 4 * MiB + 1)]
    spans += [(a, min(SIZE, a + rng.randrange(1, 9 * MiB))) for a in (rng.randrange(SIZE) for _ in range(60))]
    for start, end in spans:
        assert src.pread(start, end - start) == data[start:end], (start, end)
        parts = src.range.fetch(start, end, _in(30))  # the range client itself: chunk-sized parts, the last shorter
        assert b"".join(parts) == data[start:end] and all(len(p) == CHUNK for p in parts[:-1])
    transfers, body = (a - b for a, b in zip(curl.counters(), before))
    assert transfers >= len(spans) and body >= sum(e - s for s, e in spans)

    monkeypatch.setenv(curl.ENV, "0")  # the escape hatch: urllib3 carries them, libcurl none
    plain = HttpSource(f"{server.url}/blob.bin?urllib3", options=_options(timeout=30))
    assert not plain.range.native
    before = curl.counters()
    assert b"".join(plain.range.fetch(5, 5 * MiB, _in(30))) == data[5:5 * MiB]
    assert curl.counters() == before


def test_a_deadline_ends_a_trickling_body_and_a_stall_an_answer_that_never_comes(site):
    server, _, data = site
    with FaultProxy(server.url) as proxy:
        src = HttpSource(f"{proxy.url}/blob.bin", options=_options(timeout=30, stall_timeout=1.5))
        proxy.plan("trickle:30")  # headers, then a byte a second: never a stall, only the deadline ends it
        t0 = time.monotonic()
        with pytest.raises(Retryable) as caught:
            src.range.fetch(0, 8 * MiB, _in(1.0))
        assert caught.value.deadline and "of 8388608 bytes" in str(caught.value)
        assert time.monotonic() - t0 < 6
        proxy.plan("headers:30")  # headers, then nothing: the stall timeout, well before the deadline
        t0 = time.monotonic()
        with pytest.raises(Retryable) as caught:
            src.range.fetch(0, 8 * MiB, _in(30))
        assert caught.value.timeout and not caught.value.deadline and "--stall-timeout" in str(caught.value)
        assert time.monotonic() - t0 < 10
        assert b"".join(src.range.fetch(0, MiB, _in(30))) == data[:MiB]  # the next request is served
        assert proxy.faults_used == ["trickle:30", "headers:30"]


def test_a_short_body_or_another_range_is_never_served(site):
    server, _, data = site
    with FaultProxy(server.url) as proxy:
        src = HttpSource(f"{proxy.url}/blob.bin", options=_options(timeout=30))
        proxy.plan("short")  # the full Content-Length announced, half of it sent
        with pytest.raises(Retryable, match=r"after \d+ of 2097152 bytes|short body"):
            src.range.fetch(MiB, 3 * MiB, _in(30))
        proxy.plan("range")  # another range: an odd answer, its bytes never returned
        with pytest.raises(OddAnswer, match="asked for bytes 1048576-3145727"):
            src.range.fetch(MiB, 3 * MiB, _in(30))
        proxy.plan("range", "range")  # asked again at once by the retry rule, wrong the same way: an error
        with pytest.raises(CheckpointError, match="asked for bytes 1048576-3145727"):
            src.client.fetch(MiB, 3 * MiB, _in(30))
        assert proxy.faults_used[-3:] == ["range", "range", "range"]
        assert b"".join(src.range.fetch(MiB, 3 * MiB, _in(30))) == data[MiB:3 * MiB]


def test_a_body_longer_than_asked_is_an_error_never_a_truncation(site):
    """At the extension's own boundary: nginx sends 100 bytes where 50 were asked; the caller's buffer (a
    slice of a larger one) is never written past its end."""
    server, _, _ = site
    answered = []

    def decide(status, reason, headers):
        answered.append((status, dict(headers)))
        return curl.TAKE

    whole = bytearray(b"\xee" * 200)
    code, _, got, parts = curl.native.get(f"{server.url}/blob.bin", ["Range: bytes=0-99"], 50, decide, None,
                                          time.monotonic() + 30, 5.0, into=memoryview(whole)[10:60])
    assert code == curl.native.E_LONG and parts is None and got <= 50
    assert answered[0][0] == 206 and answered[0][1]["content-range"] == f"bytes 0-99/{SIZE}"
    assert whole[:10] == b"\xee" * 10 and whole[60:] == b"\xee" * 140
    with pytest.raises(Retryable, match="long body: more than 50 bytes"):
        curl.outcome(server.url, code, "", got, parts, [206], False, 50, _in(30), _options())


def test_a_redirect_comes_back_to_ckptfs_which_follows_it_without_the_credentials(site):
    server, _, data = site
    with Redirector(server.url) as hop:
        # libcurl itself: the 302 is handed to decide, never followed (nginx sees no request)
        seen = []
        before = len(server.access_log())
        code, _, _, parts = curl.native.get(f"{hop.url}/blob.bin", ["Range: bytes=0-9"], 10,
                                            lambda s, r, h: seen.append((s, dict(h))) or curl.ABORT, None,
                                            time.monotonic() + 30, 5.0, chunk=CHUNK)
        assert parts is None and seen[0][0] == 302 and seen[0][1]["location"] == f"{server.url}/blob.bin"
        assert len(server.access_log()) == before
        # ckptfs's range client: it follows the 302 by its own rule, the Basic auth sent to the redirector only
        src = HttpSource(f"http://alice:secret@{hop.url.removeprefix('http://')}/blob.bin",
                         options=_options(timeout=30))
        assert src.range.native
        src.range.location = src.url  # ask through the redirect again, not at the remembered target
        asked = len(hop.auth)
        assert b"".join(src.range.fetch(7, 7 + MiB, _in(30))) == data[7:7 + MiB]
        assert len(hop.auth) == asked + 1 and hop.auth[-1] and hop.auth[-1].startswith("Basic ")
    lines = server.access_log(expect=before + 1)[before:]  # the range GET at nginx, sent by ckptfs
    assert lines and not any("Basic" in line for line in lines), lines


def test_https_with_a_private_ca_and_a_refused_certificate(tmp_path, site, monkeypatch):
    _, root, data = site
    ca, other = TestCA(tmp_path / "ca"), TestCA(tmp_path / "other", name="another CA")
    for key in ("SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.ca_file))
    with Nginx(root, tls=ca) as server:
        src = HttpSource(f"{server.url}/blob.bin", options=_options(timeout=30))
        before = curl.counters()
        assert b"".join(src.range.fetch(3, 3 + 5 * MiB, _in(30))) == data[3:3 + 5 * MiB]
        assert curl.counters()[0] > before[0]
        # trusting another CA, a thread of its own (its own connections: nothing verified before is reused)
        monkeypatch.setenv("SSL_CERT_FILE", str(other.ca_file))
        failed: list[BaseException] = []

        def read() -> None:
            try:
                src.range.fetch(0, MiB, _in(30))
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                failed.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(60)
    assert failed and isinstance(failed[0], CheckpointError), failed
    message = str(failed[0])
    assert "TLS certificate verify failed" in message and str(other.ca_file) in message
    assert "\n" not in message


def test_the_ca_locations_are_resolved_once_for_each_value_of_the_variables(tmp_path, monkeypatch):
    """Resolving them looks at the files (``http.trusted_cas``): done per range GET, a FUSE read waiting for its
    piece paid for it each time. Once per value of the variables, and again when one changes."""
    from ckptfs.sources.remote import http

    resolved: list[dict] = []
    real = http.trusted_cas

    def counted():
        resolved.append(dict(real()[0]))
        return real()

    monkeypatch.setattr(http, "trusted_cas", counted)
    http._curl_cas.cache_clear()
    for key in ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(key, raising=False)
    bundle, other = tmp_path / "bundle.pem", tmp_path / "other.pem"
    bundle.write_text("x")
    other.write_text("y")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    try:
        assert [http.curl_cas() for _ in range(3)] == [(str(bundle), None)] * 3
        assert len(resolved) == 1
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other))
        assert http.curl_cas() == (str(other), None) and len(resolved) == 2
        monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
        assert http.curl_cas() == (None, str(tmp_path)) and len(resolved) == 3
    finally:
        http._curl_cas.cache_clear()


def test_the_switch_reads_the_environment(monkeypatch):
    for off in ("0", "off", "false"):
        monkeypatch.setenv(curl.ENV, off)
        assert not curl.enabled("https://example.com/x")
    monkeypatch.setenv(curl.ENV, "1")
    assert curl.enabled("https://example.com/x") and curl.enabled("http://example.com/x")
    assert not curl.enabled("s3://bucket/key")



_INTERRUPTED = """
import signal, sys, time
# Python's own Ctrl-C handler, whatever this process inherited (a SIGINT ignored by the test runner's parent,
# or left at libfuse's default by an in-process mount, would otherwise keep the signal from reaching it)
signal.signal(signal.SIGINT, signal.default_int_handler)
from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.http import HttpSource
src = HttpSource(sys.argv[1])
assert src.range.native
print("opened", flush=True)
sys.stdin.readline()  # the trickle is planned for the next request: this one
try:
    src.range.fetch(0, 8 << 20, ReadContext(time.monotonic() + 60))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
"""


def test_ctrl_c_ends_a_transfer_mid_body(site):
    """SIGINT reaches a main thread waiting in libcurl for a trickling body: the transfer ends with a
    KeyboardInterrupt, not at the read's 60 s deadline."""
    server, _, _ = site
    with FaultProxy(server.url) as proxy:
        child = subprocess.Popen([sys.executable, "-c", _INTERRUPTED, f"{proxy.url}/blob.bin"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=cli_env())
        try:
            assert child.stdin is not None and child.stdout is not None
            assert child.stdout.readline() == "opened\n", child.stderr
            proxy.plan("trickle:60")
            child.stdin.write("\n")
            child.stdin.flush()
            assert wait_until(lambda: proxy.faults_used == ["trickle:60"], timeout=20)
            time.sleep(0.5)  # the body is trickling in: the child waits inside the transfer
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=20)
        finally:
            child.kill()
    assert child.returncode == 3 and "interrupted" in out, (child.returncode, out, err[-2000:])


_OPENED_WITHOUT_URLLIB3 = """
import sys
from ckptfs.core.options import OpenOptions
from ckptfs.sources.remote import curl
from ckptfs.sources.remote.http import HttpSource
from ckptfs.sources.remote.options import RemoteOptions
options = RemoteOptions(OpenOptions(timeout=30, cache_dir=sys.argv[2]), read_ahead=False)
src = HttpSource(sys.argv[1], options=options)
head = src.pread(0, 4096)
tail = src.pread(src.size - 4096, 4096)
print(src.size, curl.counters()[0], "urllib3" in sys.modules, head.hex(), tail.hex())
"""


def test_an_open_asks_through_libcurl_too_and_urllib3_is_never_imported(site, tmp_path):
    """The open's probe and the tail sample asked beside it (nginx's ETag is weak for ckptfs: its identity
    takes the file's last bytes) are range GETs like any other: through libcurl, where it is built, so a
    process that reads ``http(s)://`` files never imports urllib3 (its import alone is about 0.05 CPU-s)."""
    server, _, data = site
    done = subprocess.run([sys.executable, "-c", _OPENED_WITHOUT_URLLIB3, f"{server.url}/blob.bin",
                           str(tmp_path / "cache")], capture_output=True, text=True, timeout=120, env=cli_env())
    assert done.returncode == 0, done.stderr[-2000:]
    size, transfers, imported, head, tail = done.stdout.split()
    assert int(size) == SIZE and bytes.fromhex(head) == data[:4096] and bytes.fromhex(tail) == data[-4096:]
    assert int(transfers) >= 2  # the probe and the tail sample at least
    assert imported == "False"
