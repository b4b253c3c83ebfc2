"""A termination signal during a foreground mount's start-up check.

libfuse ends the session at once on SIGINT/SIGTERM/SIGHUP, and a foreground mount checks that it answers
(``check_answers``) from a thread started by ``init``: a signal that comes while that check waits for its
answer makes the answer "not mounted". That is a mount that was ended, not one that failed to start, and
``check_answers`` tells the two apart (``MountGone``), so ``ckptfs mount -f`` ends with 0 as for any
signal. The end-to-end case is ``test_mount_daemon.py::test_signals_unmount_cleanly_with_reads_in_flight``
(where the race showed); here the judgement it relies on, against a real mount and a real directory.
"""

from __future__ import annotations

import os

import pytest
from cli_runs import run_cli
from conftest import mount_stats

from ckptfs.fuse.errors import MountError
from ckptfs.service.mountpoint import MountGone, check_answers


def test_a_mount_that_is_gone_is_not_a_mount_that_answers_wrongly(small, mountpoint, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(MountGone, match="does not answer at its root"):  # what the check finds after unmount
        check_answers(str(plain), os.getpid(), 10)

    assert run_cli("mount", str(small.path), str(mountpoint)).returncode == 0
    pid = mount_stats(mountpoint)["pid"]
    check_answers(str(mountpoint), pid, 10)  # the daemon's own mount answers
    with pytest.raises(MountError, match="not served by this ckptfs daemon") as info:
        check_answers(str(mountpoint), pid + 1, 10)
    assert not isinstance(info.value, MountGone)

    assert run_cli("umount", str(mountpoint)).returncode == 0
    with pytest.raises(MountGone):
        check_answers(str(mountpoint), pid, 10)
