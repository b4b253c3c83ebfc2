"""``http://`` and ``https://`` sources: range GETs over kept-alive connections, through libcurl from C where
the extension is built (``curl``: the transfer without the GIL, the body written into the chunks' bytes) —
the open's probe and the tail sample beside it included, so urllib3 is not even imported then — else
urllib3 (``CKPTFS_CURL=0``, no extension; the Hub's API calls always). Both clients' answers are judged by
the same rules (``HttpRange._judge``; the probe's in ``HttpSource``) and their redirects followed by one rule
(``Redirects``).

Opening sends one GET for the first ``REMOTE_INITIAL_READ`` bytes (``Range: bytes=0-...``), not a HEAD: the
answer fixes size (``Content-Range``) and identity (``ETag``, else ``Last-Modified``), and its bytes are the
start of the header the reader is about to parse, so a checkpoint's first request is never wasted. (A
presigned S3 URL is signed for GET only; a HEAD would be refused.) With a ``--cache-dir`` the first GET asks
for ``OPEN_HEAD_BYTES`` only, and the last ``SAMPLE_BYTES`` a weak validator needs for the content identity
are asked beside it (``_TailAhead``). Opens are memoized per options object
(one ``ckptfs.open`` or mount), because header detection, the header reader and the pool each open the file.

Every later answer is checked against the identity fixed at open (``Content-Range`` total and the
validator); another identity fails that read (``changed since it was opened``), never mixes bytes. A server
that answers a Range request with the whole body (200) is refused with one line, unless the whole body is
exactly the range asked for. An answer that cannot be the bytes asked for (a 200 to a Range request, another
range or total in ``Content-Range``, another validator, a 416) is not believed at once: one backend behind a
load balancer, or a proxy, may be wrong while the origin is not. Its body is dropped unread and the range
asked again on a fresh connection (``odd``); only a second answer that is wrong the same way
decides (the file was replaced, or the server cannot serve ranges). Two different wrong answers are retried
like a reset, within the read's deadline.

Redirects are followed by hand (at most ``MAX_REDIRECTS``; a URL seen twice is a loop): credentials
(``Authorization``) are sent only to the origin they were given for and dropped for good once a redirect
leaves it. ``http://user:password@host/...`` is HTTP Basic auth for that origin (curl's rule): the user info
is taken out of the URL (it never reaches urllib3, a log line or a message) and sent as an ``Authorization``
header under that same rule. The final location of a redirected URL (the Hub's CDN) is remembered, so later range reads go
straight there; a 4xx from a remembered location resolves the original URL again.

Timeouts: connecting and every wait for body bytes are bounded by ``--stall-timeout`` (a stalled attempt is
abandoned and retried), and the whole read by ``--timeout`` (see ``remote``).

``https://`` trusts what OpenSSL's default paths hold — ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when set, else the
system's store — or, when neither is set, the bundle named by ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE``
(as requests-based tools, older huggingface_hub among them, read it); see ``trusted_cas``. A certificate
that is refused fails at once with one line (retrying cannot change it), naming what was trusted.
"""

from __future__ import annotations

import base64
import email.utils
import functools
import logging
import os
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

if TYPE_CHECKING:  # imported where urllib3 carries a request (no libcurl, CKPTFS_CURL=0, the Hub's API calls)
    import urllib3
    from urllib3 import BaseHTTPResponse

from ckptfs.sources.remote.store.chunks import CHUNK
from ckptfs.core.errors import CheckpointError
from ckptfs.core.runtime import Part
from ckptfs.sources.registry import register_scheme
from ckptfs.sources.netstats import SourceCounters
from ckptfs.sources.remote import curl
from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.odd import OddAnswer, content_range
from ckptfs.sources.remote.options import POOL_CONNECTIONS, RemoteOptions, default_options
from ckptfs.sources.remote.origin import Changed, Relocated, Retryable, stalled, wait_bound
from ckptfs.sources.remote.transport import OPEN_HEAD_BYTES, RemoteSource, joined
from ckptfs.sources.remote.version import SAMPLE_BYTES
from ckptfs.util.redact import public_name, redact, split_source

log = logging.getLogger(__name__)

MAX_REDIRECTS = 10
PROBE_MEMO_SECONDS = 60.0
#: How long an open waits for the tail sample asked beside its probe, at least (else as long as the probe took:
#: both were sent at once), before it asks for it again itself.
TAIL_AHEAD_WAIT_S = 0.05
_REDIRECTS = (301, 302, 303, 307, 308)
_UNSATISFIED_RANGE = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$", re.IGNORECASE)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def trusted_cas() -> tuple[dict[str, Any], str]:
    """The CA certificates ``https://`` trusts: urllib3 keyword arguments and a description for messages.

    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` (OpenSSL's own variables, honoured by the default context urllib3
    builds: nothing to pass) win; without them ``REQUESTS_CA_BUNDLE``, then ``CURL_CA_BUNDLE`` (a file or a
    folder, as requests takes them) replace the system's store, so that a private CA set up for
    huggingface_hub or pip is trusted by the byte reads too. An empty value is unset: it never turns
    verification off."""
    openssl = [f"{k}={os.environ[k]}{'' if os.path.exists(os.environ[k]) else ' (missing)'}"
               for k in ("SSL_CERT_FILE", "SSL_CERT_DIR") if os.environ.get(k)]
    if openssl:
        return {}, " and ".join(openssl)
    for key in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        path = os.environ.get(key)
        if path:
            return ({"ca_cert_dir": path} if os.path.isdir(path) else {"ca_certs": path}), f"{key}={path}"
    return {}, "the system's CA store"


