"""The package's module-level mutable state, listed: a new process-wide singleton is a decision, not an accident.

State held by a module (a registry, a pool, a lock, counters, a cache of clients) is shared by every checkpoint
and mount of the process, must be reset in a forked child, and is a hidden input to every function that reads
it. What components share is a part of the process's runtime instead (``ckptfs.core.runtime``, handed down;
docs/architecture.md, "The runtime"), and module-level state stays only where the runtime is no better home.
This test is the count: the source is read (not imported), every module-level name bound to state found as
below is listed in ``KNOWN`` with why it stays, and the test fails when one is added (say why, or make it a
part of the runtime) or when one is gone (take it off the list, so the count stays true).

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


#: The module-level state that remains, each name with why it is not a part of the runtime
#: (``ckptfs.core.runtime``: what a process's components share is handed down there).
CODE_REGISTRY = "a table of code (codecs, openers, views, features) filled as its modules are imported, " \
                "like sys.modules: the same for every runtime of the process, and valid in a forked child"
KNOWN = {
    "ckptfs.core.runtime._default": "the default runtime itself: one per process, renewed in a forked child",
    "ckptfs.core.runtime._runtimes": "every runtime, held weakly, so that a forked child renews each",
    "ckptfs.util.forks._callbacks": "the process's one os.register_at_fork hook and what it runs",
    "ckptfs.util.forks._lock": "guards the fork hook's callbacks",
    "ckptfs.core.features._registered": CODE_REGISTRY,
    "ckptfs.core.features._lock": "guards the feature registry",
    "ckptfs.quant._registry": CODE_REGISTRY,
    "ckptfs.quant._lock": "guards the codec registry",
    "ckptfs.quant._builtins_loaded": "the codec registry's one-time import of the built-in codecs",
    "ckptfs.quant._plugins_loaded": "the codec registry's one-time import of the installed plug-ins",
    "ckptfs.sources.registry._openers": CODE_REGISTRY,
    "ckptfs.sources.registry._lock": "guards the scheme registry",
    "ckptfs.tree.registry._registered": CODE_REGISTRY,
    "ckptfs.tree.registry._lock": "guards the file-view registry",
    "ckptfs.packed.detect._registry": CODE_REGISTRY,
    "ckptfs.engine.decode._device": CODE_REGISTRY,
    "ckptfs.engine.decode._parts": CODE_REGISTRY,
    "ckptfs.engine.decode._lock": "guards the decode back-ends' registries",
    "ckptfs.torchio.kernels._tables": "torch's lookup tables of the quantized kernels per device, built once: "
                                      "a cache of immutable values",
    "ckptfs.packed.bits._scratch": "a thread-local scratch buffer of the C kernels (per thread, not shared)",
    "ckptfs.ggufview.liblog._active": "how many threads have gguf-py's logger quieted: the logging module's "
                                      "own state is per process",
    "ckptfs.ggufview.liblog._lock": "guards that count",
    "ckptfs.sources.remote.store.chunks._stores": "the --cache-dir stores of fetched bytes, one per folder and process: each "
                                   "holds byte-range locks (fcntl) that are the process's",
    "ckptfs.sources.remote.store.chunks._stores_lock": "guards the stores",
    "ckptfs.checkpoint.shared._stores": "the --cache-dir stores of decoded groups, one per folder and process "
                                        "(byte-range locks, like the fetched bytes' stores)",
    "ckptfs.commands.open_flags.SIZE": "click's parameter type for sizes (a stateless converter)",
}


def test_the_module_level_state_is_the_listed_state():
    found = set(module_state(ROOT / "ckptfs"))
    added, gone = sorted(found - KNOWN.keys()), sorted(KNOWN.keys() - found)
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
