"""``s3://BUCKET/KEY`` sources and ``s3://BUCKET/PREFIX/`` model folders (boto3, an optional extra).

Endpoint, region and credentials come from the standard AWS environment (``AWS_ENDPOINT_URL``,
``AWS_ENDPOINT_URL_S3``, ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, profiles,
instance roles: whatever boto3 finds); with no credentials at all, requests go unsigned (public buckets).
An S3-compatible endpoint given by address (an IP or ``localhost``: MinIO, Ceph, moto) gets path-style
requests, since virtual-host names cannot resolve there.

Reads are ranged ``GetObject`` calls with ``If-Match`` on the ETag fixed at open, so the server itself
refuses bytes of another version (HTTP 412 -> "changed since it was opened"), and every answer is checked
against what was asked: its ``Content-Range`` (the range, the object's size) and its ``ETag``. An answer
that cannot be the bytes asked for (a 412, another size, range or ETag, a whole object to a ranged GET) is
not believed at once: one node behind the endpoint's load balancer, or a proxy, may be wrong while the
object is not. Its body is dropped unread and the range asked again at once on a client of its own (a
fresh connection, by the retry rule, ``origin.Attempts``); only a second answer wrong the same way decides.
A body cut short is retried like a reset, its connection closed. botocore's own retries are off:
``remote.origin.OriginClient`` retries (counted, with the read's deadline), and each socket wait is bounded
by ``--stall-timeout``. A folder is listed with ``ListObjectsV2`` (one level, hidden names skipped).

The range GETs after the open go through libcurl where its extension is built (``s3_curl``: the URL, region
and credentials as boto3 resolves them, signed by libcurl, the body written in C with the GIL released);
their answers are judged by the same method as boto3's (``S3Range._judge``), and an answer boto3 reads an
error code from (its XML body) or follows (a region's redirect) is asked once more through boto3, whose
answer decides, so every error reads as it does without libcurl. The open's first GET, ``HeadObject`` and
the listing stay on boto3, and ``CKPTFS_CURL=0`` keeps the range GETs there too.
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
from botocore import UNSIGNED
from botocore.config import Config

from ckptfs.core.errors import CheckpointError, SourceUnavailable
from ckptfs.core.runtime import Part
from ckptfs.util.keyed import MadeOnce
from ckptfs.sources.registry import register_scheme
from ckptfs.sources.base import Folder
from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.odd import OddAnswer, content_range
from ckptfs.sources.remote.options import POOL_CONNECTIONS, RemoteOptions, default_options
from ckptfs.sources.remote import curl
from ckptfs.sources.remote.origin import Changed, Retryable, stalled
from ckptfs.sources.remote.s3_curl import S3Target
from ckptfs.sources.remote.transport import OPEN_HEAD_BYTES, RemoteSource

_FILE_SUFFIXES = (".gguf", ".safetensors", ".json")
_RETRY_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "ThrottlingException",
                "TooManyRequests", "RequestTimeTooSkewed"}
#: The answers that mean "fewer requests at once" (ckptfs.ahead.limits halves the in-flight limit).
_THROTTLE_CODES = {"SlowDown", "ServiceUnavailable", "ThrottlingException", "TooManyRequests"}
_DENIED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled",
                 "ExpiredToken", "InvalidToken", "Forbidden", "403", "401"}
_REFUSED = "the object's ETag is not the one it had at open"
_UNSATISFIABLE = "the byte range is no longer satisfiable"


class S3Clients:
    """A runtime's pooled boto3 clients, one per AWS environment and stall timeout (``client_for``)."""

    def __init__(self) -> None:
        self._clients: MadeOnce[tuple[object, ...], tuple[Any, str]] = MadeOnce()

    def get(self, key: tuple[object, ...], make: Callable[[], tuple[Any, str]]) -> tuple[Any, str]:
        """The client kept for ``key``, made by ``make()`` on first use."""
        return self._clients.get(key, make)


#: A runtime's S3 clients; a forked child makes its own (the parent's keep-alive sockets are not shared).
S3_CLIENTS = Part("S3 clients", S3Clients)