#: The variables ``trusted_cas`` reads.
TLS_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def curl_cas() -> tuple[str | None, str | None]:
    """The CA file and folder libcurl is handed (``curl.ca_locations`` of ``trusted_cas``), resolved once for
    each value of the variables: resolving them stats files, and every range GET asks (a FUSE read that
    waits for its piece would wait for that too, the GIL handed back and forth around each stat)."""
    return _curl_cas(tuple(os.environ.get(k) for k in TLS_VARIABLES))


@functools.lru_cache(maxsize=4)
def _curl_cas(values: tuple[str | None, ...]) -> tuple[str | None, str | None]:
    return curl.ca_locations(trusted_cas()[0])  # (``values``: the cache's key, read again by trusted_cas)


def connection_pool() -> urllib3.PoolManager:
    """A pool manager of keep-alive connections, reused by every HTTP source of a runtime (``HTTP_POOL``)."""
    import urllib3

    return urllib3.PoolManager(num_pools=64, maxsize=POOL_CONNECTIONS, block=False, retries=False,
                               **trusted_cas()[0])


#: A runtime's HTTP connections; a forked child makes its own (the parent's keep-alive sockets must not be
#: shared: each process talks on its own).
HTTP_POOL = Part("HTTP connection pool", connection_pool)


@dataclass(frozen=True)
class Credentials:
    """Headers that authenticate, and how to name them in messages (never their value)."""

    headers: tuple[tuple[str, str], ...] = ()
    description: str = "no credentials"


NO_CREDENTIALS = Credentials()


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _discard(resp: BaseHTTPResponse) -> None:
    """Abandon a response without reading its body: close its connection (it cannot be reused)."""
    try:
        resp.close()
    finally:
        resp.release_conn()


def _finish_small(resp: BaseHTTPResponse) -> None:
    """Drop a short error/redirect body and keep the connection when that is cheap, else close it."""
    length = resp.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) <= 65536:
        try:
            resp.drain_conn()
            resp.release_conn()
            return
        except Exception:  # noqa: BLE001 - fall back to closing
            pass
    _discard(resp)


@dataclass
class Answer:
    """A response whose body is still unread, with the URL that gave it and the redirects on the way."""

    resp: BaseHTTPResponse
    url: str
    hops: list[Mapping[str, str]]  # the redirect responses' headers, first hop first


def fresh_pool() -> urllib3.PoolManager:
    """A pool for one request on a connection of its own (the re-ask after an odd answer: not on a kept-alive
    connection to the backend that gave it)."""
    import urllib3

    return urllib3.PoolManager(num_pools=1, maxsize=1, block=False, retries=False, **trusted_cas()[0])


class HttpClient:
    """Sends one request with redirects followed by hand (see the module docstring)."""

    def __init__(self, scheme: str, credentials: Credentials, options: RemoteOptions):
        self.scheme = scheme
        self.credentials = credentials
        self.options = options

    def send(self, method: str, url: str, headers: Mapping[str, str], deadline: float, auth_origin: str,
             fresh: bool = False) -> Answer:
        """``fresh``: on a new connection, closed after the answer, instead of a kept-alive one."""
        import urllib3

        walk = Redirects(url, auth_origin)
        pool = fresh_pool() if fresh else None
        sent = {**ASKED_HEADERS, **headers, **({"Connection": "close"} if fresh else {})}
        while True:
            url = walk.url
            # the request itself, here and not in a helper: a read's walk down the chain is one frame per part
            wait, by_deadline = wait_bound(self.options, deadline)
            if wait <= 0:
                raise Retryable("had no time left to ask", deadline=True)
            all_headers = {**sent, **dict(self.credentials.headers)} if walk.send_auth else sent
            try:
                resp = (pool or self.options.runtime.get(HTTP_POOL)).request(method, url, headers=all_headers, preload_content=False,
                                                 decode_content=False, redirect=False, retries=False,
                                                 timeout=urllib3.Timeout(connect=wait, read=wait))
            except urllib3.exceptions.NewConnectionError as exc:  # a subclass of the timeout error, but refused
                raise Retryable(f"connection failed: {_reason(exc)}") from None
            except (TimeoutError, urllib3.exceptions.TimeoutError):
                if by_deadline:
                    raise Retryable("had no answer yet", deadline=True) from None
                raise stalled("no answer", self.options) from None
            except urllib3.exceptions.SSLError as exc:
                refused = _tls_refusal(exc)
                if refused is None:  # a handshake cut short: the next connection may succeed
                    raise Retryable(f"connection failed: {_reason(exc)}") from None
                self.options.counters.request(self.scheme, "error")
                raise CheckpointError(url, None, refused) from None
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise Retryable(f"connection failed: {_reason(exc)}") from None
            if not redirected(resp.status, resp.headers):
                return Answer(resp, url, walk.hops)
            _finish_small(resp)
            self.options.counters.request(self.scheme, "ok")
            walk.follow(resp.status, resp.headers)


