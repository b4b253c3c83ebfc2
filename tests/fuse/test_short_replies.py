"""The daemon never answers a read with fewer bytes than asked before the end of the file.

The kernel takes a short FUSE reply for the end of the file and shrinks the file's size to it (mmap and every
later read then see a shorter file), so a view that hands back fewer bytes than due mid-file — a bug, or a
plug-in's — is answered EIO instead and counted in the stats (``short_replies``, 0 unless there is a bug).
The callbacks are driven as libfuse calls them, through ``read`` (bytes) and ``read_into`` (libfuse's buffer);
the real mounts' counter is asserted 0 under faults in test_remote_chaos.
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

import ckptfs
from ckptfs.fuse.operations import CkptOperations
from ckptfs.tree.mount_tree import MountTree

from fixtures import write_gguf

N = 4096  # float32 values: a 16 KiB .raw


@pytest.fixture
def operations(tmp_path):
    values = np.arange(N, dtype=np.float32)
    write_gguf(tmp_path / "s.gguf", {"t": (values, "F32")})
    with ckptfs.open(tmp_path / "s.gguf") as ck:
        ops = CkptOperations(MountTree(ck))
        yield ops, values.tobytes()
        ops.destroy("/")


def _cut_short(ops: CkptOperations, fh: int, by: int) -> None:
    """Make the view behind ``fh`` answer ``by`` bytes fewer than it should, as a faulty view would."""
    view = ops._handles[fh]
    read, read_into = view.read, view.read_into
    view.read = lambda offset, size, **kw: read(offset, size, **kw)[:-by]
    view.read_into = lambda offset, target, keep=True, **kw: read_into(offset, target, keep, **kw) - by


def test_a_short_answer_mid_file_is_eio_and_counted(operations):
    ops, data = operations
    fh = ops.open("/t.raw", os.O_RDONLY)
    assert ops.read("/t.raw", 4096, 0, fh) == data[:4096]
    _cut_short(ops, fh, 100)
    for call in (lambda: ops.read("/t.raw", 4096, 4096, fh),
                 lambda: ops.read_into("/t.raw", memoryview(bytearray(4096)), 8192, fh)):
        with pytest.raises(OSError) as info:
            call()
        assert info.value.errno == errno.EIO
    assert ops.stats()["short_replies"] == 2


def test_the_end_of_the_file_is_not_a_short_reply(operations):
    ops, data = operations
    fh = ops.open("/t.raw", os.O_RDONLY)
    assert ops.read("/t.raw", 8192, len(data) - 100, fh) == data[-100:]
    buf = bytearray(8192)
    assert ops.read_into("/t.raw", memoryview(buf), len(data) - 100, fh) == 100 and buf[:100] == data[-100:]
    assert ops.read("/t.raw", 4096, len(data) + 10, fh) == b""
    assert ops.stats()["short_replies"] == 0