def split_url(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    if parts.scheme.lower() != "s3" or not parts.netloc:
        raise CheckpointError(url, None, "not an s3://BUCKET/KEY URL")
    return parts.netloc, parts.path.lstrip("/")


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def _by_address(endpoint: str | None) -> bool:
    host = urlsplit(endpoint).hostname if endpoint else None
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def client_for(options: RemoteOptions, fresh: bool = False) -> tuple[Any, str]:
    """A boto3 S3 client for the current AWS environment and how its credentials are described: the runtime's
    pooled one (``options.runtime``), or with ``fresh`` one of its own with one connection (the re-ask after an odd answer: not on
    a kept-alive connection to the node that gave it; the caller closes it)."""
    endpoint = _endpoint()
    session = boto3.session.Session()
    credentials = session.get_credentials()
    key_id = credentials.access_key if credentials is not None else None
    method = getattr(credentials, "method", None)  # probe: third-party (botocore's credentials)
    stall_timeout = options.stall_timeout
    cache_key = (endpoint, session.region_name, key_id, method, stall_timeout)
    if fresh:
        return _new_client(session, endpoint, credentials, stall_timeout, 1)
    return options.runtime.get(S3_CLIENTS).get(
        cache_key, lambda: _new_client(session, endpoint, credentials, stall_timeout, POOL_CONNECTIONS))


def _new_client(session: Any, endpoint: str | None, credentials: Any, stall_timeout: float,
                connections: int) -> tuple[Any, str]:
    settings = {"retries": {"total_max_attempts": 1}, "connect_timeout": stall_timeout,
                "read_timeout": stall_timeout, "max_pool_connections": connections}
    if _by_address(endpoint):
        settings["s3"] = {"addressing_style": "path"}
    if credentials is None:
        settings["signature_version"] = UNSIGNED
        described = "no credentials (unsigned requests)"
    else:
        key_id = credentials.access_key
        shown = f"{key_id[:4]}…" if key_id else "?"
        described = f"AWS credentials from {credentials.method} (access key {shown})"
    return session.client("s3", endpoint_url=endpoint, config=Config(**settings)), described


def _error(exc: botocore.exceptions.ClientError) -> tuple[str, int]:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return str(error.get("Code", status)), int(status or 0)


class S3Source(RemoteSource):
    """One S3 object, read with ranged GetObject (see the module docstring)."""

    scheme = "s3"
    piece_bytes = 8 << 20  # S3's guidance for ranged GETs: 8-16 MB a request
    range: S3Range

    def __init__(self, url: str, options: RemoteOptions | None = None):
        options = options if options is not None else default_options()
        self.bucket, self.key = split_url(url)
        if not self.key:
            raise CheckpointError(url, None, "names a bucket, not an object (a folder is s3://BUCKET/PREFIX/)")
        client, self.credentials = client_for(options)
        super().__init__(url, options, S3Range(url, self.bucket, self.key, client, self.credentials, options))
        read = self.options.opening()
        size, etag, head = self.client.retrying(self._probe, read, None, "cannot open: ")
        self.range.size, self.range.validator = size, etag
        self._set_identity(size, etag, url)
        self._keep_prefix(head)

    def origin(self) -> str:
        return self.range.origin()

    def _probe(self, read: ReadContext) -> tuple[int, str | None, bytes]:
        first = OPEN_HEAD_BYTES if self.options.cache_dir else self.initial_read
        try:
            resp = self.range.call("get_object", None, Range=f"bytes=0-{first - 1}")
        except Changed:  # InvalidRange on the first byte: an empty object
            head = self.range.call("head_object", None)
            self.options.counters.request(self.scheme, "ok")
            return int(head["ContentLength"]), head.get("ETag"), b""
        total = _total(resp.get("ContentRange"), int(resp["ContentLength"]))
        data = self.range.read_body(resp["Body"], int(resp["ContentLength"]), lambda: read.deadline)
        self.options.counters.request(self.scheme, "ok", len(data))
        return total, resp.get("ETag"), data

class S3Range:
    """The ``s3://`` range client (``ranges.RangeClient``): one ranged GetObject of the object, with
    ``If-Match`` its ETag as opened (see the module docstring)."""

    scheme = "s3"

    def __init__(self, name: str, bucket: str, key: str, client: Any, credentials: str, options: RemoteOptions):
        self.name = name
        self.bucket, self.key = bucket, key
        self._client = client
        self.credentials = credentials
        self.options = options
        self.size = 0
        self.validator: str | None = None
        #: where libcurl sends the range GETs (``s3_curl``): None until the first, False where boto3 carries them
        self.target: S3Target | Literal[False] | None = None

    def origin(self) -> str:
        return f"s3://{_endpoint() or 'aws'}/{self.bucket}"  # S3 scales (and throttles) per bucket prefix

    def call(self, what: str, offset: int | None, client: Any = None, **kwargs: Any) -> Any:
        """One GetObject/HeadObject (on ``client``, default the pooled one); failures mapped to Retryable /
        Changed / one-line CheckpointError."""
        try:
            return getattr(client or self._client, what)(Bucket=self.bucket, Key=self.key, **kwargs)
        except botocore.exceptions.ClientError as exc:
            code, status = _error(exc)
            if code in ("PreconditionFailed", "412"):
                raise Changed(_REFUSED) from None
            if code in _RETRY_CODES or status == 429 or status >= 500:
                raise Retryable(f"S3 {code} (HTTP {status})", throttled=code in _THROTTLE_CODES or status in (429, 503)) from None
            self.options.counters.request(self.scheme, "error")
            if code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound"):
                raise CheckpointError(self.name, offset, f"not found (S3 {code})") from None
            if code in _DENIED_CODES or status in (401, 403):
                raise CheckpointError(self.name, offset, f"access denied (S3 {code}; sent {self.credentials})") from None
            if code in ("InvalidRange", "416"):
                raise Changed(_UNSATISFIABLE) from None
            raise CheckpointError(self.name, offset, f"S3 {code} (HTTP {status})") from None
        except (botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectTimeoutError):
            raise stalled("no answer", self.options) from None
        except botocore.exceptions.NoCredentialsError:
            raise CheckpointError(self.name, offset, "no AWS credentials found") from None
        except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectionError,
                botocore.exceptions.HTTPClientError) as exc:
            raise Retryable(f"connection failed: {exc}") from None

    def fetch(self, start: int, end: int, read: ReadContext) -> bytes | list[bytes] | list[memoryview]:
        """One attempt at bytes [start, end), a ranged GetObject (``read.fresh``: on a connection of its own,
        after an odd answer): exactly the bytes asked for, or an OddAnswer for an answer that cannot be them
        (its body dropped unread, see the module docstring); through libcurl where it carries them
        (``s3_curl``), else boto3."""
        fresh = read.fresh
        extra = {"IfMatch": self.validator} if self.validator else {}
        if self.target is None:
            self.target = S3Target.resolve(self._client, self.bucket, self.key) or False
        if self.target:
            return self._native(self.target, start, end, read, fresh, extra)
        client = client_for(self.options, fresh=True)[0] if fresh else None
        try:
            try:
                resp = self.call("get_object", start, client, Range=f"bytes={start}-{end - 1}", **extra)
            except Changed as exc:  # 412 (If-Match refused) or 416
                raise OddAnswer(("refused", str(exc)), exc) from None
            body = resp["Body"]
            try:
                self._judge(start, end, resp.get("ContentRange"), resp.get("ContentLength"), resp.get("ETag"), read)
            except OddAnswer:
                body.close()
                raise
            return self.read_body(body, end - start, read.until)
        finally:
            if client is not None:
                client.close()

    def _native(self, target: S3Target, start: int, end: int, read: ReadContext, fresh: bool,
                extra: dict[str, str]) -> list[bytes] | list[memoryview]:
        """``fetch``'s GetObject through libcurl. An answer boto3 would read an error code from (its XML body), or
        follow (a region's redirect), is asked once more through boto3, whose answer decides: the same
        one-line error as without libcurl."""
        def judge(status: int, reason: str, headers: Mapping[str, str]) -> None:
            if status in (200, 206):
                self._judge(start, end, headers.get("content-range"), headers.get("content-length"),
                            headers.get("etag"), read)
            elif status == 412:
                raise OddAnswer(("refused", _REFUSED), Changed(_REFUSED))
            elif status == 416:
                raise OddAnswer(("refused", _UNSATISFIABLE), Changed(_UNSATISFIABLE))
            elif status == 429 or status >= 500:
                raise Retryable(f"S3 HTTP {status} {reason}".rstrip(), throttled=status in (429, 503))
            else:
                raise _AskBoto(status)

        try:
            return target.get(start, end, {"If-Match": extra["IfMatch"]} if extra else {}, read, fresh, judge,
                              self.options)
        except curl.TlsRefused as exc:
            self.options.counters.request(self.scheme, "error")
            trusted = target.cainfo or target.capath or "the system's CA store"
            what = "TLS certificate verify failed" if exc.verify else "cannot load the trusted CA certificates"
            raise CheckpointError(self.name, start, f"{what}: {exc.detail} (trusted: {trusted})") from None
        except _AskBoto as answer:
            resp = self.call("get_object", start, None, Range=f"bytes={start}-{end - 1}", **extra)  # raises its error
            resp["Body"].close()
            self.target = None  # resolved again: boto3 may have learnt the bucket's region meanwhile
            raise Retryable(f"S3 answered HTTP {answer.status} to libcurl, then not to boto3") from None

    def _judge(self, start: int, end: int, content_range_header: str | None, length: object, etag: str | None,
               read: ReadContext) -> None:
        """Whether an answer (its ``Content-Range``, length and ``ETag``), whichever client got it, is bytes
        [start, end) of the object opened: returns when it is, else raises an OddAnswer."""
        got = content_range(content_range_header)
        if got is None:
            raise OddAnswer(("whole", str(length)), CheckpointError(
                self.name, start, "the server does not support Range requests (it answered a ranged GetObject "
                                  "without a usable Content-Range)"))
        first, last, total = got
        if total is not None and total != self.size:
            raise OddAnswer(("total", total), Changed(f"its size is now {total} bytes, was {self.size}"))
        if self.validator and etag and etag != self.validator:
            raise OddAnswer(("etag", etag), Changed(f"its ETag is now {etag}, was {self.validator}"))
        read.answered()
        if (first, last) != (start, end - 1):
            raise OddAnswer(("range", first, last), CheckpointError(
                self.name, start, f"asked for bytes {start}-{end - 1}, the server sent {first}-{last}"))

    def read_body(self, body: Any, expected: int, until: Callable[[], float]) -> bytes:
        """Exactly ``expected`` bytes of ``body``, by ``until()`` (asked before each piece:
        ``ReadContext.until``)."""
        buf = bytearray()
        try:
            while len(buf) < expected:
                if time.monotonic() >= until():
                    raise Retryable(f"had received {len(buf)} of {expected} bytes", deadline=True)
                chunk = body.read(min(64 * 1024, expected - len(buf)))
                if not chunk:
                    raise Retryable(f"short body: {len(buf)} of {expected} bytes")
                buf += chunk
        except (botocore.exceptions.ReadTimeoutError, TimeoutError):
            body.close()
            raise stalled("the body stalled", self.options, f" after {len(buf)} of {expected} bytes") from None
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            body.close()
            raise Retryable(f"connection broken after {len(buf)} of {expected} bytes: {exc}") from None
        except Retryable:
            body.close()
            raise
        return bytes(buf)


