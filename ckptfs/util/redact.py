"""Secrets in URLs never leave the process: the one place that strips them from what is shown or recorded.

A URL's user info (``user:password@``) and its query (a presigned URL's ``X-Amz-Signature=...``) are
credentials. Everything a user or another user can see goes through here: error messages
(``CheckpointError``), every log line (``fs.logs`` formats through :func:`redact`, urllib3's and botocore's
lines included), the mount table and the daemon's command line (:func:`hide_in_argv`), ``ckptfs info`` /
``bench`` output, the file names a manifest records and a tensor's ``meta.json`` ``source``.

- :func:`public_name` is a source (a path or one URL) as it may be shown: a URL without user info, its
  query replaced by ``?…`` (so two presigned URLs of one object still read as the same file).
- :func:`redact` is the same for free text (a log line, a message): every URL in it, and every
  ``/path?query`` (urllib3 logs the request line, not the URL).
- :func:`strip_url` is a URL without user info, query and fragment (a name to record: manifests).

The internal name of a source keeps its secrets (the pool reopens a file by it); only what leaves is
redacted.
"""

from __future__ import annotations

import os
import re

# scheme://[userinfo@]host/path[?query][#fragment]
_URL = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^/?#@]*@)?(?P<rest>[^?#]*)(?P<query>[?#].*)?$", re.S)
# in free text: user info after a scheme, and a query after a URL or an absolute path (up to a space or quote)
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#@\s\"'<>]*@")
_QUERY = re.compile(r"(?P<path>(?:\b[a-zA-Z][a-zA-Z0-9+.-]*://|(?<![\w.])/)[^\s?#\"'<>]*)[?#][^\s\"'<>]+")
HIDDEN = "?…"


def public_name(src: str) -> str:
    """``src`` as messages, logs and the mount table may show it: a URL without its user info and query, a
    path as it is."""
    match = _URL.match(src)
    if match is None:
        return src
    return match["scheme"] + match["rest"] + (HIDDEN if match["query"] else "")


def strip_url(src: str) -> str:
    """A URL without user info, query or fragment (a path as it is): the name a record keeps."""
    match = _URL.match(src)
    return src if match is None else match["scheme"] + match["rest"]


def redact(text: str) -> str:
    """``text`` with the user info and query of every URL in it (and the query of every ``/path?...``)
    replaced (see the module docstring). Text without ``@``, ``?`` or ``#`` is returned as it is."""
    if "@" not in text and "?" not in text and "#" not in text:
        return text
    text = _USERINFO.sub(r"\g<scheme>", text)
    return _QUERY.sub(lambda m: m["path"] + HIDDEN, text)


def hide_in_argv() -> bool:
    """Rewrite this process's command line (``/proc/PID/cmdline``, what ``ps`` shows to every user) with each
    argument redacted, for the life of the process and of every child forked after. True if it changed.

    CPython keeps its own copy of ``sys.argv``; the kernel shows the original argument area, which is
    overwritten in place through ``/proc/self/mem`` (a process may always write its own memory). Best
    effort: False where that is not possible (not Linux, a kernel that forbids it).
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
            new = b"\0".join(shown) + b"\0"
            mem.seek(start)
            mem.write(new + b"\0" * (len(area) - len(new)))
        return True
    except (OSError, ValueError, IndexError):
        return False
