"""Run a function in a forked child of the test process and read back what it returns."""

from __future__ import annotations

import os
import select

WAIT_S = 30.0


def in_child(run) -> bytes:
    """What ``run()`` returns (bytes) in a forked child, read back over a pipe; b"" when the child wrote
    nothing in time (it hung, or died)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(r)
            os.write(w, run())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    got, ended = b"", False
    try:
        while select.select([r], [], [], WAIT_S)[0]:
            part = os.read(r, 4096)
            if not part:
                ended = True
                break
            got += part
    finally:
        os.close(r)
        if not ended:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
    return got
