"""``import ckptfs`` and the whole library API work where no FUSE binding or libfuse can load; only a mount
needs them, and then it fails with one line naming what to install (docs/architecture.md)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from fixtures import write_mixed_gguf

# Runs in a fresh interpreter in which mfusepy, fusepy and libfuse cannot be found.
SCRIPT = textwrap.dedent('''
    import ctypes.util, importlib.abc, sys

    class NoFuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("mfusepy", "fuse"):
                raise ImportError(f"{name} is not installed here")
            return None

    sys.meta_path.insert(0, NoFuse())
    real_find = ctypes.util.find_library
    ctypes.util.find_library = lambda name: None if "fuse" in name else real_find(name)

    import numpy as np
    import ckptfs
    from ckptfs.tree.mount_tree import MountTree

    with ckptfs.open(sys.argv[1]) as ck:
        tree = MountTree(ck)
        total = 0
        for t in ck.tensors:
            total += np.asarray(t).size
            view = tree.view(tree.names()[0])
            assert view.read(0, view.size)
    assert not {"mfusepy", "fuse"} & set(sys.modules), sorted(m for m in sys.modules if "fuse" in m)
    print("tensors", len(ck.tensors), "elements", total)

    from ckptfs.commands.cli import main
    try:
        main(["mount", sys.argv[1], sys.argv[2]])
    except SystemExit as exc:
        print("exit", exc.code)
''')


def test_library_works_without_fuse_and_mount_says_what_to_install(tmp_path):
    written = write_mixed_gguf(tmp_path / "m.gguf")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(written.path), str(mnt)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"tensors {len(written.tensors)}" in result.stdout
    assert "exit 1" in result.stdout
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("ckptfs: error:"), result.stderr
    assert "pip install mfusepy" in errors[0]
