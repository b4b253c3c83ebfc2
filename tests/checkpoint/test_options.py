"""OpenOptions: one value for how a checkpoint is opened, kept whole by the checkpoint and its pickled tensors.

The defect this fixes: a tensor pickled into a worker process reopened its checkpoint with the cache tiers
alone, so a worker read a corrupted file silently that its parent refused (``manifest=``), and waited the
default timeout instead of the one asked for. The workers here are real processes started with ``spawn``
(as DataLoader workers can be), so nothing of the parent's state reaches them but the pickle.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle

import numpy as np
import pytest
from integrity_fixtures import big_safetensors, flip, reference_tensors

import ckptfs
from ckptfs.core.errors import IntegrityError
from ckptfs.core.options import OpenOptions
from ckptfs.integrity.manifest import build_manifest

MIB = 1 << 20


def _read_in_worker(pickled: bytes, rows: slice) -> tuple[str, object]:
    """Runs in a spawned process: unpickle a tensor and read rows; what happened, as plain values."""
    tensor = pickle.loads(pickled)
    try:
        return "ok", tensor[rows]
    except IntegrityError as exc:
        return "IntegrityError", str(exc)


def _options_in_worker(pickled: bytes) -> OpenOptions:
    return pickle.loads(pickled)._ck.options


@pytest.fixture
def intact(tmp_path):
    """A safetensors file and its manifest."""
    path = tmp_path / "big.safetensors"
    tensors = big_safetensors(path)
    with ckptfs.open(path) as ck:
        manifest_path = tmp_path / "big.manifest.json"
        manifest_path.write_text(build_manifest(ck).dumps())
    return path, manifest_path, tensors


@pytest.fixture
def corrupted(intact):
    """The same, with one byte of big.weight flipped after the manifest was written."""
    path, manifest_path, tensors = intact
    offsets = {name: (offset, len(data)) for name, offset, data in reference_tensors(path)}
    start, _ = offsets["big.weight"]
    flip(path, start + MIB + 3)  # chunk 1 of big.weight: rows 256..511
    return path, manifest_path, tensors


def _spawn_pool():
    return multiprocessing.get_context("spawn").Pool(1)


def test_a_pickled_tensor_checks_reads_against_the_manifest_in_a_worker(corrupted, tmp_path, monkeypatch):
    path, manifest_path, tensors = corrupted
    monkeypatch.chdir(tmp_path)  # a relative manifest path: the worker must still find the same file
    with ckptfs.open(path, manifest=os.path.basename(manifest_path)) as ck:
        tensor = ck["big.weight"]
        with pytest.raises(IntegrityError):
            tensor[300]
        pickled = pickle.dumps(tensor)
    with _spawn_pool() as pool:
        kind, what = pool.apply(_read_in_worker, (pickled, slice(300, 301)))
        assert kind == "IntegrityError", f"the worker read corrupted bytes silently: {what!r}"
        assert "big.weight" in what and "differ from the manifest" in what
        kind, rows = pool.apply(_read_in_worker, (pickled, slice(0, 256)))  # an intact chunk still serves
        assert kind == "ok"
        np.testing.assert_array_equal(rows, tensors["big.weight"][:256])


def test_a_worker_reopens_with_every_option_of_its_parent(intact, tmp_path):
    path, manifest_path, _ = intact
    mirror = tmp_path / "mirror.safetensors"
    mirror.write_bytes(path.read_bytes())
    with ckptfs.open(path, dtype="float16", cache_size=3 * MIB, manifest=manifest_path, mirrors=[mirror],
                     timeout=3, stall_timeout=1.5, cache_dir=tmp_path / "tiers") as ck:
        expected = ck.options
        pickled = pickle.dumps(ck["norm.weight"])
    assert expected == OpenOptions(dtype="float16", cache_size=3 * MIB, manifest=str(manifest_path),
                                   mirrors=(str(mirror),), timeout=3, stall_timeout=1.5,
                                   cache_dir=str(tmp_path / "tiers"))
    with _spawn_pool() as pool:
        assert pool.apply(_options_in_worker, (pickled,)) == expected


def test_options_resolve_paths_once_and_check_values(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    options = OpenOptions.build(manifest="m.json", cache_dir="cache", mirrors=["copy.gguf", "https://h/x.gguf"])
    assert options.manifest == str(tmp_path / "m.json")
    assert options.cache_dir == str(tmp_path / "cache")
    assert options.mirrors == (str(tmp_path / "copy.gguf"), "https://h/x.gguf")
    assert OpenOptions.build(options, timeout=5).manifest == options.manifest  # None keeps, a value changes
    assert OpenOptions.build(options, timeout=5).timeout == 5
    for bad in ({"cache_size": -1}, {"cache_size": 1.5}, {"timeout": 0}, {"stall_timeout": "10"}):
        with pytest.raises(ValueError):
            OpenOptions.build(**bad)
    with pytest.raises(TypeError, match="mirrors"):
        OpenOptions.build(mirrors="one.gguf")
    with pytest.raises(TypeError, match="unknown open option"):
        OpenOptions.build(cache_sise=1)


def test_every_field_is_a_keyword_of_open(tmp_path, monkeypatch):
    """``ckptfs.open()`` takes every field of OpenOptions by name (walked: a new field is one without an
    edit to open()), the first three by position too, and refuses a keyword that is none of them."""
    import dataclasses
    import inspect

    import ckptfs.checkpoint.api as api

    seen = []
    monkeypatch.setattr(api, "open_with", lambda src, options: seen.append(options))
    values = {"dtype": "float16", "cache_size": 3 * MIB, "max_open_files": 7, "cache_dir": str(tmp_path / "c"),
              "cache_dir_size": 5 * MIB, "cache_dir_min_free": 7.5, "redis": "redis://127.0.0.1:6399/2",
              "redis_cluster": ("127.0.0.1:7001",), "cache_key_file": str(tmp_path / "k"),
              "manifest": str(tmp_path / "m.json"), "mirrors": ("https://h/x.gguf",), "timeout": 2.5,
              "stall_timeout": 1.5, "offline": True}
    parameters = inspect.signature(ckptfs.open).parameters
    for field in dataclasses.fields(OpenOptions):
        assert field.name in parameters, f"open() has no keyword {field.name}"
        value = values[field.name]  # a new field: give it a value here
        given = list(value) if isinstance(value, tuple) else value  # lists are taken as the docs show them
        ckptfs.open("model.gguf", **{field.name: given})
        assert getattr(seen[-1], field.name) == value, field.name
        assert seen[-1] == OpenOptions.build(**{field.name: value})
    ckptfs.open("model.gguf", "float32", MIB, 9)
    assert (seen[-1].dtype, seen[-1].cache_size, seen[-1].max_open_files) == ("float32", MIB, 9)
    base = OpenOptions.build(timeout=4)
    ckptfs.open("model.gguf", options=base, dtype="float16", timeout=None)  # None keeps what `options` says
    assert seen[-1] == OpenOptions.build(base, dtype="float16")
    with pytest.raises(TypeError, match="unknown open option"):
        ckptfs.open("model.gguf", cache_sise=1)
    with pytest.raises(TypeError, match="multiple values"):
        ckptfs.open("model.gguf", "float32", dtype="float16")
    with pytest.raises(TypeError, match="by position"):
        ckptfs.open("model.gguf", "float32", MIB, 9, "extra")
