"""The remote stack calls only downward: a FUSE read of a remote ``.raw`` walks from the FUSE callback to the
HTTP request in a bounded number of frames — from the source the views read, one frame per part of the chain —
and never returns into a module above it.

Debian's nginx on loopback serves a GGUF; a real mount reads 4 KiB of a tensor's ``.raw`` far past what its open
fetched. Inside the mount daemon, a ``sitecustomize`` module (on the daemon's ``PYTHONPATH``, written here)
wraps urllib3's connection pool and libcurl's range GET (``_curl.get``) and writes the Python stack of every
request either is asked to send, with the request's Range; the test picks the request the FUSE reader's own thread sent for those bytes and reads its
ckptfs frames.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("urllib3")

from conftest import REPO, require_nginx
from fixtures import quantized, write_gguf
from loopback.servers import Nginx

MiB = 1 << 20
#: At most this many of ckptfs's frames from the source the views read to the HTTP request.
MAX_FRAMES = 8
#: At most this many of ckptfs's frames in all, from the FUSE callback (the binding's ``read``) to the HTTP
#: request: the binding, the operations' guarded read, the ``.raw`` view, then the source's chain.
MAX_FROM_CALLBACK = 8

_HOOK = '''
import json, os, threading, traceback

import urllib3.connectionpool as _pool

_urlopen = _pool.HTTPConnectionPool.urlopen


def urlopen(self, method, url, *args, **kwargs):
    stack = [(frame.filename, frame.name) for frame in traceback.extract_stack()[:-1]]
    record = {"range": (kwargs.get("headers") or {}).get("Range"), "thread": threading.current_thread().name,
              "stack": stack}
    with open(os.environ["CKPTFS_TEST_STACKS"], "a") as out:
        out.write(json.dumps(record) + "\\n")
    return _urlopen(self, method, url, *args, **kwargs)


_pool.HTTPConnectionPool.urlopen = urlopen

try:  # the range GETs libcurl carries (ckptfs.sources.remote.curl), when the extension is built
    from ckptfs.sources.remote import _curl
except ImportError:
    _curl = None
if _curl is not None:
    _get = _curl.get

    def get(url, headers, *args, **kwargs):
        stack = [(frame.filename, frame.name) for frame in traceback.extract_stack()[:-1]]
        asked = next((h.split(":", 1)[1].strip() for h in headers if h.lower().startswith("range:")), None)
        record = {"range": asked, "thread": threading.current_thread().name, "stack": stack}
        with open(os.environ["CKPTFS_TEST_STACKS"], "a") as out:
            out.write(json.dumps(record) + "\\n")
        return _get(url, headers, *args, **kwargs)

    _curl.get = get
'''


def _own(stack: list[list[str]]) -> list[tuple[str, str]]:
    """The stack's ckptfs frames, outermost first, as (module path, function)."""
    root = str(REPO / "ckptfs") + os.sep
    return [(Path(f).relative_to(REPO).as_posix(), name) for f, name in stack if f.startswith(root)]


def test_a_fuse_read_of_a_remote_raw_reaches_the_request_down_the_chain(tmp_path, mounted):
    require_nginx()
    root = tmp_path / "www"
    root.mkdir()
    rng = np.random.default_rng(5)
    write_gguf(root / "big.gguf", {"big.q4k": (quantized("Q4_K", (4096, 4096), rng), "Q4_K")})
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOOK)
    stacks = tmp_path / "stacks.jsonl"
    with Nginx(root) as server:
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(hook), str(REPO), os.environ.get("PYTHONPATH")])),
               "CKPTFS_TEST_STACKS": str(stacks)}
        mnt = mounted(server.url + "/big.gguf", "--timeout", "10", env=env)
        raw = next(p for p in Path(mnt).iterdir() if p.name.endswith(".raw"))
        with open(raw, "rb") as fh:
            fh.seek(5 * MiB)  # stored bytes far past what the open fetched: this read asks the origin
            assert len(fh.read(4096)) == 4096
    records = [json.loads(line) for line in stacks.read_text().splitlines()]
    reads = [_own(r["stack"]) for r in records if any(f.endswith("fuse/binding.py") for f, _ in r["stack"])]
    assert reads, f"no request sent from a FUSE read: {[r['range'] for r in records]}"
    for frames in reads:
        shown = "\n".join(f"  {path} {name}" for path, name in frames)
        below = next(i for i, (path, _) in enumerate(frames) if path.startswith("ckptfs/sources/"))
        assert len(frames) - below <= MAX_FRAMES, f"{len(frames) - below} frames from the source down:\n{shown}"
        callback = next(i for i, (path, _) in enumerate(frames) if path == "ckptfs/fuse/binding.py")
        assert callback == 0 and len(frames) <= MAX_FROM_CALLBACK, \
            f"{len(frames) - callback} frames from the FUSE callback down:\n{shown}"
        modules = [path for k, (path, _) in enumerate(frames) if k == 0 or frames[k - 1][0] != path]
        again = sorted({m for m in modules if modules.count(m) > 1})
        assert not again, f"the walk returns into {again}, a caller above:\n{shown}"