#: Headers every request sends: the body as stored (no compression), and who asks.
ASKED_HEADERS = {"Accept-Encoding": "identity", "User-Agent": "ckptfs"}


def redirected(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an answer is a redirect ckptfs follows (a 3xx with a Location)."""
    return status in _REDIRECTS and bool(headers.get("location"))


class Redirects:
    """One request's walk through redirects, followed by hand (see the module docstring): where to ask next,
    whether the credentials go there, and each hop's headers (the Hub's ``X-Linked-Etag`` is read from them)."""

    def __init__(self, url: str, auth_origin: str):
        self.url = url
        self.seen = {url}
        self.hops: list[Mapping[str, str]] = []  # the redirect responses' headers, first hop first
        self.send_auth = _origin(url) == _origin(auth_origin)

    def follow(self, status: int, headers: Mapping[str, str]) -> None:
        """Move to the redirect's target, or fail on a loop or after ``MAX_REDIRECTS``."""
        self.hops.append(headers)
        target = urljoin(self.url, headers["location"])
        if _origin(target) != _origin(self.url):
            self.send_auth = False  # never again: credentials do not follow a redirect to another host
        if target in self.seen:
            raise CheckpointError(self.url, None, f"redirect loop (HTTP {status} back to {public_name(target)})")
        self.seen.add(target)
        self.url = target
        if len(self.hops) > MAX_REDIRECTS:
            raise CheckpointError(target, None, f"too many redirects (more than {MAX_REDIRECTS})")


_NAME_MISMATCH = (62, 64)  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH


def _tls_refusal(exc: urllib3.exceptions.SSLError) -> str | None:
    """The one-line reason for a TLS failure no retry can mend — the server's certificate refused, or the
    trusted CA certificates unreadable — or None for one that may pass (a reset or EOF in the handshake)."""
    inner = exc.args[0] if exc.args else None
    if isinstance(inner, ssl.SSLCertVerificationError):
        return tls_refusal(True, (inner.verify_message or str(inner)).rstrip("."), inner.verify_code in _NAME_MISMATCH)
    if isinstance(inner, OSError) and not isinstance(inner, ssl.SSLError):  # loading the CA file failed
        return tls_refusal(False, str(inner.strerror or inner))
    return None


def tls_refusal(verify: bool, detail: str, other_host: bool = False) -> str:
    """The one line for the server's certificate refused (``verify``; ``other_host``: it names another host)
    or the trusted CA certificates unreadable, whichever client found it."""
    trusted = trusted_cas()[1]
    if not verify:
        return f"cannot load the trusted CA certificates ({trusted}): {detail}"
    if other_host:
        return f"TLS certificate verify failed: {detail} (the server's certificate names another host)"
    return (f"TLS certificate verify failed: {detail} (trusted: {trusted}; for a private CA set "
            f"SSL_CERT_FILE to its certificate)")


def _reason(exc: BaseException) -> str:
    """The innermost useful words of a urllib3 error (they nest the URL and the pool repeatedly)."""
    inner = getattr(exc, "reason", None) or exc  # probe: third-party (urllib3's errors that wrap another)
    text = str(inner)
    text = re.sub(r"<urllib3[^>]*>:?\s*", "", text)
    return redact(text.splitlines()[0][:200]) if text else type(inner).__name__


def basic_auth(url: str) -> tuple[str, Credentials]:
    """``url`` without its user info, and the HTTP Basic credentials it held (none: ``NO_CREDENTIALS``)."""
    parts = split_source(url)  # the one split of a URL's user info (util.redact): the last "@", the first ":"
    if parts is None or not parts.has_userinfo:
        return url, NO_CREDENTIALS
    token = base64.b64encode(f"{parts.user}:{parts.password or ''}".encode()).decode("ascii")
    return (parts.without_userinfo(),
            Credentials((("Authorization", f"Basic {token}"),), "HTTP Basic auth from the URL's user info"))


def status_error(name: str, offset: int | None, status: int, reason: str, credentials: Credentials,
                 headers: Mapping[str, str], counters: SourceCounters, scheme: str = "http") -> Exception:
    """The exception for a non-success status: Retryable for 5xx and 429, else a one-line CheckpointError
    (counted here: the retry loop counts only what it retries)."""
    if status == 429 or status >= 500:
        return Retryable(f"HTTP {status} {reason}".rstrip(), retry_after=_retry_after(headers.get("retry-after")),
                         throttled=status in (429, 503))
    counters.request(scheme, "error")
    if status in (404, 410):
        return CheckpointError(name, offset, f"not found (HTTP {status})")
    if status in (401, 403):
        return CheckpointError(name, offset, f"access denied (HTTP {status}; sent {credentials.description})")
    return CheckpointError(name, offset, f"HTTP {status} {reason}".rstrip())


@dataclass
class Probe:
    """What opening learned: size, validator, the URL that serves the bytes, and the first bytes."""

    size: int
    validator: str | None
    location: str
    sha256: str | None
    head: bytes
    at: float
    mtime_ns: int = 0  # from Last-Modified: the mount's file times
    tail: bytes | None = None  # the last bytes, for a weak validator (HttpSource._tail_sample)
    commit: str | None = None  # the repository commit the Hub named (X-Repo-Commit)


