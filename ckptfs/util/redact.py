"""Secrets in URLs never leave the process: the one place a source URL is parsed, and the one form it is
shown in.

A URL's user info (``user:password@``) and its query (a presigned URL's ``X-Amz-Signature=...``) are
credentials. A URL is split once, by the standard library's rules (:func:`split_source`, ``urlsplit``): the
authority ends at the first ``/``, ``?`` or ``#``; within it the **last** ``@`` ends the user info (so
``bob@example.com:pw@host`` is user ``bob@example.com``, password ``pw``); the **first** ``:`` of the user
info ends the user; both are percent-decoded (``%40`` is ``@``). HTTP Basic auth (``sources.remote.http``)
takes its user and password from that split, and everything shown is built from it:

- :func:`public_name` is THE shown form of a source: a path as it is; a URL as ``scheme://host[:port]/path``
  with its user info left out and its query and fragment, if any, replaced by ``?…`` (two presigned URLs of
  one object read as the same file). Error messages (``CheckpointError``), ``ckptfs info``, a tensor's
  ``meta.json`` ``source``, the mount's ``fsname`` (``/proc/mounts``, ``fusermount3``'s command line), the
  ``ckptfs_info{source}`` metric label and ``ckptfs stats`` all show it.
- :func:`strip_url` is that same form without the ``?…`` marker: the name a record keeps (a manifest's file
  names, a mount's file names, the store's name records), so a URL re-signed later still finds it.
- :func:`redact` is the same for free text (a log line, a message, an argument): every URL in it is replaced
  by its public name, and every ``/path?query`` (urllib3 logs the request line, not the URL) loses its query.
  Every log line (``service.logs``), every command's one-line error and the command line (:func:`hide_in_argv`)
  go through it.

A password with a raw ``/``, ``?`` or ``#`` (RFC 3986 wants them percent-encoded: ``%2F``) ends the authority
early by those rules, leaving a port that is not a number and an ``@`` after it: such a URL shows its host
name only, and hides everything after it.

The internal name of a source keeps its secrets (the pool reopens a file by it); only what leaves is
redacted.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://")
# in free text: a URL (up to a space or quote), or an absolute path with a query (urllib3's request line)
_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>]*|(?<![\w.])/[^\s?#\"'<>]*[?#][^\s\"'<>]+")
HIDDEN = "?…"


@dataclass(frozen=True)
class SourceURL:
    """A URL split once (see the module docstring). ``host``: the authority without user info, as written
    (``host:port``); ``user``/``password``: percent-decoded, None when absent; ``readable``: False for a user
    info cut short (module docstring): then only ``hostname`` may be shown."""

    scheme: str
    user: str | None
    password: str | None
    host: str
    hostname: str
    path: str
    query: str
    fragment: str
    readable: bool

    @property
    def has_userinfo(self) -> bool:
        return self.user is not None

    def without_userinfo(self) -> str:
        """The URL as given to the origin: user info left out, query and fragment kept."""
        return (f"{self.scheme}://{self.host}{self.path}" + (f"?{self.query}" if self.query else "")
                + (f"#{self.fragment}" if self.fragment else ""))

    def bare(self) -> str:
        """``scheme://host/path``: no user info, query or fragment (``strip_url``)."""
        if not self.readable:
            return f"{self.scheme}://{self.hostname}:…"
        return f"{self.scheme}://{self.host}{self.path}"

    def shown(self) -> str:
        """The public name (see :func:`public_name`)."""
        if not self.readable:
            return self.bare()
        return self.bare() + (HIDDEN if self.query or self.fragment else "")


def split_source(src: str) -> SourceURL | None:
    """``src`` split as a URL by the standard library's rules (see the module docstring); None for a path (no
    ``scheme://``)."""
    if not _SCHEME.match(src):
        return None
    scheme, _, after = src.partition("://")
    try:
        parts = urlsplit(src)
        netloc = parts.netloc
        path, query, fragment = parts.path, parts.query, parts.fragment
    except ValueError:  # a bracketed host the standard library refuses: show no part of the authority
        netloc = re.split(r"[/?#]", after, maxsplit=1)[0]
        path = query = fragment = ""
    userinfo, at, host = netloc.rpartition("@")
    user = password = None
    if at:
        raw_user, colon, raw_password = userinfo.partition(":")
        user, password = unquote(raw_user), (unquote(raw_password) if colon else None)
    hostname, readable = host, True
    if "@" in path + query + fragment:  # a user info cut short by a raw "/", "?" or "#" in its password?
        try:
            urlsplit(f"{scheme}://{host}").port  # noqa: B018 - the standard library's own check of the port
        except ValueError:
            hostname, readable = host.partition(":")[0] if not host.startswith("[") else "[…]", False
    return SourceURL(scheme, user, password, host, hostname, path, query, fragment, readable)


def public_name(src: str) -> str:
    """``src`` as everything shown shows it: a URL without its user info, its query and fragment as ``?…``;
    a path as it is."""
    url = split_source(src)
    return src if url is None else url.shown()


def strip_url(src: str) -> str:
    """The public name without the ``?…`` marker (a path as it is): the name a record keeps."""
    url = split_source(src)
    return src if url is None else url.bare()


def redact(text: str) -> str:
    """``text`` with every URL in it replaced by its public name, and the query of every ``/path?...``
    hidden (see the module docstring). Text without ``@``, ``?``, ``#`` or ``://`` is returned as it is."""
    if "@" not in text and "?" not in text and "#" not in text and "://" not in text:
        return text

    def one(match: re.Match[str]) -> str:
        found = match[0]
        if "://" in found:
            return public_name(found)
        return re.split(r"[?#]", found, maxsplit=1)[0] + HIDDEN

    return _IN_TEXT.sub(one, text)


def hide_in_argv() -> bool:
    """Rewrite this process's command line (``/proc/PID/cmdline``, what ``ps`` shows to every user) with each
    argument redacted, for the life of the process and of every child forked after. True if it changed.

    CPython keeps its own copy of ``sys.argv``; the kernel shows the original argument area, which is
    overwritten in place through ``/proc/self/mem`` (a process may always write its own memory). Best
    effort: False where that is not possible (not Linux, a kernel that forbids it). A redacted argument
    longer than the original (``?x`` shown as ``?…``) is cut to fit the area.
    """
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rpartition(b")")[2].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49 of stat)
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            area = mem.read(end - start)
            args = area.rstrip(b"\0").split(b"\0")
            shown = [os.fsencode(redact(os.fsdecode(arg))) for arg in args]
            if shown == args:
                return False
            new = b"\0".join(shown)[:len(area) - 1] + b"\0"
            mem.seek(start)
            mem.write(new + b"\0" * (len(area) - len(new)))
        return True
    except (OSError, ValueError, IndexError):
        return False