class _AskBoto(Exception):
    """An answer to a libcurl GET that boto3 reads better (``S3Range._native``)."""

    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.status = status


def _total(content_range: str | None, length: int) -> int:
    """The object's size from a ``Content-Range``'s total, else ``length`` (an answer with the whole object)."""
    if content_range and "/" in content_range:
        tail = content_range.rsplit("/", 1)[1].strip()
        if tail.isdigit():
            return int(tail)
    return length


class S3Folder(Folder):
    """``s3://BUCKET/PREFIX/``: the objects directly under the prefix."""

    def __init__(self, url: str, bucket: str, prefix: str, options: RemoteOptions | None = None):
        self.name = url
        self.bucket = bucket
        self.prefix = prefix
        options = options or default_options()
        self._client, self.credentials = client_for(options)
        self._counters = options.counters

    def list(self) -> dict[str, int]:
        files: dict[str, int] = {}
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix,
                                                                                Delimiter="/"):
                self._counters.request("s3", "ok")
                for item in page.get("Contents", []):
                    name = item["Key"][len(self.prefix):]
                    if name and not name.startswith(".") and "/" not in name:
                        files[name] = int(item["Size"])
        except botocore.exceptions.ClientError as exc:
            code, status = _error(exc)
            self._counters.request("s3", "error")
            if code in _DENIED_CODES or status in (401, 403):
                raise CheckpointError(self.name, None, f"cannot list: access denied (S3 {code}; sent "
                                                       f"{self.credentials})") from None
            if status >= 500 or status == 429 or code in _THROTTLE_CODES:  # it may answer later
                raise SourceUnavailable(self.name, None, f"cannot list: S3 {code} (HTTP {status})") from None
            raise CheckpointError(self.name, None, f"cannot list: S3 {code} (HTTP {status})") from None
        except (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError) as exc:
            # no connection (endpoint, connect timeout) or a broken one (read timeout): not reached, so a
            # stored listing may stand in (sources/remote/stored.py)
            self._counters.request("s3", "error")
            raise SourceUnavailable(self.name, None, f"cannot list: {exc}") from None
        except botocore.exceptions.BotoCoreError as exc:
            self._counters.request("s3", "error")
            raise CheckpointError(self.name, None, f"cannot list: {exc}") from None
        return files

    def join(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{name}"


def open_s3(src: str, options: RemoteOptions | None = None) -> S3Source:
    return S3Source(src, options)


def open_s3_folder(src: str, options: RemoteOptions | None = None) -> S3Folder | None:
    """A folder for ``s3://BUCKET/PREFIX/`` (or a bucket); a key with a checkpoint suffix names a file."""
    bucket, key = split_url(src)
    if key.lower().endswith(_FILE_SUFFIXES):
        return None
    if key and not key.endswith("/"):
        folder = S3Folder(src.rstrip("/") + "/", bucket, key + "/", options)
        return folder if folder.list() else None  # a key without a suffix: a folder only if it holds files
    return S3Folder(src if src.endswith("/") else src + "/", bucket, key, options)


register_scheme("s3", open_s3, open_s3_folder)