class HttpSource(RemoteSource):
    """One object behind an http(s) URL (see the module docstring)."""

    scheme = "http"
    range: HttpRange

    def __init__(self, url: str, credentials: Credentials = NO_CREDENTIALS, options: RemoteOptions | None = None,
                 name: str | None = None, scheme: str | None = None):
        self.url = url
        self.scheme = scheme or urlsplit(url).scheme.lower() or "http"  # the counters' label
        self.credentials = credentials
        options = options if options is not None else default_options()
        super().__init__(name or url, options, HttpRange(name or url, url, self.scheme, credentials, options))
        probe = self._probe()
        self.range.opened(probe)
        self.client.moved()  # the CDN host after a redirect: its own in-flight limit and outage state
        self.size, self.validator = probe.size, probe.validator
        sample = self._tail_sample(probe) if probe.sha256 is None and weak_validator(probe.validator, probe.size) \
            else None
        self._set_identity(probe.size, probe.validator, url, probe.sha256, sample, probe.commit, probe.mtime_ns)
        self.mtime_ns = probe.mtime_ns
        self._keep_prefix(probe.head)

    def origin(self) -> str:
        return self.range.origin()

    # -- opening ---------------------------------------------------------------------------------------
    def _probe(self) -> Probe:
        memo = self.options.probes
        key = ("http", self.url, self.credentials)
        found = memo.get(key)
        if isinstance(found, Probe) and time.monotonic() - found.at < PROBE_MEMO_SECONDS:
            return found
        read = self.options.opening()
        # with a --cache-dir the content identity names the store's file, and every fetch waits for it: a weak
        # validator's tail sample is asked beside the probe, not a round trip after it (the Hub names its
        # files by their sha256: never needed there)
        ahead = _TailAhead(self.range, read.deadline) if self.options.cache_dir and self.scheme != "hf" else None
        started = time.monotonic()
        probe = self.client.retrying(self._probe_once, read, None, "cannot open: ")
        if ahead is not None and probe.sha256 is None and weak_validator(probe.validator, probe.size):
            probe.tail = ahead.take(probe, max(TAIL_AHEAD_WAIT_S, time.monotonic() - started))
        memo[key] = probe
        return probe

    def _tail_sample(self, probe: Probe) -> bytes:
        """The file's last ``SAMPLE_BYTES`` (see ``weak_validator``): from the first read when it holds the
        whole file, or as asked beside it (``_TailAhead``), else one request, memoized with the probe."""
        n = min(SAMPLE_BYTES, probe.size)
        if probe.tail is None:
            if len(probe.head) == probe.size:
                probe.tail = bytes(probe.head[probe.size - n:])
            else:
                read = self.options.opening()
                probe.tail = joined(self.client.retrying(functools.partial(self.range.fetch, probe.size - n,
                                                                           probe.size), read, None, "cannot open: "))
                self.options.counters.request(self.scheme, "ok", len(probe.tail))
        return probe.tail

    def _probe_once(self, read: ReadContext) -> Probe:
        # With a --cache-dir the header's bytes may be there already: ask for a few (OPEN_HEAD_BYTES), to learn
        # the size and identity and judge the format (a remount then sends no request for bytes it fetched
        # before).
        first = OPEN_HEAD_BYTES if self.options.cache_dir else self.initial_read
        if self.range.native:
            return self._probe_curl(read, first)
        answer = self.range.http.send("GET", self.url, {"Range": f"bytes=0-{first - 1}"}, read.deadline, self.url)
        resp = answer.resp
        try:
            length = self._probe_length(resp.status, resp.reason or "", resp.headers, first)
        except BaseException:
            (_discard if resp.status in (200, 206) else _finish_small)(resp)
            raise
        if length is None:
            _finish_small(resp)
        head = b"" if length is None else self.range.read_body(resp, length, read.deadline)
        return self._probed(resp.status, resp.headers, answer.hops, answer.url, head)

    def _probe_length(self, status: int, reason: str, headers: Mapping[str, str], first: int) -> int | None:
        """The body an answer to the open's first GET (of bytes 0..``first``) holds, to be read whole: a 206
        from byte 0 that says the file's total, or a 200 no longer than asked for (the whole of a smaller
        file); None for a 416, whose headers say all (``_probed``). Any other answer raises its error, which
        either client raises as it is (its body then dropped)."""
        if status == 416:
            return None
        if status == 206:
            start, end, total = _content_range(headers, self.name)
            if start != 0 or total is None or end + 1 > first:
                raise CheckpointError(self.name, 0, f"unusable Content-Range {headers.get('content-range')!r}")
            return end + 1
        if status == 200:
            length = headers.get("content-length")
            if length is None or not length.isdigit() or int(length) > first:
                raise CheckpointError(self.name, None, "the server does not support Range requests (it answered "
                                                       "200 with the whole file to a Range request)")
            return int(length)  # a file smaller than the first read: the whole body is the range
        raise status_error(self.name, None, status, reason, self.credentials, headers, self.options.counters,
                           self.scheme)

    def _probed(self, status: int, headers: Mapping[str, str], hops: list[Mapping[str, str]], url: str,
                head: bytes) -> Probe:
        """What the open learnt from the answer ``_probe_length`` judged (its ``status`` and ``headers``, the
        redirects' ``hops`` before it, where it came from, its body ``head``), counted: an empty file's 416,
        or the size and identity of a file and its first bytes."""
        linked = _linked_sha256(hops) or _linked_sha256([headers])
        if status == 416:
            match = _UNSATISFIED_RANGE.match(headers.get("content-range", ""))
            if match and int(match[1]) == 0:
                self.options.counters.request(self.scheme, "ok")
                return Probe(0, _validator(headers), url, linked, b"", time.monotonic(), _mtime_ns(headers))
            raise CheckpointError(self.name, 0, "the server refused the first byte range (HTTP 416)")
        total = _content_range(headers, self.name)[2] if status == 206 else len(head)
        assert total is not None  # (_probe_length refused a 206 without one)
        self.options.counters.request(self.scheme, "ok", len(head))
        commit = next((h.get("x-repo-commit") for h in [*hops, headers] if h.get("x-repo-commit")), None)
        return Probe(total, _validator(headers), url, linked, head, time.monotonic(), _mtime_ns(headers),
                     commit=commit)

    def _probe_curl(self, read: ReadContext, first: int) -> Probe:
        """``_probe_once``'s GET through libcurl, the client of every range GET where it is built: redirects
        followed here by ``Redirects``' rule, the answer judged by ``_probe_length`` as its headers arrive,
        the body as long as they say (``(TAKE, n)``)."""
        walk = Redirects(self.url, self.url)
        sent = [f"{k}: {v}" for k, v in ASKED_HEADERS.items()] + [f"Range: bytes=0-{first - 1}"]
        sent += ["Connection: close"] if read.fresh else []
        cas = curl_cas()
        while True:
            answered: list[int] = []
            final: list[dict[str, str]] = []
            taken: list[int] = []  # the body's length, as the answer's headers say
            hop: list[tuple[int, dict[str, str]]] = []

            def decide(status: int, reason: str, lines: list[tuple[str, str]]) -> int | tuple[int, int]:
                answered.append(status)
                headers = dict(lines)
                if redirected(status, headers):
                    hop.append((status, headers))
                    return curl.redirect_body(headers)
                final.append(headers)
                length = self._probe_length(status, reason, headers, first)
                if length is None:
                    return curl.ABORT  # (its headers say all)
                taken.append(length)
                return curl.TAKE, length

            auth = [f"{k}: {v}" for k, v in self.credentials.headers] if walk.send_auth else []
            assert curl.native is not None  # self.range.native: the extension is built
            code, message, got, parts = curl.native.get(
                walk.url, sent + auth, first, decide, read.until, read.until(), self.options.stall_timeout,
                read.fresh, cas[0], cas[1], "", None, CHUNK)
            status = answered[-1] if answered else 0  # (none: the transfer failed before an answer)
            try:
                parts = curl.outcome(walk.url, code, message, got, parts, answered, bool(hop) or status == 416,
                                     taken[0] if taken else first, read, self.options)
            except curl.TlsRefused as exc:
                self.options.counters.request(self.scheme, "error")
                raise CheckpointError(walk.url, None, tls_refusal(exc.verify, exc.detail, exc.other_host)) \
                    from None
            if hop:
                self.options.counters.request(self.scheme, "ok")
                walk.follow(*hop[0])
                continue
            return self._probed(status, final[0], walk.hops, walk.url, joined(parts) if parts else b"")


