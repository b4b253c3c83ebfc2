"""No hidden parameters: nothing in ``ckptfs/`` declares a ``contextvars.ContextVar`` or runs work in a copied
context.

What a caller says about a read (its deadline, a mirror behind it, a stream decided above) travels as an
argument (``ckptfs.core.reads.ReadScope``, the ``scope`` of ``ByteSource.pread`` and of the engine's reads),
so it shows in the signature of every function it passes through and follows work handed to another thread
as that work's argument. A ContextVar would carry it past every signature instead, and a task run on a worker
would see it only if someone remembered to copy the context. ``ALLOWED`` names the exceptions, each with its
reason; there are none.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: "module path:name" -> why it may stay. Empty: no ContextVar has a reason to exist in ckptfs.
ALLOWED: dict[str, str] = {}
#: What a hidden parameter is made or carried with.
NAMES = ("ContextVar", "copy_context")


def context_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of every use of ``contextvars``' ``ContextVar`` or ``copy_context`` in ``source`` (as
    ``contextvars.X`` or imported by name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in NAMES:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom) and node.module == "contextvars":
            found += [(node.lineno, alias.name) for alias in node.names if alias.name in NAMES]
    return sorted(set(found))


def test_the_check_finds_both_spellings():
    assert context_uses("import contextvars\nv = contextvars.ContextVar('x')\n") == [(2, "ContextVar")]
    assert context_uses("from contextvars import ContextVar, copy_context\n") == [(1, "ContextVar"),
                                                                                 (1, "copy_context")]
    assert context_uses("import contextlib\nwith contextlib.suppress(OSError):\n    pass\n") == []


def test_no_context_var_carries_state_in_ckptfs():
    found = []
    for path in sorted((ROOT / "ckptfs").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for line, name in context_uses(path.read_text(encoding="utf-8")):
            if f"{rel}:{name}" not in ALLOWED:
                found.append(f"{rel}:{line}: {name}")
    assert not found, ("a ContextVar (or a copied context) in ckptfs: pass what it would carry as an argument "
                       "(ckptfs.core.reads.ReadScope for a read's parameters), or name it in ALLOWED with why:\n"
                       + "\n".join(found))
