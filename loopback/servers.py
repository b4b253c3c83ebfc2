"""Real servers on loopback for the remote-source tests and the benchmarks, started and stopped by them.

- ``Nginx(root)``: Debian's nginx serving a folder with Range, ETag and Last-Modified (as a non-daemon child
  with a generated config in a temporary directory); ``Nginx(root, tls=True)`` serves it over ``https://``
  with a certificate from a throwaway CA (``TestCA``: the ``openssl`` CLI, generated at start).
- ``MotoS3()``: moto's standalone S3 server (``python -m moto.server``).
- ``HubStandIn(cdn_url, repos)``: a small http.server that answers as the Hugging Face Hub does for what
  ckptfs and ``huggingface_hub`` ask of it: ``/ORG/REPO/resolve/REV/PATH`` (302 to the CDN host for LFS
  files, with ``ETag``, ``X-Linked-Etag``, ``X-Linked-Size``, ``X-Repo-Commit``; small files answered
  directly), ``/api/models/ORG/REPO/tree/REV[/PATH]`` and ``/api/models/ORG/REPO[/revision/REV]``.

Every wait is bounded; ``stop()`` kills what was started (by its own pid) and waits for it. A tool that is not
installed (nginx, openssl) is a :class:`MissingTool` error, which the tests turn into a skip (a failure under
``CI=true``).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from loopback.polling import wait_until

NGINX = "/usr/sbin/nginx"
#: Debian's libnginx-mod-http-echo: ``echo_sleep`` waits on a timer (no CPU) before a request is served
ECHO_MODULE = "/usr/lib/nginx/modules/ngx_http_echo_module.so"
_SPAN = re.compile(r'" \d+ (?P<bytes>\d+) .* rt=(?P<rt>[\d.]+) end=(?P<end>[\d.]+)$')
_RANGE = re.compile(r'"GET /(?P<path>\S+) [^"]*" 206 \d+ .*range="bytes=(?P<a>\d+)-(?P<b>\d+)"')
#: a suffix range (``bytes=-N``: an open's tail sample asked before the size is known), as nginx answered it
_SUFFIX_RANGE = re.compile(r'"GET /(?P<path>\S+) [^"]*" 206 \d+ .*range="bytes=-\d+" cr="bytes (?P<a>\d+)-(?P<b>\d+)/')
#: nginx's ETag is weak (mtime to the second): every open, and each fetch after it, asks for the last 4 KiB
WEAK_ETAG_TAIL = 4096
#: What an open with a --cache-dir asks for first: the file's first bytes (size, identity, format), no more.
OPEN_HEAD = 4096
START_TIMEOUT = 20.0
#: How long a reader of nginx's access log waits for the lines it expects (``Nginx.access_log``).
LOG_TIMEOUT = 10.0


class MissingTool(RuntimeError):
    """A program a server needs is not installed on this machine (the message says which, and its package)."""


def nginx_missing() -> str | None:
    """Why nginx cannot run here (not installed), or None."""
    if os.path.exists(NGINX):
        return None
    return f"nginx is not installed ({NGINX}; Debian: apt-get install nginx-light)"


def echo_module_missing() -> str | None:
    """Why nginx cannot add latency here (its echo module is not installed), or None."""
    if os.path.exists(ECHO_MODULE):
        return None
    return f"nginx's echo module is not installed ({ECHO_MODULE}; Debian: apt-get install libnginx-mod-http-echo)"


@contextlib.contextmanager
def environment(values: dict[str, str]):
    """``os.environ`` with ``values`` set, restored afterwards (for module-scoped server fixtures)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def same_bytes(root: Path, names, size: int) -> bytes:
    """``size`` random bytes written under each of ``names`` in ``root`` (one file per test: its own log lines
    and its own learnt state); the bytes."""
    data = os.urandom(size)
    for name in names:
        (root / name).write_bytes(data)
    return data


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen | None = None, timeout: float = START_TIMEOUT) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


