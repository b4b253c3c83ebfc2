"""The package's layering holds: import-linter's contracts in pyproject.toml (layers, no cycles, the FUSE
adapter and the daemon side importing no feature) are kept.

A cycle or an import that points up a layer fails here, in CI, instead of being found by the next reader.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_import_linter_contracts_are_kept():
    lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    assert lint, "import-linter is part of the test extra (pip install -e '.[test]')"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the tree under test, not another install of ckptfs
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in done.stdout


def test_the_mount_names_no_feature():
    """The forbidden contract of the FUSE adapter and the daemon side lists every feature package: each package
    of the layers between ``fuse`` and ``tree`` (a new feature added to the layers is forbidden to them too)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    features = {f"ckptfs.{name.strip()}" for layer in layers[layers.index("fuse") + 1:layers.index("tree")]
                for name in layer.split("|")}
    assert len(features) >= 6, features  # hffolder, ggufmerge, ggufview, torchio, integrity, packed
    forbidding = [c for c in contracts if c["type"] == "forbidden"
                  and {"ckptfs.fuse", "ckptfs.service"} <= set(c["source_modules"])]
    assert forbidding, "no forbidden contract has ckptfs.fuse and ckptfs.service as its sources"
    assert features <= set(forbidding[0]["forbidden_modules"]), features - set(forbidding[0]["forbidden_modules"])


def _package_of(path: Path) -> str:
    return path.relative_to(ROOT / "ckptfs").parts[0]


def test_c_includes_keep_the_contracts():
    """import-linter reads Python imports only: a C file's ``#include "../PACKAGE/x.h"`` is held to the same
    contracts here, so a header a C path needs lives in a layer below it (the arithmetic of the scaled-codes and
    4-bit views is ``quant/``'s, included by ``packed/`` and by the FUSE adapter's C read path alike)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    rank = {name.strip(): i for i, layer in enumerate(layers) for name in layer.split("|")}
    forbidden = {(source, target) for c in contracts if c["type"] == "forbidden"
                 for source in c["source_modules"] for target in c["forbidden_modules"]}
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    wrong, seen = [], 0
    for path in sorted((ROOT / "ckptfs").rglob("*.[ch]")):
        package = _package_of(path)
        for name in include.findall(path.read_text()):
            header = (path.parent / name).resolve()
            seen += 1
            if not header.is_relative_to(ROOT / "ckptfs") or _package_of(header) == package:
                continue  # a header of its own package, or not ckptfs's (a quoted system or Python header)
            target = _package_of(header)
            if rank[target] <= rank[package] or (f"ckptfs.{package}", f"ckptfs.{target}") in forbidden:
                wrong.append(f"{path.relative_to(ROOT)} includes {name}")
    assert seen >= 10, seen  # the C sources' includes were found
    assert not wrong, wrong
