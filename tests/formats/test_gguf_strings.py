"""The walk over a GGUF header's string arrays (a vocabulary): the C walk (``ckptfs.formats._strings``) and the
Python loop give the same answer for every file, good or bad, in both byte orders, and the same error line.

gguf-py is the oracle for good files; for bad ones the Python loop is (the reader whose
error messages the hostile-header tests fix). Arrays are long enough to cross the reader's first load
(``INITIAL_READ``), so the walk stops at loaded bytes and resumes after more are read."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import sysconfig

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptfs.core.errors import CheckpointError
from ckptfs.formats import gguf_values
from ckptfs.formats._prefix import INITIAL_READ
from ckptfs.formats.gguf import read_gguf

gguf = pytest.importorskip("gguf")

STRING, ARRAY, UINT32 = 8, 9, 4


def blob(order: str, strings: list[bytes], lengths: list[int] | None = None, cut: int | None = None) -> bytes:
    """A GGUF with one string array (``lengths`` overrides the length fields written) and a u32 after it."""
    def u32(v):
        return struct.pack(order + "I", v)

    def u64(v):
        return struct.pack(order + "Q", v)

    def string(data: bytes, length: int | None = None) -> bytes:
        return u64(len(data) if length is None else length) + data

    out = bytearray(b"GGUF" + u32(3) + u64(0) + u64(2))
    out += string(b"tokenizer.ggml.tokens") + u32(ARRAY) + u32(STRING) + u64(len(strings))
    for i, s in enumerate(strings):
        out += string(s, None if lengths is None else lengths[i])
    out += string(b"after") + u32(UINT32) + u32(7)
    out += b"\0" * (-len(out) % 32)
    return bytes(out[:cut] if cut is not None else out)


def parse(path: str, native: bool, monkeypatch) -> tuple:
    """(tokens, 'after') or ('error', message) with the walk chosen."""
    monkeypatch.setattr(gguf_values, "NO_NATIVE", not native)
    try:
        parsed = read_gguf(path)
        return list(parsed.metadata["tokenizer.ggml.tokens"]), parsed.metadata["after"]
    except CheckpointError as exc:
        return "error", str(exc)


def vocabulary(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [bytes(rng.integers(97, 123, size=int(k), dtype=np.uint8)) for k in rng.integers(0, 24, size=n)]


def test_the_c_walk_is_built_where_a_compiler_is():
    """With gcc and Python's headers here (scripts/setup.sh installs both) the install built the extension: a
    missing one is a build failure, not a skip, or the tests below would compare the Python loop with itself."""
    if shutil.which("gcc") is None or not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        pytest.skip("no C compiler or no Python headers: the extension is optional")
    assert gguf_values._strings is not None


@pytest.mark.parametrize("order", ["<", ">"])
def test_a_big_vocabulary_reads_the_same_with_both_walks_and_as_gguf_py_reads_it(tmp_path, monkeypatch, order):
    tokens = vocabulary(300_000)
    path = tmp_path / "vocab.gguf"
    path.write_bytes(blob(order, tokens))
    assert path.stat().st_size > 2 * INITIAL_READ  # the walk resumes after more of the header is read
    native, python = parse(str(path), True, monkeypatch), parse(str(path), False, monkeypatch)
    assert native == python
    assert native[0] == [t.decode() for t in tokens] and native[1] == 7
    if order == "<":  # gguf-py's reader: the oracle (it reads little-endian files as such)
        field = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.tokens"]
        assert [bytes(field.parts[i]).decode() for i in field.data] == native[0]


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("case", ["cut in a length", "cut in a body", "length past the end", "length 2^63",
                                  "length 2^64-1", "last body past the end"])
def test_a_bad_string_array_gets_the_same_one_line_error_from_both_walks(tmp_path, monkeypatch, order, case):
    tokens = vocabulary(200_000, seed=1)
    at = 150_000  # past the first load: the walk has resumed once before it meets the defect
    tokens[at] = b"abcdef"
    lengths = [len(t) for t in tokens]
    cut = None
    # where string ``at`` starts: magic, version, counts; the key, value type, element type and count; the strings
    start = 24 + 8 + len(b"tokenizer.ggml.tokens") + 16 + sum(8 + len(t) for t in tokens[:at])
    assert blob(order, tokens)[start:start + 14] == struct.pack(order + "Q", 6) + b"abcdef"
    if case == "cut in a length":
        cut = start + 3
    elif case == "cut in a body":
        cut = start + 8 + 2
    elif case == "length past the end":
        lengths[at] = 10_000_000
    elif case == "length 2^63":
        lengths[at] = 2**63
    elif case == "length 2^64-1":
        lengths[at] = 2**64 - 1
    else:
        lengths[-1] = 10_000
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob(order, tokens, lengths, cut))
    native, python = parse(str(path), True, monkeypatch), parse(str(path), False, monkeypatch)
    assert native == python
    assert native[0] == "error" and str(path) in native[1] and "\n" not in native[1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_string_arrays_agree(tmp_path, monkeypatch, data):
    """Random strings, random length fields overwritten, random cuts: the two walks never disagree."""
    order = data.draw(st.sampled_from("<>"))
    tokens = [bytes(x) for x in data.draw(st.lists(st.binary(max_size=40), min_size=0, max_size=60))]
    lengths = [len(t) for t in tokens]
    for _ in range(data.draw(st.integers(0, 2))):
        if lengths:
            lengths[data.draw(st.integers(0, len(lengths) - 1))] = data.draw(
                st.one_of(st.integers(0, 200), st.integers(2**62 - 64, 2**62 + 64), st.integers(0, 2**64 - 1)))
    full = blob(order, tokens, lengths)
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(full))))
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(full if cut is None else full[:cut])
    assert parse(str(path), True, monkeypatch) == parse(str(path), False, monkeypatch)


def test_no_native_in_the_environment_selects_the_python_loop():
    code = "from ckptfs.formats import gguf_values; print(gguf_values.NO_NATIVE)"
    env = dict(os.environ, CKPTFS_NO_NATIVE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
