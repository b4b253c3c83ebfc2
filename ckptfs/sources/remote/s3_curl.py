"""``s3://`` range GETs through libcurl (``curl``, ``_curl.c``): the same transfer as ``http(s)://``'s, signed by
libcurl with AWS Signature V4.

What boto3 resolves stays boto3's: where to send the request is the URL boto3 itself gives for a GET of the
object (``generate_presigned_url``, its query left out: the endpoint, path-style or virtual-hosted addressing,
the key's encoding), the signing region is the client's, and the credentials are the client's own (boto3's
chain: environment, profiles, SSO, instance roles), frozen again for every request so that refreshed or
rotated credentials are used from the next request on. libcurl signs (``CURLOPT_AWS_SIGV4``
``aws:amz:REGION:s3`` with the key id and secret); a session's token goes as ``x-amz-security-token``,
signed with the rest, and the payload's hash (the empty body's) as ``x-amz-content-sha256``; no
``User-Agent`` is sent (libcurl signs every header it is given, and AWS's own signers leave that one out).
Without credentials the requests go unsigned, as boto3's do. The CA bundle is botocore's: ``AWS_CA_BUNDLE``,
else ``REQUESTS_CA_BUNDLE``, else OpenSSL's variables or the system's store as for ``https://``; a proxy is
what botocore takes from the environment for that URL (``HTTPS_PROXY``, ``NO_PROXY``...).

The answer's status and headers are judged before any of its body is read, by the caller's ``judge`` (the
same checks as boto3's answers get, ``s3.S3Range``); a body then lands in the chunk-sized parts with one
copy after libcurl's receive buffer, the GIL released for the transfer.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from botocore.utils import get_environ_proxies

from ckptfs.sources.remote.store.chunks import CHUNK
from ckptfs.sources.remote import curl
from ckptfs.sources.remote.context import ReadContext
from ckptfs.sources.remote.http import ASKED_HEADERS
from ckptfs.sources.remote.options import RemoteOptions

#: SHA-256 of an empty body: a GET's payload hash, which S3 wants named in ``x-amz-content-sha256``.
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


class FrozenCredentials(Protocol):
    """botocore's ``ReadOnlyCredentials``: one consistent set, taken for one request."""

    access_key: str
    secret_key: str
    token: str | None


class Credentials(Protocol):
    """botocore's ``Credentials`` (``RefreshableCredentials`` refreshes when frozen near its expiry)."""

    def get_frozen_credentials(self) -> FrozenCredentials: ...


@dataclass(frozen=True)
class S3Target:
    """Where and how an object's range GETs are sent through libcurl (see the module docstring)."""

    url: str
    region: str
    credentials: Credentials | None
    cainfo: str | None
    capath: str | None
    proxy: str

    @classmethod
    def resolve(cls, client: Any, bucket: str, key: str) -> S3Target | None:
        """The target boto3's ``client`` resolves for ``bucket``/``key``, or None where libcurl does not carry
        it (the extension not built, ``CKPTFS_CURL=0``, a URL that is not ``http(s)://``)."""
        if not curl.enabled("https://"):  # before asking boto3 for the URL
            return None
        url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=60)
        url = url.split("?", 1)[0]
        if not curl.enabled(url):
            return None
        credentials = client._get_credentials()  # probe: third-party (botocore's client: the chain's result)
        bundle = os.environ.get("AWS_CA_BUNDLE") or os.environ.get("REQUESTS_CA_BUNDLE")  # botocore's order
        if bundle:
            cainfo, capath = (None, bundle) if os.path.isdir(bundle) else (bundle, None)
        else:
            cainfo, capath = curl.ca_locations({})
        proxy = get_environ_proxies(url).get(url.split(":", 1)[0].lower(), "")
        return cls(url, client.meta.region_name or "us-east-1", credentials, cainfo, capath, proxy)

    def get(self, start: int, end: int, headers: Mapping[str, str], read: ReadContext, fresh: bool,
            judge: Callable[[int, str, Mapping[str, str]], None],
            options: RemoteOptions) -> list[bytes] | list[memoryview]:
        """Bytes [start, end) as chunk-sized parts (or ``[read.into]``, written there): one signed GET with
        ``headers`` besides the range; ``judge(status, reason, headers)`` returns for an answer whose body is
        wanted and raises otherwise (the transfer then ends with its body unread and its connection closed).
        Failures of the transfer are ``curl.outcome``'s."""
        sent = [f"{k}: {v}" for k, v in {**ASKED_HEADERS, **headers}.items() if k != "User-Agent"]
        sent += [f"Range: bytes={start}-{end - 1}", f"x-amz-content-sha256: {EMPTY_SHA256}"]
        sent += ["Connection: close"] if fresh else []
        sigv4 = user = password = None
        if self.credentials is not None:
            frozen = self.credentials.get_frozen_credentials()
            sigv4, user, password = f"aws:amz:{self.region}:s3", frozen.access_key, frozen.secret_key
            if frozen.token:
                sent.append(f"x-amz-security-token: {frozen.token}")
        answered: list[int] = []

        def decide(status: int, reason: str, lines: list[tuple[str, str]]) -> int:
            answered.append(status)
            judge(status, reason, dict(lines))
            return curl.TAKE

        assert curl.native is not None  # resolve() found the extension
        into = read.into if read.into is not None and read.into.nbytes == end - start else None
        code, message, got, parts = curl.native.get(
            self.url, sent, end - start, decide, read.until, read.until(), options.stall_timeout, fresh,
            self.cainfo, self.capath, self.proxy, into, CHUNK, sigv4, user, password)
        taken = curl.outcome(self.url, code, message, got, parts, answered, False, end - start, read, options)
        if taken is None and into is not None:
            return [into]  # (the body went into the landing buffer: ``ReadContext.landing_in``)
        assert taken is not None  # decide takes every body it does not refuse by raising
        return taken
