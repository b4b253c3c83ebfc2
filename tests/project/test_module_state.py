"""The package's module-level mutable state, listed: a new process-wide singleton is a decision, not an accident.

State held by a module (a registry, a pool, a lock, counters, a cache of clients) is shared by every checkpoint
and mount of the process, must be reset in a forked child (``util/forks.py``), and is a hidden input to every
function that reads it. The design moves it into a per-process runtime object built once and passed down
(docs/architecture.md, "The runtime"), keeping module-level state only where the platform demands it. Until
then this test is the count: the source is read (not imported), every module-level name bound to state found
as below is listed in ``KNOWN``, and the test fails when one is added (say why, or pass it down instead) or
when one is gone (take it off the list, so the count stays true).

Found as state: a name a function rebinds (``global``); a lock, event, thread-local, weak set or mapping,
ordered/default dict, deque or counter; an instance of a class of the package that is not immutable (a frozen
dataclass, an enum, a named tuple, an exception); a dict, list or set some function of its module changes.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MUTATORS = {"append", "add", "update", "pop", "clear", "setdefault", "discard", "remove", "extend", "insert",
            "popitem", "appendleft", "__setitem__"}
STATEFUL_CALLS = {"Lock", "RLock", "Event", "Condition", "Semaphore", "BoundedSemaphore", "local", "WeakSet",
                  "WeakKeyDictionary", "WeakValueDictionary", "OrderedDict", "defaultdict", "deque", "count",
                  "Counter"}
CONTAINER_CALLS = {"dict", "list", "set"}


def _classes(root: Path) -> dict[str, bool]:
    """Every class the package defines -> whether its instances are immutable (a frozen dataclass, an Enum, a
    NamedTuple, an exception)."""
    out: dict[str, bool] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                frozen = any(isinstance(d, ast.Call) and any(k.arg == "frozen" and getattr(k.value, "value", False)
                                                             for k in d.keywords) for d in node.decorator_list)
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                immutable = frozen or bool(bases & {"Enum", "IntEnum", "NamedTuple", "Exception", "Protocol",
                                                    "StrEnum", "IntFlag", "Flag"})
                out[node.name] = out.get(node.name, True) and immutable
    return out


def module_state(root: Path) -> list[str]:
    """``package.module.NAME`` of every module-level name under ``root`` bound to state (the module docstring's
    rules), read from the source so that nothing is imported."""
    classes = _classes(root)
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        rel = path.relative_to(root.parent).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
        bound: dict[str, ast.expr] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        bound[t.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                bound[node.target.id] = node.value
        rebound, mutated = set(), set()
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for n in ast.walk(fn):
                if isinstance(n, ast.Global):
                    rebound.update(n.names)
                elif isinstance(n, (ast.Assign, ast.AugAssign, ast.Delete)):
                    targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]
                    for t in targets:
                        if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                            mutated.add(t.value.id)
                elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                        and isinstance(n.func.value, ast.Name) and n.func.attr in MUTATORS:
                    mutated.add(n.func.value.id)
        for name, value in bound.items():
            why = None
            if name in rebound:
                why = "rebound"
            elif isinstance(value, ast.Call):
                f = value.func
                called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if called in STATEFUL_CALLS:
                    why = called
                elif called in classes and not classes[called]:
                    why = called
                elif called in CONTAINER_CALLS and name in mutated:
                    why = "mutated " + called
            elif isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) \
                    and name in mutated:
                why = "mutated container"
            if why:
                found.append(f"{rel}.{name}")
    return found


#: The module-level state of the package as it stands (50 names, locks included).
KNOWN = {
    "ckptfs.cache.auth._keys",
    "ckptfs.cache.auth._keys_lock",
    "ckptfs.cache.chunks._stores",
    "ckptfs.cache.chunks._stores_lock",
    "ckptfs.cache.chunks._shared_tiers",
    "ckptfs.cache.flight._named",
    "ckptfs.cache.flight._named_lock",
    "ckptfs.checkpoint.api._reopened",
    "ckptfs.checkpoint.api._reopen_lock",
    "ckptfs.checkpoint.shared._stores",
    "ckptfs.commands.open_flags.SIZE",
    "ckptfs.core.features._registered",
    "ckptfs.core.runtime._default",
    "ckptfs.core.features._lock",
    "ckptfs.engine.decode._lock",
    "ckptfs.engine.decode._device",
    "ckptfs.engine.decode._parts",
    "ckptfs.ggufview.files._lock",
    "ckptfs.ggufview.files._parsed",
    "ckptfs.ggufview.files._builds",
    "ckptfs.ggufview.liblog._lock",
    "ckptfs.ggufview.liblog._active",
    "ckptfs.integrity.checked._warned_unlisted",
    "ckptfs.integrity.manifest._warned",
    "ckptfs.ahead.limits._origins",
    "ckptfs.ahead.limits._origins_lock",
    "ckptfs.packed.bits._scratch",
    "ckptfs.packed.detect._registry",
    "ckptfs.quant._registry",
    "ckptfs.quant._lock",
    "ckptfs.quant._builtins_loaded",
    "ckptfs.quant._plugins_loaded",
    "ckptfs.workers.scheduler.SCHEDULER",
    "ckptfs.sources.registry._openers",
    "ckptfs.sources.registry._lock",
    "ckptfs.ahead.fetch._readaheads",
    "ckptfs.sources.remote.options.DEFAULT_OPTIONS",
    "ckptfs.sources.remote.outage._registry_lock",
    "ckptfs.sources.remote.version._pins",
    "ckptfs.torchio.kernels._tables",
    "ckptfs.tree.registry._registered",
    "ckptfs.tree.registry._lock",
    "ckptfs.util.forks._callbacks",
    "ckptfs.util.forks._lock",
}


def test_the_module_level_state_is_the_listed_state():
    found = set(module_state(ROOT / "ckptfs"))
    added, gone = sorted(found - KNOWN), sorted(KNOWN - found)
    assert not added, "new module-level state (pass it down, or list it with a reason): " + ", ".join(added)
    assert not gone, "listed but no longer module-level state (take it off KNOWN): " + ", ".join(gone)


def test_the_scan_finds_each_kind_of_state(tmp_path):
    """The finder on a planted package: each kind of state is found, constants and immutable values are not."""
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(
        "import threading\n"
        "from dataclasses import dataclass\n"
        "@dataclass(frozen=True)\n"
        "class Frozen:\n    x: int = 0\n"
        "class Pool:\n    pass\n"
        "TABLE = {1: 2}\n"
        "NAMES = ('a', 'b')\n"
        "DEFAULT = Frozen()\n"
        "POOL = Pool()\n"
        "_lock = threading.Lock()\n"
        "_seen = set()\n"
        "_current = None\n"
        "def note(x):\n    global _current\n    _current = x\n    _seen.add(x)\n    return TABLE[x]\n")
    assert sorted(module_state(package)) == ["planted.mod.POOL", "planted.mod._current", "planted.mod._lock",
                                             "planted.mod._seen"]
