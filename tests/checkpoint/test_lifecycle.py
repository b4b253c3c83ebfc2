"""A checkpoint's life: a dropped checkpoint releases its descriptors (a tensor keeps it until dropped),
reads after ``close()`` are refused and reopen nothing (also when the file was replaced meanwhile), and a
pickled tensor reopens in another process as long as its file is unchanged (after its origin closed, after a
``chdir``), and refuses one replaced since. References: gguf-py's writer, /proc/self/fd for descriptors.
"""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, cli_env
from fixtures import write_gguf, write_mixed_gguf
from multifile_sets import gguf_tensors

import ckptfs
from ckptfs.core.errors import CheckpointError

RNG = np.random.default_rng(20240611)


def _descriptors_on(path) -> int:
    """How many of this process's descriptors point at ``path``."""
    target, count = os.path.realpath(path), 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:
            pass
    return count


_OPEN_AND_DROP = """
import gc, os, resource, sys
import ckptfs
gc.disable()  # released at once by reference counting, not by a later collection
resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
for i in range(400):
    ck = ckptfs.open(sys.argv[1])
    row = ck["q"][i % 64]
    first = ck.tensors[1][:2]
    t = ck["q"]
    del ck  # the tensor keeps its checkpoint; dropping both releases it
    assert t[1].shape == (256,)
    del t
print("ok", len(os.listdir("/proc/self/fd")))
"""


def test_dropped_checkpoints_release_their_descriptors(small):
    out = subprocess.run([sys.executable, "-c", _OPEN_AND_DROP, str(small.path)], env=cli_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]  # before: Too many open files


def test_a_tensor_keeps_its_checkpoint_until_it_is_dropped(small):
    before = _descriptors_on(small.path)
    t = ckptfs.open(small.path)["q"]
    gc.collect()
    assert np.array_equal(t[3], small.tensors["q"].array[3]) and _descriptors_on(small.path) == before + 1
    del t
    gc.collect()
    assert _descriptors_on(small.path) == before


def test_reads_after_close_are_refused_and_reopen_nothing(small):
    before = _descriptors_on(small.path)
    ck = ckptfs.open(small.path)
    t = ck["q"]
    assert np.array_equal(t[1:3], small.tensors["q"].array[1:3])
    ck.close()
    assert ck.closed and _descriptors_on(small.path) == before
    for read in (lambda: t[0], lambda: t.raw(), lambda: np.asarray(ck["f"]), lambda: ck.tensors[1][:1]):
        with pytest.raises(ckptfs.CheckpointError, match="checkpoint is closed"):
            read()
    assert _descriptors_on(small.path) == before  # before: each read reopened the file, never to close it
    ck.close()  # closing twice is harmless
    assert ck["q"].shape == (64, 256) and ck.metadata["general.name"] == "small"  # what needs no read still works


def test_unpickled_tensors_work_after_their_origin_is_closed(small):
    with ckptfs.open(small.path) as ck:
        data = pickle.dumps(ck["q"])
    t = pickle.loads(data)  # reopens in this process, as a worker would
    assert np.array_equal(t[5], small.tensors["q"].array[5])


def test_a_closed_checkpoint_read_again_still_refuses_a_replaced_file(tmp_path):
    """Reading after ``close()`` is refused (a reopened descriptor would have no owner to close it), so a
    replacement's bytes are never served at the old header's offsets either."""
    path = tmp_path / "model.gguf"
    old = write_gguf(path, {"w": (RNG.standard_normal((4, 64)).astype(np.float32), "Q8_0")})
    ck = ckptfs.open(path)
    np.testing.assert_array_equal(ck["w"][:], old.tensors["w"].array)
    new = write_gguf(tmp_path / "new.gguf", {"w": (RNG.standard_normal((4, 64)).astype(np.float32), "Q8_0")})
    assert new.tensors["w"].raw != old.tensors["w"].raw
    (tmp_path / "new.gguf").replace(path)
    ck.close()
    with pytest.raises(CheckpointError, match="checkpoint is closed"):
        ck["w"][:]
    with pytest.raises(CheckpointError, match="checkpoint is closed"):
        ck["w"].raw()


def test_a_tensor_of_a_relative_path_unpickles_after_a_chdir(index_gguf, tmp_path, monkeypatch):
    """The open checkpoint keeps reading its relative path after a ``chdir`` (its sources remember where
    they were opened); a pickled tensor must too (spawned workers start in the parent's current directory,
    which tools such as Hydra move)."""
    import pickle

    path, refs = index_gguf
    monkeypatch.chdir(path.parent)
    with ckptfs.open(path.name) as ck:
        pickled = pickle.dumps(ck["q3"])
    monkeypatch.chdir(tmp_path)
    clone = pickle.loads(pickled)
    assert clone.name == "q3"
    np.testing.assert_array_equal(np.asarray(clone), refs["q3"])


def test_a_pickled_tensor_refuses_a_checkpoint_replaced_since(tmp_path):
    """The pickle carries the content identity; a replaced file is an error, not another
    tensor served silently under the old index."""
    path = tmp_path / "model.gguf"
    write_mixed_gguf(path)
    with ckptfs.open(path) as ck:
        blob = pickle.dumps(ck.tensors[1])
    replaced = tmp_path / "other.gguf"
    tensors = gguf_tensors(3, seed=9)
    from multifile_sets import write_gguf_by_hand
    write_gguf_by_hand(replaced, tensors, split=None)
    os.replace(replaced, path)
    code = ("import pickle, sys\n"
            "try:\n    pickle.loads(sys.stdin.buffer.read())\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc); sys.exit(3)\n")
    result = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 3, result.stdout + result.stderr
    assert b"CheckpointError" in result.stdout and b"changed since this tensor was pickled" in result.stdout


def test_a_pickled_tensor_still_unpickles_while_the_checkpoint_is_unchanged(tmp_path):
    path = tmp_path / "model.gguf"
    written = write_mixed_gguf(path)
    with ckptfs.open(path) as ck:
        t = ck.tensors[1]
        blob = pickle.dumps(t)
    back = pickle.loads(blob)
    assert back.name == t.name
    ref = written.tensors[t.name]
    if ref.array is not None:
        np.testing.assert_array_equal(np.asarray(back), ref.array)