class TestCA:
    """A throwaway certificate authority in ``directory`` (made with the ``openssl`` CLI): ``ca_file`` is its
    certificate, the file a client is told to trust (``SSL_CERT_FILE``); ``issue`` signs server certificates.
    EC P-256 keys, valid for two days, with the extensions a strict verifier asks for (Python 3.13's default
    context sets VERIFY_X509_STRICT: key usage on the CA, key identifiers on the leaf)."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: str | os.PathLike, name: str = "ckptfs test CA"):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca_file = self.dir / "ca.pem"
        self._key = self.dir / "ca.key"
        self._openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                      "-keyout", self._key, "-out", self.ca_file, "-days", "2", "-subj", f"/CN={name}",
                      "-addext", "basicConstraints=critical,CA:TRUE",
                      "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                      "-addext", "subjectKeyIdentifier=hash")

    def issue(self, stem: str, names: tuple[str, ...] = ("IP:127.0.0.1", "DNS:localhost")) -> tuple[Path, Path]:
        """A server certificate for ``names`` (subjectAltName entries) signed by this CA: (cert, key) paths."""
        cert, key, csr, ext = (self.dir / f"{stem}{suffix}" for suffix in (".pem", ".key", ".csr", ".ext"))
        ext.write_text(f"subjectAltName={','.join(names)}\nbasicConstraints=critical,CA:FALSE\n"
                       "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                       "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
        self._openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                      "-keyout", key, "-out", csr, "-subj", f"/CN={names[0].partition(':')[2]}")
        self._openssl("x509", "-req", "-in", csr, "-CA", self.ca_file, "-CAkey", self._key, "-set_serial",
                      str(int.from_bytes(os.urandom(8), "big")), "-days", "2", "-extfile", ext, "-out", cert)
        return cert, key

    @staticmethod
    def _openssl(*args) -> None:
        if shutil.which("openssl") is None:
            raise MissingTool("the openssl CLI is not installed (Debian: apt-get install openssl)")
        done = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Nginx:
    """nginx serving ``root`` on a free loopback port (``url``); use as a context manager.

    ``limit_rate`` (nginx's own directive, e.g. ``"20m"``: bytes per second per request) caps what each
    request gets, as object stores and CDNs do per connection. ``first_byte_delay`` (seconds) makes every
    request wait that long before it is served, as a distant origin's latency to the first byte: the echo
    module's ``echo_sleep`` (a timer in nginx's event loop, no CPU and no process in between), then
    ``echo_exec`` to a named location that serves the file as without it (Range, ETag, ``limit_rate``); it
    needs Debian's libnginx-mod-http-echo (``echo_module_missing``; else a :class:`MissingTool` error). The
    delay is part of a request's span in the access log. Each access-log line ends with
    ``rt=<seconds the request took> end=<epoch seconds it ended>`` (``request_spans`` turns them into
    start/end pairs, for counting requests in flight).

    nginx writes a request's log line when it finalizes the request, after the answer's last bytes went to
    the socket: a client that has read a whole answer can look at the log before that line is there. A test
    that reads the log right after its requests says how many lines it expects (``expect``), and they are
    waited for; one that cannot know how many waits until nginx is idle (``wait_idle``). ``log_flush`` (nginx's ``access_log ... flush=``, e.g. ``"1s"``) buffers the lines and writes
    them that late, every time.

    ``tls``: serve ``https://`` instead — ``True`` with a CA of its own, or a ``TestCA`` to share one among
    servers; the certificate names ``tls_names`` (subjectAltName entries; give others for a name mismatch).
    ``ca_file`` is the CA certificate to trust (None for plain http)."""

    def __init__(self, root: str | os.PathLike, limit_rate: str | None = None, tls: bool | TestCA = False,
                 tls_names: tuple[str, ...] = ("IP:127.0.0.1", "DNS:localhost"), log_flush: str | None = None,
                 first_byte_delay: float = 0.0):
        self.root = str(Path(root).resolve())
        self.first_byte_delay = first_byte_delay
        self.log_flush = log_flush
        self.limit_rate = limit_rate  # nginx's per-request cap (e.g. "20m"), as a CDN or object store has
        self.port = free_port()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._status_port = free_port()  # nginx's stub_status, plain http and unlogged (wait_idle)
        self._dir = tempfile.mkdtemp(prefix="ckptfs-nginx-")
        self._proc: subprocess.Popen | None = None
        self.ca: TestCA | None = None
        self._cert: tuple[Path, Path] | None = None
        if tls:
            self.ca = tls if isinstance(tls, TestCA) else TestCA(Path(self._dir) / "ca")
            self._cert = self.ca.issue(f"server-{self.port}", tls_names)

    @property
    def ca_file(self) -> Path | None:
        return self.ca.ca_file if self.ca is not None else None

    def _config(self) -> str:
        user = "user root root;\n" if os.geteuid() == 0 else ""
        load = f"load_module {ECHO_MODULE};\n" if self.first_byte_delay else ""
        return f"""{load}{user}daemon off;
master_process off;
worker_processes 1;
pid {self._dir}/nginx.pid;
error_log {self._dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format withauth '$remote_addr - - [$time_local] "$request" $status $body_bytes_sent '
                        '"$http_referer" "$http_user_agent" auth="$http_authorization" range="$http_range" '
                        'cr="$sent_http_content_range" rt=$request_time end=$msec';
    access_log {self._dir}/access.log withauth{f" buffer=64k flush={self.log_flush}" if self.log_flush else ""};
    client_body_temp_path {self._dir}/body;
    proxy_temp_path {self._dir}/proxy;
    fastcgi_temp_path {self._dir}/fastcgi;
    uwsgi_temp_path {self._dir}/uwsgi;
    scgi_temp_path {self._dir}/scgi;
    types {{ }}
    default_type application/octet-stream;
    sendfile on;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{self.port}{" ssl" if self._cert else ""};
        {self._tls_config()}
        root {self.root};
        {self._locations()}
    }}
    server {{
        listen 127.0.0.1:{self._status_port};
        access_log off;
        location / {{ stub_status; }}
    }}
}}
"""

    def _locations(self) -> str:
        cap = f"limit_rate {self.limit_rate};" if self.limit_rate else ""
        if not self.first_byte_delay:
            return f"location / {{ {cap} }}"
        return (f"location / {{ echo_sleep {self.first_byte_delay:.3f}; echo_exec @file; }}\n"
                f"        location @file {{ {cap} }}")

    def _tls_config(self) -> str:
        if self._cert is None:
            return ""
        cert, key = self._cert
        return (f"ssl_certificate {cert}; ssl_certificate_key {key}; ssl_protocols TLSv1.2 TLSv1.3; "
                "ssl_session_cache shared:tls:1m;")

    def start(self) -> Nginx:
        if reason := nginx_missing() or (echo_module_missing() if self.first_byte_delay else None):
            raise MissingTool(reason)
        conf = Path(self._dir) / "nginx.conf"
        conf.write_text(self._config())
        self._proc = subprocess.Popen([NGINX, "-p", self._dir, "-c", str(conf)], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for_port(self.port, self._proc)
        except RuntimeError:
            err = self._proc.stderr.read().decode(errors="replace") if self._proc.poll() is not None else ""
            self.stop()
            raise RuntimeError(f"nginx did not start: {err.strip()}") from None
        return self

    @property
    def pid(self) -> int:
        """The nginx process (one process: ``master_process off``), for a test that freezes it (SIGSTOP)."""
        return self._proc.pid

    def access_log(self, expect: int = 0) -> list[str]:
        """The access log's lines, once it has at least ``expect`` (waited for up to ``LOG_TIMEOUT``, then an
        AssertionError): see the class docstring."""
        path = Path(self._dir) / "access.log"
        lines: list[str] = []

        def enough() -> bool:
            nonlocal lines
            lines = path.read_text().splitlines() if path.exists() else []
            return len(lines) >= expect

        if not wait_until(enough, LOG_TIMEOUT, interval=0.02):
            raise AssertionError(f"nginx logged {len(lines)} requests in {LOG_TIMEOUT:g} s, {expect} expected")
        return lines

    def wait_idle(self, timeout: float = LOG_TIMEOUT) -> None:
        """Return once nginx has no request in progress (its stub_status: none being read, none being written
        but the status request itself), so every request it has answered is in the access log: its one
        process (``master_process off``) logs a request in the same step that takes it off those counts.
        Bounded: an AssertionError after ``timeout`` seconds."""
        import urllib.request

        status = ""

        def idle() -> bool:
            nonlocal status
            with urllib.request.urlopen(f"http://127.0.0.1:{self._status_port}/", timeout=timeout) as resp:
                status = resp.read().decode()
            counts = re.search(r"Reading: (\d+) Writing: (\d+)", status)
            return counts is not None and counts.groups() == ("0", "1")

        if not wait_until(idle, timeout, interval=0.02):
            raise AssertionError(f"nginx still busy after {timeout:g} s: {status.strip()}")

    def ranges(self, path: str, before: int = 0) -> list[tuple[int, int]]:
        """The [start, end) byte ranges answered with 206 for ``path`` (as requested, without the leading
        ``/``) in the log lines after the first ``before``: as asked, or for a suffix range (``bytes=-N``) as
        answered."""
        out = []
        for line in self.access_log()[before:]:
            m = _RANGE.search(line) or _SUFFIX_RANGE.search(line)
            if m and m["path"] == path:
                out.append((int(m["a"]), int(m["b"]) + 1))
        return out

    def request_spans(self, before: int = 0, expect: int = 0) -> list[tuple[float, float, int]]:
        """(start, end, body bytes) of each request logged after the first ``before`` lines (nginx's
        millisecond clock), once at least ``expect`` are there."""
        out = []
        for line in self.access_log(before + expect)[before:]:
            m = _SPAN.search(line)
            if m:
                end = float(m["end"])
                out.append((end - float(m["rt"]), end, int(m["bytes"])))
        return out

    def stop(self) -> None:
        if self._proc is not None:
            _stop(self._proc)
            if self._proc.stderr is not None:
                self._proc.stderr.close()
            self._proc = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Nginx:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class MotoS3:
    """moto's standalone S3 server on a free loopback port (``endpoint``)."""

    def __init__(self):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None

    def start(self) -> MotoS3:
        if importlib.util.find_spec("moto") is None:
            raise MissingTool("moto is not installed (pip install 'moto[server]'; ckptfs's test-oracles extra)")
        self._proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, self._proc, timeout=60.0)
        return self

    def env(self) -> dict[str, str]:
        """The standard AWS environment pointing at this server (dummy credentials: moto accepts any)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing-key-id",
                "AWS_SECRET_ACCESS_KEY": "testing-secret-never-printed", "AWS_DEFAULT_REGION": "us-east-1"}

    def stop(self) -> None:
        if self._proc is not None:
            _stop(self._proc)
            self._proc = None

    def __enter__(self) -> MotoS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# As a model repository's .gitattributes has it: weights, and any large file, are LFS files, which the Hub
# redirects to its CDN; small text files are answered directly.
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".model")
LFS_MIN_SIZE = 10 * 1024 * 1024


class Redirector:
    """A loopback server answering every GET with a 302 to ``target`` + the path asked (its query left out),
    recording each request's Authorization header (``auth``): whoever follows the redirect, and with what
    credentials, is then seen."""

    def __init__(self, target: str):
        self.target = target
        self.auth: list[str | None] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        redirector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                redirector.auth.append(self.headers.get("authorization"))
                self.send_response(302)
                self.send_header("Location", redirector.target + self.path.split("?")[0])
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True

    def __enter__(self) -> Redirector:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        wait_for_port(self.port)
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


class HubStandIn:
    """A loopback stand-in for the Hub's resolve and tree endpoints over a folder per repository.

    ``repos`` maps ``"ORG/REPO"`` to a folder; ``cdn_url`` is an nginx serving ``cdn_root``, into which LFS
    files are copied by sha256 (as the Hub's CDN stores them). Requests are recorded in ``requests`` (method,
    path, Authorization header present).
    """

    commit = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, repos: dict[str, str | os.PathLike], cdn_root: str | os.PathLike, cdn_url: str,
                 token: str | None = None):
        self.repos = {name: Path(folder) for name, folder in repos.items()}
        self.cdn_root = Path(cdn_root)
        self.cdn_url = cdn_url.rstrip("/")
        self.token = token
        self.requests: list[tuple[str, str, bool]] = []
        self.files: dict[tuple[str, str], dict] = {}
        for name, folder in self.repos.items():
            for path in sorted(folder.rglob("*")):
                if path.is_file():
                    self._add(name, path.relative_to(folder).as_posix(), path)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: http.server.ThreadingHTTPServer | None = None

    def _add(self, repo: str, rel: str, path: Path) -> None:
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        info = {"size": len(data), "sha256": sha, "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
                "lfs": rel.endswith(LFS_SUFFIXES) or len(data) >= LFS_MIN_SIZE, "path": path}
        if info["lfs"]:
            shutil.copyfile(path, self.cdn_root / sha)
        self.files[(repo, rel)] = info

    def start(self) -> HubStandIn:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._handle(self, head=True)

            def do_GET(self) -> None:
                hub._handle(self, head=False)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HubStandIn:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- answers -------------------------------------------------------------------------------------------
    def _handle(self, req, head: bool) -> None:
        path = unquote(urlsplit(req.path).path, errors="surrogateescape")  # a name's bytes that are not UTF-8
        self.requests.append((req.command, path, "authorization" in {k.lower() for k in req.headers}))
        if self.token is not None and req.headers.get("authorization") != f"Bearer {self.token}":
            return self._send(req, 401, {"X-Error-Code": "RepoNotFound"}, b'{"error":"unauthorized"}', head)
        parts = path.strip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(req, "/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
        if len(parts) >= 5 and parts[:2] == ["api", "models"] and parts[4] == "tree":
            return self._tree(req, "/".join(parts[2:4]), parts[5] if len(parts) > 5 else "main",
                              "/".join(parts[6:]), head)
        if len(parts) >= 4 and parts[:2] == ["api", "models"]:
            return self._model_info(req, "/".join(parts[2:4]), head)
        self._send(req, 404, {"X-Error-Code": "EntryNotFound"}, b'{"error":"not found"}', head)

    def _send(self, req, status: int, headers: dict, body: bytes, head: bool) -> None:
        req.send_response(status)
        for k, v in headers.items():
            req.send_header(k, v)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        if not head:
            req.wfile.write(body)

    def _resolve(self, req, repo: str, rev: str, rel: str, head: bool) -> None:
        info = self.files.get((repo, rel))
        if repo not in self.repos or info is None:
            code = "RepoNotFound" if repo not in self.repos else "EntryNotFound"
            return self._send(req, 404, {"X-Error-Code": code}, b'{"error":"not found"}', head)
        common = {"X-Repo-Commit": self.commit, "Accept-Ranges": "bytes"}
        if info["lfs"]:
            headers = {**common, "ETag": f'"{info["sha256"]}"', "X-Linked-Etag": f'"{info["sha256"]}"',
                       "X-Linked-Size": str(info["size"]), "Location": f"{self.cdn_url}/{info['sha256']}"}
            return self._send(req, 302, headers, b"", head)
        data = info["path"].read_bytes()
        headers = {**common, "ETag": f'"{info["oid"]}"', "Content-Type": "application/octet-stream"}
        rng = req.headers.get("range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start, end = int(a), min(int(b) if b else len(data) - 1, len(data) - 1)
            if start >= len(data):
                return self._send(req, 416, {**headers, "Content-Range": f"bytes */{len(data)}"}, b"", head)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return self._send(req, 206, headers, data[start:end + 1], head)
        self._send(req, 200, headers, data, head)

    def _entries(self, repo: str, prefix: str) -> list[dict]:
        out, dirs = [], set()
        for (name, rel), info in sorted(self.files.items()):
            if name != repo or not rel.startswith(prefix):
                continue
            rest = rel[len(prefix):]
            if "/" in rest:
                dirs.add(prefix + rest.split("/")[0])
                continue
            entry = {"type": "file", "oid": info["oid"], "size": info["size"], "path": rel}
            if info["lfs"]:
                entry["lfs"] = {"oid": info["sha256"], "size": info["size"], "pointerSize": 134}
            out.append(entry)
        out += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(dirs)]
        return out

    def _tree(self, req, repo: str, rev: str, rel: str, head: bool) -> None:
        if repo not in self.repos:
            return self._send(req, 404, {"X-Error-Code": "RepoNotFound"}, b'{"error":"not found"}', head)
        prefix = rel.strip("/") + "/" if rel.strip("/") else ""
        body = json.dumps(self._entries(repo, prefix)).encode()
        self._send(req, 200, {"Content-Type": "application/json"}, body, head)

    def _model_info(self, req, repo: str, head: bool) -> None:
        if repo not in self.repos:
            return self._send(req, 404, {"X-Error-Code": "RepoNotFound"}, b'{"error":"not found"}', head)
        siblings = [{"rfilename": rel} for (name, rel) in sorted(self.files) if name == repo]
        body = json.dumps({"id": repo, "modelId": repo, "sha": self.commit, "siblings": siblings,
                           "private": False}).encode()
        self._send(req, 200, {"Content-Type": "application/json"}, body, head)


def quote_path(path: str) -> str:
    return quote(path, safe="/")


def data_ranges(ranges: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """Of the ranges a ckptfs source asked nginx for, those that fetched data: not an open's probe of the first
    ``OPEN_HEAD`` bytes, nor the weak ETag's check of the file's last ``WEAK_ETAG_TAIL`` bytes."""
    return [r for r in ranges if r != (0, OPEN_HEAD) and r != (max(0, size - WEAK_ETAG_TAIL), size)]  # (as asked)


def requests_since(server: Nginx, before: int, path: str | None = None,
                   checks: bool = True) -> list[tuple[str, int, int]]:
    """(path, status, body bytes) of each request nginx logged after the first ``before`` lines (``checks``
    False: without the requests for a file's last 4 KiB, see ``is_tail_check``)."""
    out = []
    for line in server.access_log()[before:]:
        m = _LOG_LINE.search(line)
        if m and (path is None or m["path"] == path) and (checks or not is_tail_check(server, line)):
            out.append((m["path"], int(m["status"]), int(m["bytes"])))
    return out


_LOG_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) [^"]*" (?P<status>\d+) (?P<bytes>\d+)')
_RANGE_ASKED = re.compile(r'range="bytes=(?P<a>\d+)-(?P<b>\d+)"')  # any answer's asked range (_RANGE: a 206's)
_SUFFIX_ASKED = re.compile(r'range="bytes=-(?P<n>\d+)"')


def is_tail_check(server: Nginx, line: str) -> bool:
    """Whether an access-log line is a request for the file's last ``WEAK_ETAG_TAIL`` bytes (its version's check,
    or the open's sample asked beside its probe as a suffix range)."""
    m, r, suffix = _LOG_LINE.search(line), _RANGE_ASKED.search(line), _SUFFIX_ASKED.search(line)
    if not m or not (r or suffix):
        return False
    size = (Path(server.root) / m["path"].split("?")[0].lstrip("/")).stat().st_size
    if suffix:
        return int(suffix["n"]) == WEAK_ETAG_TAIL and int(m["bytes"]) == min(WEAK_ETAG_TAIL, size)
    start, end = int(r["a"]), int(r["b"])
    return end == size - 1 and end + 1 - start == min(WEAK_ETAG_TAIL, size) == int(m["bytes"])