class HttpRange:
    """The ``http(s)://`` range client (``ranges.RangeClient``): one ranged GET of the file, at the location
    its URL was last redirected to, checked against the identity fixed at open (see the module docstring)."""

    def __init__(self, name: str, url: str, scheme: str, credentials: Credentials, options: RemoteOptions):
        self.name = name
        self.url = url
        self.scheme = scheme
        self.credentials = credentials
        self.options = options
        self.http = HttpClient(scheme, credentials, options)
        self.location = url  # where range reads go: the URL's last redirect target (the Hub's CDN)
        self._origin = _origin_of(url)
        self.sha256: str | None = None
        self.size = 0
        self.validator: str | None = None
        self.native = curl.enabled(url)  # range GETs through libcurl (``curl``), else urllib3

    def opened(self, probe: Probe) -> None:
        """The open's answer: the identity later answers are checked against, and where to ask (the CDN host
        after a redirect: its own in-flight limit and outage state, ``OriginClient.moved``)."""
        self.location = probe.location
        self._origin = _origin_of(probe.location)
        self.sha256 = probe.sha256
        self.size, self.validator = probe.size, probe.validator

    def origin(self) -> str:
        return self._origin

    def fetch(self, start: int, end: int, read: ReadContext) -> list[bytes] | list[memoryview]:
        """One attempt at bytes [start, end): a GET at the remembered location (``read.fresh``: on a connection
        of its own), through libcurl when it carries this file's range GETs (``curl``: redirects followed here
        by ``Redirects``' rule, the answer judged by ``_judge`` as its headers arrive, its body written in C
        into chunk-sized parts, or into ``read.into``: then the answer is ``[read.into]``), else urllib3
        (``_asked``). A remembered redirect target that refuses (an expired signed CDN URL) is forgotten:
        ``Relocated``, and the retry rule asks the URL again at once.
        The request is sent from here (no helper between): a read's walk down the chain stays one frame per
        part."""
        url = self.location
        try:
            if not self.native:
                return self._asked(url, start, end, read)
            walk = Redirects(url, self.url)
            sent = [f"{k}: {v}" for k, v in ASKED_HEADERS.items()] + [f"Range: bytes={start}-{end - 1}"]
            sent += ["Connection: close"] if read.fresh else []
            cas = curl_cas()
            into = read.into if read.into is not None and read.into.nbytes == end - start else None
            while True:
                hop: list[tuple[int, dict[str, str]]] = []  # a redirect's status and headers
                answered: list[int] = []

                def decide(status: int, reason: str, lines: list[tuple[str, str]]) -> int:
                    answered.append(status)
                    headers = dict(lines)
                    if redirected(status, headers):
                        hop.append((status, headers))
                        return curl.redirect_body(headers)
                    self._judge(status, reason, headers, walk.hops, start, end, read)
                    return curl.TAKE

                auth = [f"{k}: {v}" for k, v in self.credentials.headers] if walk.send_auth else []
                assert curl.native is not None  # self.native: the extension is built
                code, message, got, parts = curl.native.get(
                    walk.url, sent + auth, end - start, decide, read.until, read.until(), self.options.stall_timeout,
                    read.fresh, cas[0], cas[1], "", into, CHUNK)
                try:
                    parts = curl.outcome(walk.url, code, message, got, parts, answered, bool(hop), end - start, read,
                                         self.options)
                except curl.TlsRefused as exc:
                    self.options.counters.request(self.scheme, "error")
                    raise CheckpointError(walk.url, None, tls_refusal(exc.verify, exc.detail, exc.other_host)) \
                        from None
                if parts is not None or (into is not None and not hop):
                    if walk.url != url:
                        self.location = walk.url
                    if parts is not None:
                        return parts
                    assert into is not None
                    return [into]  # (the body was written into the buffer lent)
                if not hop:
                    raise Retryable("the answer's body was dropped")  # not reached: decide takes or raises
                self.options.counters.request(self.scheme, "ok")
                walk.follow(*hop[0])
        except Retryable:
            self.location = self.url  # a remembered CDN host that fails: the retry resolves the URL again
            raise
        except CheckpointError as exc:
            if url == self.url:
                raise
            self.location = self.url
            raise Relocated(exc) from None

    def _asked(self, url: str, start: int, end: int, read: ReadContext) -> list[bytes]:
        """``fetch``'s GET through urllib3, where libcurl does not carry it."""
        answer = self.http.send("GET", url, {"Range": f"bytes={start}-{end - 1}"}, read.deadline, self.url,
                                read.fresh)
        return self._answered(answer, url, start, end, read)

    def _answered(self, answer: Answer, url: str, start: int, end: int, read: ReadContext) -> list[bytes]:
        """The bytes of ``answer`` to the GET of [start, end) at ``url`` (urllib3's), or an OddAnswer /
        Retryable / Changed / CheckpointError (its body dropped unread, its connection closed for an odd one)."""
        resp = answer.resp
        try:
            self._judge(resp.status, resp.reason or "", resp.headers, answer.hops, start, end, read)
        except OddAnswer:
            _discard(resp)
            raise
        except BaseException:
            _finish_small(resp)
            raise
        if answer.url != url:
            self.location = answer.url
        return self._read_parts(resp, end - start, read.until)

    def _judge(self, status: int, reason: str, headers: Mapping[str, str], hops: list[Mapping[str, str]],
               start: int, end: int, read: ReadContext) -> None:
        """Whether the answer to the GET of [start, end) (its status and headers, the redirects' headers on
        the way) is those bytes of the file opened: returns when it is, else raises an OddAnswer (see
        ``odd``), or the status's error. Whichever client asked, before any of its body is read."""
        if status == 206:
            try:
                got = _content_range(headers, self.name)
            except CheckpointError as exc:
                raise OddAnswer(("content-range", headers.get("content-range")), exc) from None
            if got[2] is not None and got[2] != self.size:
                raise OddAnswer(("total", got[2]), Changed(f"its size is now {got[2]} bytes, was {self.size}"))
            self._check_validator(headers, hops)
            read.answered()  # the bytes' version is fixed: a version check from now on covers them
            if got[0] != start or got[1] != end - 1:
                raise OddAnswer(("range", got[0], got[1]), CheckpointError(
                    self.name, start, f"asked for bytes {start}-{end - 1}, the server sent {got[0]}-{got[1]}"))
        elif status == 200:
            length = headers.get("content-length")
            whole = length is not None and length.isdigit() and int(length) == self.size
            if not (whole and start == 0 and end == self.size):
                if whole or length is None:
                    raise OddAnswer(("200", length), CheckpointError(
                        self.name, start, "the server does not support Range requests (it answered 200 with the "
                                          "whole file)"))
                raise OddAnswer(("200", length),
                                Changed(f"the server answered 200 with {length} bytes, the file had {self.size}"))
            self._check_validator(headers, hops)
            read.answered()
        elif status == 416:
            raise OddAnswer(("416",), Changed("the byte range is no longer satisfiable (HTTP 416)"))
        else:
            raise status_error(self.name, start, status, reason, self.credentials, headers, self.options.counters,
                               self.scheme)

    def _check_validator(self, headers: Mapping[str, str], hops: list[Mapping[str, str]]) -> None:
        now = _validator(headers)
        if self.validator is None or now is None or now == self.validator:
            return
        if self.sha256 is not None and _linked_sha256(hops) == self.sha256:
            # Resolved again through the Hub, which vouches for the same content (its LFS sha256): another
            # CDN's ETag for the same bytes. Later reads compare with this one.
            self.validator = now
            return
        raise OddAnswer(("validator", now), Changed(f"validator {now} differs from {self.validator}"))

    def read_body(self, resp: BaseHTTPResponse, expected: int, deadline: float) -> bytes:
        """Exactly ``expected`` body bytes; each wait bounded by the stall timeout, the whole by ``deadline``."""
        return joined(self._read_parts(resp, expected, lambda: deadline))

    def _read_parts(self, resp: BaseHTTPResponse, expected: int, until: Callable[[], float]) -> list[bytes]:
        """``read_body``'s bytes as consecutive parts of ``CHUNK`` bytes (the last shorter), read so that no
        socket read crosses a chunk boundary: a chunk that arrives in one read is kept as it came, and one
        that arrives in several is joined once. A range's bytes then reach the chunk cache with at most one
        copy after the socket's, instead of read in pieces, joined and cut into chunks again (two copies of
        every byte, a quarter of a cold stream's CPU). Each socket wait is bounded by the stall timeout and
        the whole by ``until()``, asked at every wait (``ReadContext.until``: an outage found meanwhile ends
        the body's wait too)."""
        import urllib3

        parts: list[bytes] = []
        pending: list[bytes] = []  # the pieces of the chunk being read
        filled = got = 0
        sock = getattr(getattr(resp, "connection", None), "sock", None)  # probe: third-party (urllib3's response)
        try:
            while got < expected:
                wait, by_deadline = wait_bound(self.options, until())
                if wait <= 0:
                    raise Retryable(f"had received {got} of {expected} bytes", deadline=True)
                if sock is not None:
                    sock.settimeout(wait)
                try:
                    piece = resp.read1(min(CHUNK - filled, expected - got), decode_content=False)
                except (TimeoutError, urllib3.exceptions.TimeoutError):
                    if by_deadline:
                        raise Retryable(f"had received {got} of {expected} bytes", deadline=True) from None
                    raise stalled("the body stalled", self.options, f" after {got} of {expected} bytes") from None
                except (urllib3.exceptions.HTTPError, OSError) as exc:
                    raise Retryable(f"connection broken after {got} of {expected} bytes: "
                                    f"{_reason(exc)}") from None
                if not piece:
                    raise Retryable(f"short body: {got} of {expected} bytes")
                pending.append(piece)
                got += len(piece)
                filled += len(piece)
                if filled == CHUNK or got >= expected:
                    parts.append(pending[0] if len(pending) == 1 else b"".join(pending))
                    pending, filled = [], 0
        except BaseException:
            _discard(resp)
            raise
        if got > expected:
            _discard(resp)
            raise Retryable(f"long body: more than {expected} bytes")
        resp.release_conn()
        return parts


