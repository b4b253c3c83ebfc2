"""No duck-typing probes on ckptfs's own objects: its interfaces are declared (Protocols, base classes).

``getattr(x, "name", default)`` or ``hasattr(x, "name")`` with a literal name asks an object whether it has a
capability instead of its type saying so; a caller that probes for a method its objects never got fails
late, or silently takes the fallback. What ckptfs's own objects can do is declared (``TensorValues``,
``LeasingTier``, ``WrapsSource``, ...), so every such call in ``ckptfs/`` must be a probe of the platform
(``os``, ``errno``, ``fcntl``) or of a third-party package (click, redis, a FUSE binding), marked on the
call's own lines with ``# probe: platform`` or ``# probe: third-party``. A computed name (delegation in
``__getattr__``, dispatch by a declared name) is not a probe.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("platform", "third-party")


def probes(source: str) -> list[tuple[int, str]]:
    """(line, text) of every literal-name ``getattr``/``hasattr`` call in ``source`` without a ``# probe:``
    comment of a known kind on one of the lines the call spans."""
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string
    found = []
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2):
            continue
        name = node.args[1]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue  # a computed name: delegation or dispatch
        marked = any(_is_probe_comment(comments.get(line, ""))
                     for line in range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if not marked:
            found.append((node.lineno, lines[node.lineno - 1].strip()))
    return sorted(set(found))


def _is_probe_comment(comment: str) -> bool:
    marker = comment.find("# probe:")
    if marker < 0:
        return False
    kind = comment[marker + len("# probe:"):].strip()
    return any(kind.startswith(k) for k in KINDS)


def test_the_check_finds_an_unmarked_probe():
    source = ("def f(x):\n"
              "    a = getattr(x, 'lease', None)\n"
              "    b = hasattr(x,\n"
              "                'flush')\n"
              "    c = getattr(x, name)\n"
              "    d = getattr(x, 'text', '# probe: platform')\n"
              "    e = hasattr(x, 'y')  # probe: mine\n"
              "    return a, b, c, d, e\n")
    assert [line for line, _ in probes(source)] == [2, 3, 6, 7]


def test_the_check_accepts_marked_platform_and_third_party_probes():
    source = ("import os\n"
              "FLAG = getattr(os, 'O_CLOEXEC', 0)  # probe: platform\n"
              "ok = hasattr(os,\n"
              "             'register_at_fork')  # probe: platform (not on every OS)\n"
              "code = getattr(exc, 'exit_code', 1)  # probe: third-party\n"
              "names = [getattr(os, n) for n in ('sep',)]\n")
    assert probes(source) == []


def test_no_unmarked_probe_in_the_package():
    found = []
    for path in sorted((ROOT / "ckptfs").rglob("*.py")):
        for line, text in probes(path.read_text()):
            found.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    assert not found, ("capability probes on ckptfs's own objects (declare the interface), or platform/"
                       "third-party probes without '# probe: platform|third-party':\n" + "\n".join(found))
