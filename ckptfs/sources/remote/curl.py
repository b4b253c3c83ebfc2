"""The bulk byte path in C: one range GET through libcurl (``_curl.c``), the GIL released for the transfer.

``http.HttpRange`` (``http(s)://``, ``hf://``) and ``s3_curl.S3Target`` (``s3://``, signed by libcurl) send their
range GETs through ``native.get`` when ``enabled`` says so (the extension is built, the URL is
``http(s)://``) and read the answer with ``outcome``; so do an ``http(s)://`` file's open (its probe, and
the tail sample asked beside it: an answer whose length only its headers say is taken as ``(TAKE, n)``).
The Hub's API calls stay on urllib3, S3's open, HEAD and listing on boto3. The body is copied once,
from libcurl's receive buffer into the ``CHUNK``-sized bytes objects the chunk cache keeps, with no Python
between socket reads; Python is entered once per answer, when its status and headers are in (``decide``:
the range client's checks, which take the body, drop it, or raise, ending the transfer with the body
unread and its connection closed), and every 0.1 s while the body arrives (``read.until``: the read's
deadline, which an outage found meanwhile cuts; Ctrl-C is delivered there). libcurl follows no redirect:
the 3xx comes back to ``decide`` and ckptfs follows it by its own rule. Connecting and every wait for bytes
are bounded by ``--stall-timeout``, the whole by the read's deadline; a body longer than the range asked
for is an error (never a truncation), a shorter one a retryable short body.

``CKPTFS_CURL=0`` keeps every range GET on urllib3 or boto3 (an escape hatch, and the other side of an A/B
measurement). ``counters()`` says how many transfers and body bytes went through libcurl in this process.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.options import RemoteOptions
from ckptfs.sources.remote.origin import Retryable, stalled

try:
    from ckptfs.sources.remote import _curl  # optional C helper (setup.py): without it urllib3 carries every GET
except ImportError:
    _curl = None  # type: ignore[assignment]

#: The extension (``_curl.c``), or None where it is not built: ``http.HttpRange`` calls its ``get`` directly
#: (one frame less on every read's walk down the chain), and ``outcome`` reads the answer.
native = _curl

log = logging.getLogger(__name__)

ENV = "CKPTFS_CURL"
#: What ``decide`` answers for a body: write it into the parts, read and drop it (a redirect's: the
#: connection is kept), or drop it unread (the transfer ends and its connection closes); ``_curl.c``'s values.
TAKE, DRAIN, ABORT = 1, 2, 0
#: A redirect's body up to this many bytes is read and dropped (its connection kept alive), a longer one is not.
DRAIN_BYTES = 65536
_TIMED_OUT = 28  # CURLE_OPERATION_TIMEDOUT: connecting took the whole stall timeout


class TlsRefused(Exception):
    """libcurl refused the server's certificate (``verify``) or could not load the trusted CA certificates:
    no retry can mend it. ``detail`` is libcurl's own words."""

    def __init__(self, verify: bool, detail: str):
        # libcurl's words after its own prefix: OpenSSL's reason, as Python's ssl gives it too
        detail = detail.removeprefix("SSL certificate problem: ")
        super().__init__(detail)
        self.verify = verify
        self.detail = detail

    @property
    def other_host(self) -> bool:
        """The certificate is valid but names another host."""
        return "target host name" in self.detail or "subject name" in self.detail


def enabled(url: str) -> bool:
    """Whether range GETs of ``url`` go through libcurl: the extension is built, ``CKPTFS_CURL`` does not
    turn it off, and the URL is ``http(s)://``."""
    if native is None or os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return urlsplit(url).scheme.lower() in ("http", "https")


def redirect_body(headers: Mapping[str, str]) -> int:
    """What ``decide`` answers for a redirect's body: read and dropped when it is small (``DRAIN_BYTES``: its
    connection is kept for the next request), else dropped unread (``ABORT``: the connection closes)."""
    length = headers.get("content-length")
    return DRAIN if length is not None and length.isdigit() and int(length) <= DRAIN_BYTES else ABORT


def counters() -> tuple[int, int]:
    """(transfers, body bytes) sent through libcurl by this process; (0, 0) without the extension."""
    return (0, 0) if native is None else native.counters()


def ca_locations(urllib3_kwargs: dict[str, str]) -> tuple[str | None, str | None]:
    """The CA file and folder libcurl is handed: OpenSSL's own variables when set (libcurl, unlike Python's
    default context, does not read them), else what ckptfs resolved for urllib3 (``http.trusted_cas``)."""
    file, folder = os.environ.get("SSL_CERT_FILE") or None, os.environ.get("SSL_CERT_DIR") or None
    if file or folder:
        return file, folder
    return urllib3_kwargs.get("ca_certs"), urllib3_kwargs.get("ca_cert_dir")


def outcome(url: str, code: int, message: str, got: int, parts: list[bytes] | None, answered: list[int],
            dropped: bool, want: int, read: ReadContext, options: RemoteOptions) -> list[bytes] | None:
    """What ``native.get``'s answer (``code, message, got, parts``) to a GET of ``want`` bytes at ``url``
    means, ``answered`` holding the status its ``decide`` was called with (none before the headers) and
    ``dropped`` whether it said DRAIN or ABORT: None for a body dropped on purpose (a redirect's), the
    body's parts (None when it went into the caller's buffer), else the failure as a ``Retryable`` (a
    deadline, a stall, a reset, a short or long body) or a ``TlsRefused``. (An exception ``decide`` raised
    ended the transfer and came out of ``native.get`` itself.)"""
    if log.isEnabledFor(logging.DEBUG):  # urllib3's request line, for the -v log (redacted as every line)
        where = urlsplit(url)
        log.debug('%s://%s "GET %s HTTP/1.1" %s %s', where.scheme, where.netloc.rpartition("@")[2],
                  where.path + (f"?{where.query}" if where.query else ""), answered[0] if answered else "-", got)
    assert native is not None
    if dropped or code == 0:
        return None if dropped else parts
    if code in (native.E_TLS_VERIFY, native.E_TLS_CACERT):
        raise TlsRefused(code == native.E_TLS_VERIFY, message.rstrip("."))
    if code == native.E_DEADLINE or (code == _TIMED_OUT and read.until() <= time.monotonic()):
        raise Retryable(f"had received {got} of {want} bytes" if answered else "had no answer yet", deadline=True)
    if code in (native.E_STALL, _TIMED_OUT):
        if answered:
            raise stalled("the body stalled", options, f" after {got} of {want} bytes")
        raise stalled("no answer", options)
    if code == native.E_LONG:
        raise Retryable(f"long body: more than {want} bytes")
    if code == native.E_SHORT:
        raise Retryable(f"short body: {got} of {want} bytes")
    if code == native.E_HEADERS:
        raise Retryable("the answer's headers were over 1 MiB")
    if answered:
        raise Retryable(f"connection broken after {got} of {want} bytes: {message}")
    raise Retryable(f"connection failed: {message}")
