"""The heap of ``ckptfs prefetch`` (``ckptfs.util.heap``): what its fetches free is kept for their next buffers,
measured as the resident memory of a process that frees a block, with and without asking."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

HEAP_CHILD = textwrap.dedent("""
    import os, sys
    from ckptfs.util.heap import keep_freed_memory
    from ckptfs.util.procinfo import rss_anon
    asked = sys.argv[1] == "keep" and keep_freed_memory()
    before = rss_anon(os.getpid())
    block = b"\\x01" * (16 << 20)   # touched: every page resident
    del block
    print(asked, (rss_anon(os.getpid()) - before) >> 20)
""")


@pytest.mark.parametrize("how", ["keep", "default"])
def test_a_prefetch_keeps_freed_memory_for_its_next_buffers(how):
    """``ckptfs prefetch`` asks the C library to keep what it frees (``ckptfs.util.heap``): a freed 16 MiB block
    stays resident for the next allocation, where by default it goes back to the system at once."""
    result = subprocess.run([sys.executable, "-c", HEAP_CHILD, how], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    asked, kept_mib = result.stdout.split()
    assert asked == str(how == "keep")
    assert (int(kept_mib) >= 15) == (how == "keep"), result.stdout
