"""``hf://ORG/REPO[@REV]/PATH`` files and ``hf://ORG/REPO[@REV]`` model folders on the Hugging Face Hub.

A file is its resolve URL, ``{HF_ENDPOINT or https://huggingface.co}/ORG/REPO/resolve/{REV or main}/PATH``,
read as any ``http(s)`` source (``http.HttpSource``): range GETs, the Hub's redirect to its CDN followed by
hand with the token dropped on the way, the CDN location remembered for later reads. A PATH ending in
``.gguf``, ``.safetensors`` or ``.json`` names a file without any API call. The file's content identity is
the LFS sha256 the Hub sends as ``X-Linked-Etag``, so caches are shared by every copy of the same bytes.

A folder (no PATH, or a PATH without such a suffix) is listed at the Hub's tree API (one level, the pages
it links), with ``huggingface_hub``'s session, headers and error mapping but one request per page and no
retry, all pages within ``--timeout``: huggingface_hub's own ``list_repo_tree`` retries a dead Hub for half
a minute, logging each retry. No answer in time is a ``SourceUnavailable`` (one line; a listing the
``--cache-dir`` store keeps serves), an answer that refuses is a ``CheckpointError``. Listed names follow the
mount's file-name rules (``util.names.file_name``: ``%XX`` for a NUL and bytes that are not UTF-8, at most
255 bytes); a file listed from a sub-folder takes its last part, and a name taken by an earlier file is
numbered (``~2``) with one log line; each name's file is then its path in the repository
(``hf://ORG/REPO@REV/PATH``). The token comes from ``HF_TOKEN``, else from ``huggingface_hub``'s login;
messages say which one was sent, never its value.
"""

from __future__ import annotations

import builtins
import logging
import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from ckptfs.core.errors import CheckpointError, SourceUnavailable
from ckptfs.sources.registry import register_scheme
from ckptfs.sources.base import Folder
from ckptfs.sources.remote.http import Credentials, HttpSource
from ckptfs.sources.remote.options import DEFAULT_TIMEOUT, RemoteOptions, default_options
from ckptfs.util.names import file_name, numbered_name
from ckptfs.util.jsonutil import JsonRefused, loads
from ckptfs.util.redact import public_name

log = logging.getLogger("ckptfs.sources")

DEFAULT_ENDPOINT = "https://huggingface.co"
_FILE_SUFFIXES = (".gguf", ".safetensors", ".json")


@dataclass(frozen=True)
class HfPath:
    repo: str  # ORG/REPO
    revision: str | None
    path: str  # inside the repository ("" for the root)

    @property
    def rev(self) -> str:
        return self.revision or "main"

    def url(self, name: str | None = None) -> str:
        """The hf:// URL of ``name`` in this folder (or of this path)."""
        at = f"@{self.revision}" if self.revision else ""
        path = "/".join(p for p in (self.path, name) if p)
        return f"hf://{self.repo}{at}" + (f"/{path}" if path else "")


def parse(src: str) -> HfPath:
    rest = src[len("hf://"):] if src.lower().startswith("hf://") else src
    parts = rest.strip("/").split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise CheckpointError(src, None, "not an hf://ORG/REPO[@REV][/PATH] URL")
    repo_name, _, revision = parts[1].partition("@")
    if not repo_name:
        raise CheckpointError(src, None, "not an hf://ORG/REPO[@REV][/PATH] URL")
    return HfPath(f"{parts[0]}/{repo_name}", revision or None, "/".join(parts[2:]))


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def resolve_url(path: HfPath) -> str:
    return f"{endpoint()}/{path.repo}/resolve/{quote(path.rev, safe='')}/{quote(_raw(path.path), safe='/')}"


def credentials() -> Credentials:
    """The Hub token to send (HF_TOKEN, else huggingface_hub's login) and how to name it in messages."""
    token = os.environ.get("HF_TOKEN")
    if token:
        return Credentials((("Authorization", f"Bearer {token}"),), "the token from HF_TOKEN")
    try:
        from huggingface_hub import get_token

        token = get_token()
    except Exception:  # noqa: BLE001 - no login: no token
        token = None
    if token:
        return Credentials((("Authorization", f"Bearer {token}"),), "the token from huggingface_hub's login")
    return Credentials((), "no token (set HF_TOKEN or run `hf auth login`)")


def names_file(path: HfPath) -> bool:
    return path.path.lower().endswith(_FILE_SUFFIXES)


def open_hf(src: str, options: RemoteOptions | None = None) -> HttpSource:
    path = parse(src)
    if not path.path:
        raise CheckpointError(src, None, "names a repository, not a file")
    return HttpSource(resolve_url(path), credentials(), options, name=src, scheme="hf")