def _tail_range(headers: Mapping[str, str]) -> tuple[int, int] | None:
    """(its length, the file's size) of a 206 answer's ``Content-Range`` that is a file's last bytes, at most
    ``SAMPLE_BYTES`` of them; None for any other."""
    got = content_range(headers.get("content-range"))
    if got is None or got[2] is None or got[1] != got[2] - 1 or got[1] + 1 - got[0] > SAMPLE_BYTES:
        return None
    return got[1] + 1 - got[0], got[2]


class _TailAhead:
    """A file's last ``SAMPLE_BYTES`` asked as a suffix range (``bytes=-4096``) on a thread, beside the probe that
    learns the file's size: the sample a weak validator needs (``weak_validator``) then costs an open no round
    trip of its own. Best effort: an answer that is not the probed file's last bytes (another size or
    validator, another range, an error) or none within ``take``'s wait is dropped, and the open asks for them
    after the probe as before. For a file whose validator turns out strong, the answer is not used: one small
    request more per open."""

    def __init__(self, source: HttpRange, deadline: float) -> None:
        self._source = source
        self._answer: tuple[int, str | None, bytes] | None = None  # (the file's size, its validator, the bytes)
        self._thread = threading.Thread(target=self._ask, args=(deadline,), name="ckptfs-tail-sample", daemon=True)
        self._thread.start()

    def _ask(self, deadline: float) -> None:
        source = self._source
        try:
            answer = self._asked_curl(deadline) if source.native else self._asked(deadline)
        except (CheckpointError, Retryable) as exc:
            log.debug("%s: the tail sample beside the probe: %s", public_name(source.name), exc)
            return
        if answer is not None:
            source.options.counters.request(source.scheme, "ok", len(answer[2]))
            self._answer = answer

    def _asked(self, deadline: float) -> tuple[int, str | None, bytes] | None:
        """The suffix range through urllib3: (the file's size, its validator, the bytes), or None."""
        source = self._source
        answer = source.http.send("GET", source.url, {"Range": f"bytes=-{SAMPLE_BYTES}"}, deadline, source.url)
        resp = answer.resp
        got = _tail_range(resp.headers) if resp.status == 206 else None
        if got is None:
            _finish_small(resp)  # (a 200 of the whole file has no small length: its connection is closed)
            return None
        return got[1], _validator(resp.headers), source.read_body(resp, got[0], deadline)

    def _asked_curl(self, deadline: float) -> tuple[int, str | None, bytes] | None:
        """The suffix range through libcurl (as every range GET where it is built), redirects followed by
        ``Redirects``' rule: (the file's size, its validator, the bytes), or None (anything but a tail)."""
        source = self._source
        walk = Redirects(source.url, source.url)
        sent = [f"{k}: {v}" for k, v in ASKED_HEADERS.items()] + [f"Range: bytes=-{SAMPLE_BYTES}"]
        cas = curl_cas()
        while True:
            hop: list[tuple[int, dict[str, str]]] = []
            tail: list[tuple[int, str | None]] = []

            def decide(status: int, reason: str, lines: list[tuple[str, str]]) -> int | tuple[int, int]:
                headers = dict(lines)
                if redirected(status, headers):
                    hop.append((status, headers))
                    return curl.redirect_body(headers)
                got = _tail_range(headers) if status == 206 else None
                if got is None:
                    return curl.ABORT
                tail.append((got[1], _validator(headers)))
                return curl.TAKE, got[0]

            auth = [f"{k}: {v}" for k, v in source.credentials.headers] if walk.send_auth else []
            assert curl.native is not None  # source.native: the extension is built
            code, _, _, parts = curl.native.get(walk.url, sent + auth, SAMPLE_BYTES, decide, lambda: deadline,
                                                deadline, source.options.stall_timeout, False, cas[0], cas[1], "",
                                                None, CHUNK)
            if hop:
                walk.follow(*hop[0])
                continue
            if code != 0 or not tail or parts is None:
                return None
            return tail[0][0], tail[0][1], joined(parts) if parts else b""

    def take(self, probe: Probe, wait: float) -> bytes | None:
        """The sample, when its answer came within ``wait`` seconds more and is the probed file's."""
        self._thread.join(wait)
        answer = self._answer
        if answer is None:
            return None
        size, validator, body = answer
        if size != probe.size or validator != probe.validator or len(body) != min(SAMPLE_BYTES, probe.size):
            return None
        return body


