"""``hf://ORG/REPO[@REV]/PATH`` files and ``hf://ORG/REPO[@REV]`` model folders on the Hugging Face Hub.

A file is its resolve URL, ``{HF_ENDPOINT or https://huggingface.co}/ORG/REPO/resolve/{REV or main}/PATH``,
read as any ``http(s)`` source (``http.HttpSource``): range GETs, the Hub's redirect to its CDN followed by
hand with the token dropped on the way, the CDN location remembered for later reads. A PATH ending in
``.gguf``, ``.safetensors`` or ``.json`` names a file without any API call. The file's content identity is
the LFS sha256 the Hub sends as ``X-Linked-Etag``, so caches are shared by every copy of the same bytes.

A folder (no PATH, or a PATH without such a suffix) is listed with ``huggingface_hub``'s ``list_repo_tree``
(one level); its files are then ``hf://ORG/REPO@REV/NAME`` sources. A listing the ``--cache-dir`` store
keeps a copy of (``stored``) asks the Hub once: one TCP connection first, since huggingface_hub retries a
refused connection for half a minute; a connection failure is a ``SourceUnavailable`` (the stored listing
serves), an answer that refuses is a ``CheckpointError``. The token comes from ``HF_TOKEN``, else
from ``huggingface_hub``'s login; messages say which one was sent, never its value.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from ckptfs.core.errors import CheckpointError, SourceUnavailable
from ckptfs.sources.registry import register_scheme
from ckptfs.sources.base import Folder
from ckptfs.sources.remote.http import Credentials, HttpSource
from ckptfs.sources.netstats import COUNTERS
from ckptfs.sources.remote.context import once_requested
from ckptfs.sources.remote.options import DEFAULT_STALL_TIMEOUT, RemoteOptions

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
    return f"{endpoint()}/{path.repo}/resolve/{quote(path.rev, safe='')}/{quote(path.path, safe='/')}"


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
    """A folder of a Hub repository, listed through ``huggingface_hub``."""

    def __init__(self, src: str, path: HfPath):
        self.name = src.rstrip("/")
        self.path = path
        self.sha256: dict[str, str] = {}

    def list(self) -> dict[str, int]:
        try:
            from huggingface_hub import HfApi, RepoFile
            from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
        except ImportError:
            raise CheckpointError(self.name, None, "listing a Hub repository needs huggingface_hub (pip install "
                                                   "'ckptfs[remote]'); hf:// files ending in .gguf, .safetensors "
                                                   "or .json do not") from None

        if once_requested() and not _answers(endpoint(), DEFAULT_STALL_TIMEOUT):
            # huggingface_hub retries a refused connection for half a minute: one attempt is asked for here
            COUNTERS.request("hf", "error")
            raise SourceUnavailable(self.name, None, f"cannot list the repository: {endpoint()} does not answer")
        creds = credentials()
        token = creds.headers[0][1].split(" ", 1)[1] if creds.headers else False
        api = HfApi(endpoint=endpoint(), token=token)
        files: dict[str, int] = {}
        try:
            for entry in api.list_repo_tree(self.path.repo, path_in_repo=self.path.path or None,
                                            revision=self.path.revision, recursive=False):
                if not isinstance(entry, RepoFile):
                    continue  # a folder
                name = entry.path.rsplit("/", 1)[-1]
                if name.startswith("."):
                    continue
                files[name] = int(entry.size)
                if entry.lfs is not None:
                    self.sha256[name] = entry.lfs.sha256
        except RepositoryNotFoundError:
            COUNTERS.request("hf", "error")
            raise CheckpointError(self.name, None, f"repository not found or not accessible (sent "
                                                   f"{creds.description})") from None
        except RevisionNotFoundError:
            COUNTERS.request("hf", "error")
            raise CheckpointError(self.name, None, f"revision {self.path.rev!r} not found") from None
        except HfHubHTTPError as exc:
            COUNTERS.request("hf", "error")
            status = getattr(getattr(exc, "response", None), "status_code", None)  # probe: third-party (Hub)
            what = f"HTTP {status}" if status else str(exc).splitlines()[0]
            raise CheckpointError(self.name, None, f"cannot list the repository: {what} (sent "
                                                   f"{creds.description})") from None
        except Exception as exc:
            if not isinstance(exc, OSError) and not _transport_error(exc):
                raise
            COUNTERS.request("hf", "error")  # no answer: it may answer later (a stored listing may serve)
            raise SourceUnavailable(self.name, None, f"cannot list the repository: {exc}") from None
        COUNTERS.request("hf", "ok")
        return files

    def join(self, name: str) -> str:
        return self.path.url(name)


def _transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` is huggingface_hub's HTTP client failing to reach the Hub (a ``TransportError`` of
    httpx, or of the httpx2 that huggingface_hub 2 uses: no connection, a timeout), not an answer."""
    return any(cls.__name__ == "TransportError" and cls.__module__.split(".")[0] in ("httpx", "httpx2")
               for cls in type(exc).__mro__)  # probe: third-party


def _answers(url: str, timeout: float) -> bool:
    """Whether anything takes a connection at ``url``'s host and port: one TCP connection, no retry."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "", port), timeout).close()
    except OSError:
        return False
    return True


def open_hf_folder(src: str) -> HfFolder | None:
    path = parse(src)
    return None if names_file(path) else HfFolder(src, path)


register_scheme("hf", open_hf, open_hf_folder)