class HfFolder(Folder):
    """A folder of a Hub repository, listed at the Hub's tree API (see the module docstring)."""

    def __init__(self, src: str, path: HfPath, options: RemoteOptions | None = None):
        self.name = src.rstrip("/")
        self.path = path
        self.timeout = options.timeout if options is not None else DEFAULT_TIMEOUT
        self.counters = (options or default_options()).counters
        self.sha256: dict[str, str] = {}
        self._paths: dict[str, str] = {}  # listed name -> the file's path in the repository

    def list(self) -> dict[str, int]:
        try:
            from huggingface_hub import get_session
            from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
            from huggingface_hub.utils import build_hf_headers, hf_raise_for_status
        except ImportError:
            raise CheckpointError(self.name, None, "listing a Hub repository needs huggingface_hub (pip install "
                                                   "'ckptfs[remote]'); hf:// files ending in .gguf, .safetensors "
                                                   "or .json do not") from None

        creds = credentials()
        token = creds.headers[0][1].split(" ", 1)[1] if creds.headers else False
        headers = build_hf_headers(token=token)
        deadline = time.monotonic() + self.timeout
        entries: builtins.list[Any] = []
        url: str | None = self._tree_url()
        params: dict[str, Any] | None = {"recursive": False, "expand": False}
        try:
            while url is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                # one request, no retry: huggingface_hub's own listing retries a dead Hub for half a minute
                response = get_session().get(url, headers=headers, params=params, timeout=left)
                hf_raise_for_status(response)
                page = loads(response.content, "the listing")
                if not isinstance(page, list):
                    raise JsonRefused("the listing is not a JSON list")
                entries += page
                url, params = response.links.get("next", {}).get("url"), None
        except JsonRefused as exc:  # an answer, but no listing: as a refusal
            self.counters.request("hf", "error")
            raise CheckpointError(self.name, None, f"cannot list the repository: {exc}") from None
        except RepositoryNotFoundError:
            self.counters.request("hf", "error")
            raise CheckpointError(self.name, None, f"repository not found or not accessible (sent "
                                                   f"{creds.description})") from None
        except RevisionNotFoundError:
            self.counters.request("hf", "error")
            raise CheckpointError(self.name, None, f"revision {self.path.rev!r} not found") from None
        except HfHubHTTPError as exc:
            self.counters.request("hf", "error")
            status = getattr(getattr(exc, "response", None), "status_code", None)  # probe: third-party (Hub)
            what = f"HTTP {status}" if status else str(exc).splitlines()[0]
            raise CheckpointError(self.name, None, f"cannot list the repository: {what} (sent "
                                                   f"{creds.description})") from None
        except Exception as exc:
            if not isinstance(exc, OSError) and not _transport_error(exc):
                raise
            self.counters.request("hf", "error")  # no answer: it may answer later (a stored listing may serve)
            raise SourceUnavailable(self.name, None, f"cannot list the repository: {endpoint()} gave no listing "
                                                     f"within {self.timeout:g} s (--timeout)") from None
        self.counters.request("hf", "ok")
        return self._named(entries)

    def _tree_url(self) -> str:
        rev = quote(self.path.rev, safe="")
        inside = "/" + quote(_raw(self.path.path), safe="") if self.path.path else ""
        return f"{endpoint()}/api/models/{self.path.repo}/tree/{rev}{inside}"

    def _named(self, entries: builtins.list[Any]) -> dict[str, int]:
        """Listed name -> size of the files the listing holds, named as a mount names files (``names.file_name``:
        escaped, within 255 bytes). An entry in a sub-folder is listed by its last part; a name taken by an
        earlier entry is numbered (``~2``) with one log line."""
        files: dict[str, int] = {}
        self._paths, self.sha256 = {}, {}
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("type") != "file" or not isinstance(entry.get("path"), str):
                continue  # a folder, or no file the listing can name
            path = entry["path"]
            last = path.rsplit("/", 1)[-1]
            if not last or last.startswith("."):
                continue
            name = file_name(last)
            n = 1
            while name in files:
                n += 1
                name = numbered_name(file_name(last), n)
            if n > 1:
                log.warning("%s: %s is listed as %s: its name is taken by another file of the listing",
                            public_name(self.name), "/".join(map(file_name, path.split("/"))), name)
            size = entry.get("size")
            files[name] = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else -1
            self._paths[name] = path
            lfs = entry.get("lfs")
            if isinstance(lfs, dict) and isinstance(lfs.get("oid"), str):
                self.sha256[name] = lfs["oid"]
        return files

    def places(self) -> dict[str, str]:
        """Every listed name whose path is not the name unescaped (see ``Folder.places``)."""
        return {name: path for name, path in self._paths.items()
                if unquote(name, errors="surrogateescape") != path}

    def adopt_places(self, places: dict[str, str]) -> None:
        self._paths = dict(places)

    def join(self, name: str) -> str:
        path = self._paths.get(name)
        if path is None:  # not listed by this process (a listing kept in the store): the name unescaped
            return self.path.url(unquote(name, errors="surrogateescape"))
        at = f"@{self.path.revision}" if self.path.revision else ""
        return f"hf://{self.path.repo}{at}/{path}"


def _raw(text: str) -> bytes:
    """``text``'s bytes, a byte that is not UTF-8 (held as a lone surrogate) as that byte, for a URL."""
    return text.encode("utf-8", "surrogateescape")


def _transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` is huggingface_hub's HTTP client failing to reach the Hub (a ``TransportError`` of
    httpx, or of the httpx2 that huggingface_hub 2 uses: no connection, a timeout), not an answer."""
    return any(cls.__name__ == "TransportError" and cls.__module__.split(".")[0] in ("httpx", "httpx2")
               for cls in type(exc).__mro__)  # probe: third-party


def open_hf_folder(src: str, options: RemoteOptions | None = None) -> HfFolder | None:
    path = parse(src)
    return None if names_file(path) else HfFolder(src, path, options)


register_scheme("hf", open_hf, open_hf_folder)