def _origin_of(url: str) -> str:
    """Scheme and host of ``url`` (no user info): whose in-flight limit a request counts against."""
    where = urlsplit(url)
    return f"{where.scheme}://{where.netloc.rpartition('@')[2]}"


def _mtime_ns(headers: Mapping[str, str]) -> int:
    try:
        return int(email.utils.parsedate_to_datetime(headers.get("last-modified", "")).timestamp() * 1e9)
    except (TypeError, ValueError):
        return 0


def _validator(headers: Mapping[str, str]) -> str | None:
    return headers.get("etag") or headers.get("last-modified")


_NGINX_ETAG = re.compile(r'^"([0-9a-f]{1,16})-([0-9a-f]{1,16})"$')


def weak_validator(validator: str | None, size: int) -> bool:
    """Whether ``validator`` may stay the same when the file is replaced by another of the same size: none at
    all, a weak ETag (``W/``), a Last-Modified date (one-second resolution), or nginx's ETag, which is the
    modification time in seconds and the size (``"<hex mtime>-<hex size>"``). Such a source re-checks the
    file's last bytes after every fetch (``version.VersionPin``). A content ETag (S3's MD5, the
    Hub's sha256) or one with finer times (Apache's microseconds) is trusted as it is."""
    if not validator:
        return True
    if validator.startswith("W/") or not validator.startswith('"'):
        return True  # weak, or a date (Last-Modified)
    match = _NGINX_ETAG.match(validator)
    return match is not None and int(match[2], 16) == size


def _linked_sha256(hop_headers: Iterable[Mapping[str, str]]) -> str | None:
    """The Hub's LFS oid (``X-Linked-Etag``: the file's sha256) when a response carries one."""
    for headers in hop_headers:
        value = (headers.get("x-linked-etag") or "").strip().strip('"')
        if value.startswith("W/"):
            value = value[2:].strip('"')
        if _SHA256.match(value.lower()):
            return value.lower()
    return None


def _content_range(headers: Mapping[str, str], name: str) -> tuple[int, int, int | None]:
    got = content_range(headers.get("content-range"))
    if got is None:
        raise CheckpointError(name, None, f"partial answer without a usable Content-Range "
                                          f"({headers.get('content-range')!r})")
    return got


def open_http(src: str, options: RemoteOptions | None = None) -> HttpSource:
    url, credentials = basic_auth(src)
    return HttpSource(url, credentials, options, name=src)  # the name keeps the user info: the pool reopens by it


register_scheme("http", open_http)
register_scheme("https", open_http)
