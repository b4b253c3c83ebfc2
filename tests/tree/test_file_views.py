"""The registry of file views (``tree.registry``): the mount asks it for the views a request wants, so a mount
imports a view's module only when its flag asks for it, and a new view is one registration."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import cli_env
from fixtures import write_gguf

import ckptfs
from ckptfs.engine.views import BytesView
from ckptfs.fuse.operations import CkptOperations
from ckptfs.tree import registry
from ckptfs.tree.mount_tree import Entry, MountTree

# What a mount's file views are built from: the providers the daemon's tree is composed with, then the names
# of the tree, and the feature packages imported by then.
_MOUNT_VIEWS = """
import json, sys
import ckptfs
from ckptfs.service.mount import MountRequest, _virtual_files
from ckptfs.tree.mount_tree import MountTree
request = MountRequest(sys.argv[1], "/unused", hf=sys.argv[2] == "hf")
with ckptfs.open(sys.argv[1]) as ck:
    MountTree(ck, extra=_virtual_files(request)).names()
print(json.dumps(sorted(m for m in ("ckptfs.hffolder", "ckptfs.ggufview", "ckptfs.ggufmerge") if m in sys.modules)))
"""


def _imported_by_views(src, flag: str = "") -> list[str]:
    result = subprocess.run([sys.executable, "-c", _MOUNT_VIEWS, str(src), flag], env=cli_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_plain_mount_imports_no_opt_in_view(tmp_path):
    """Without --hf or --gguf the mount's views are only model.gguf's (a split set's): neither the hf/ nor
    the gguf/ feature is imported; --hf imports hf/'s and still not gguf/'s."""
    path = tmp_path / "model.gguf"
    write_gguf(path, {"w": (np.arange(64, dtype=np.float32).reshape(2, 32), "F32")})
    assert _imported_by_views(path) == ["ckptfs.ggufmerge"]
    assert _imported_by_views(path, "hf") == ["ckptfs.ggufmerge", "ckptfs.hffolder"]


@pytest.fixture
def names_view():
    """A view registered by a test, as a package would: ``names/list.txt`` holds the tensor names followed by
    the settings' suffix; removed afterwards."""

    def factory(required: bool = False, suffix: str = ""):
        def provider(ck):
            yield Entry("names/list.txt", "file",
                        lambda: BytesView(lambda: ("\n".join(ck) + suffix + ("!" if required else "")).encode()))
        return provider

    registry.register_provider("names", factory, describe=lambda ck: f"{len(ck)} names")
    yield
    with registry._lock:
        del registry._registered["names"]


def _read(tree: MountTree, path: str) -> bytes:
    ops = CkptOperations(tree)
    fh = ops.open(path, os.O_RDONLY)
    return ops.read(path, 1 << 20, 0, fh)


def test_a_registered_view_is_served_only_when_asked_for(tmp_path, names_view):
    path = tmp_path / "model.gguf"
    write_gguf(path, {"a": (np.zeros(32, np.float32), "F32"), "b": (np.ones(32, np.float32), "F32")})
    with ckptfs.open(path) as ck:
        assert "names" not in MountTree(ck, extra=registry.providers_for({})).listdir("")
        tree = MountTree(ck, extra=registry.providers_for({"names": {"suffix": "."}}, required=True))
        assert _read(tree, "/names/list.txt") == b"a\nb.!"
        assert tree.kind("names/list.txt") == "file"
        assert registry.describe("names", ck) == "2 names"


def test_a_view_nobody_registered_is_a_clear_error():
    with pytest.raises(KeyError, match="no file view registered as nope"):
        registry.providers_for({"nope": {}})
