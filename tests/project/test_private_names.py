"""The cache's and the fetched-bytes store's modules share what they share by public names: none imports
another module's private name.

A name with a leading underscore is its module's own business: it may change with no caller to update. The
two stores of a ``--cache-dir`` folder (decoded groups, fetched remote bytes) share the folder's mechanics
(its size bound's schedule, the pause after trouble, the prune lock, private files), so those live in a
module of their own with public names (``cache/folder.py``), and a store borrows nothing private from the
other. The source is read (not imported): a ``from ckptfs.X import _name`` or a ``module._name`` of an
imported ckptfs module, in the packages listed, fails here. A compiled helper (``_curl``, ``_native``) is a
module, not a private name, and is allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The packages held to it: the decoded groups' tiers and the fetched remote bytes' store.
PACKAGES = ("ckptfs/cache", "ckptfs/sources/remote/store")


def _is_module(package: str, name: str) -> bool:
    base = ROOT.joinpath(*package.split("."))
    return ((base / f"{name}.py").exists() or (base / f"{name}.pyi").exists() or (base / name).is_dir()
            or any(base.glob(f"{name}.*.so")))


def _package_of(path: Path) -> str:
    dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return dotted.removesuffix(".__init__") if path.name == "__init__.py" else dotted.rpartition(".")[0]


def _private_uses(source_text: str, package: str) -> list[str]:
    """``module.name`` for each private name of another ckptfs module that a module of ``package`` (its
    source ``source_text``) imports or reaches."""
    tree = ast.parse(source_text)
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(parts + ([source] if source else []))
            if not source.startswith("ckptfs"):
                continue
            for alias in node.names:
                if _is_module(source, alias.name):
                    modules[alias.asname or alias.name] = f"{source}.{alias.name}"
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{source}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("ckptfs."):
                    modules[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{modules[node.value.id]}.{node.attr}")
    return found


def test_no_module_of_the_stores_imports_a_private_name_of_another():
    found = [f"{path.relative_to(ROOT)}: {name}" for package in PACKAGES
             for path in sorted((ROOT / package).rglob("*.py"))
             for name in _private_uses(path.read_text(), _package_of(path))]
    assert not found, "private names used across modules (make them public where they are shared):\n" + \
        "\n".join(found)


def test_a_private_name_is_found_in_each_form():
    """The scan sees both forms, relative imports too, and lets compiled helpers and public names pass (so
    the test above can fail, and fails only for what it says)."""
    source = ("from ckptfs.cache.disk import _walk, DiskStore\n"
              "from .lru import _Entry\n"
              "from ckptfs.cache import disk\n"
              "from ckptfs.sources.remote import _curl\n"
              "disk._SUFFIX, disk.DiskStore, _curl.Client\n")
    assert _private_uses(source, "ckptfs.cache") == [
        "ckptfs.cache.disk._walk", "ckptfs.cache.lru._Entry", "ckptfs.cache.disk._SUFFIX"]
