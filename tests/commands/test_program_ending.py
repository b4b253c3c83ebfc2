"""How the ``ckptfs`` program ends (``ckptfs.commands.ending``): a command that says its results are written ends
its process at once (``os._exit``: no interpreter teardown), its output and log lines flushed first; run
in-process (click's ``CliRunner``, an embedding caller), the same command ends with ``SystemExit`` as any."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ckptfs.commands import ending

CHILD = textwrap.dedent("""
    import atexit, logging, sys
    from ckptfs.commands import ending
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    atexit.register(lambda: print("teardown ran", file=sys.stderr, flush=True))
    print("summary line")              # buffered: stdout is a pipe
    logging.getLogger("x").info("a log line")
    try:
        ending.exit_at_once(3) if sys.argv[1] == "at-once" else sys.exit(3)
    except SystemExit as exc:
        ending.end_process(exc)
""")


@pytest.mark.parametrize("how", ["at-once", "as-usual"])
def test_the_program_ends_with_its_code_and_every_line_said(how):
    result = subprocess.run([sys.executable, "-c", CHILD, how], capture_output=True, text=True, timeout=60)
    assert result.returncode == 3
    assert result.stdout == "summary line\n"
    assert "a log line" in result.stderr
    # the interpreter's teardown (atexit handlers, freeing every object) is skipped only when asked for
    assert ("teardown ran" in result.stderr) == (how == "as-usual")


def test_in_process_a_command_that_ends_at_once_raises_system_exit():
    with pytest.raises(SystemExit) as raised:
        ending.exit_at_once(1)
    assert raised.value.code == 1

