"""Row picks and indexing through the library API: ``t[key]`` gives exactly what numpy gives for the
reference array (shapes, axis order, scalars, Python bools as masks), and a row pick costs its rows, not the
256 KiB groups they lie in (peak memory by tracemalloc), whatever ``cache_size`` is (it is checked, and 0
keeps nothing). References: gguf-py's dequantize and numpy indexing of the reference array.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from fixtures import random_blocks, write_gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

import ckptfs


ROWS, COLS = 8192, 1024                       # Q8_0: 32 blocks (1088 bytes) per row, 4 KiB decoded


ROW_BYTES = COLS * 4


GROUP_BYTES = 256 * 1024                      # blocks.GROUP_TARGET_BYTES: 64 rows of this tensor


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """An embedding-like Q8_0 table (32 MiB decoded) and its reference values from gguf-py."""
    rng = np.random.default_rng(11)
    stored = random_blocks("Q8_0", ROWS * COLS // 32, rng).reshape(ROWS, -1)
    path = tmp_path_factory.mktemp("rows") / "table.gguf"
    write_gguf(path, {"emb": (stored, "Q8_0")})
    return path, dequantize(stored, Q.Q8_0).reshape(ROWS, COLS)


def _peak_while(fn):
    """(result, peak bytes allocated while ``fn`` ran) as tracemalloc sees them (numpy reports its buffers)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        return result, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("cache_size", [0, 1 << 20])
def test_a_stepped_slice_peaks_at_cache_plus_result(table, cache_size):
    path, ref = table
    with ckptfs.open(path, cache_size=cache_size) as ck:
        got, peak = _peak_while(lambda: ck["emb"][::16])
    assert np.array_equal(got, ref[::16])
    # before: every picked row kept its whole 256 KiB group alive until np.stack (512 groups = 128 MiB)
    assert peak <= cache_size + 2 * got.nbytes + 4 * GROUP_BYTES, peak


def test_an_embedding_lookup_costs_its_rows_not_their_groups(table):
    path, ref = table
    ids = [17, 3, 5000, 17]
    with ckptfs.open(path, cache_size=0) as ck:
        got, peak = _peak_while(lambda: ck["emb"][ids])
    assert np.array_equal(got, ref[ids])
    assert peak < GROUP_BYTES // 2, peak  # before: two whole groups decoded (512 KiB) for 16 KiB of rows


@pytest.mark.parametrize("key", [slice(None, None, 3), slice(100, 5000), slice(7000, 10, -7), slice(-3, None),
                                 (slice(10, 400, 2), slice(5, 9)), 4097, -1, (5, [1, 2]), [8191, 0, 0, 64],
                                 (np.array([5, 1]), slice(None, 8))])
def test_row_picks_still_index_like_numpy(table, key):
    path, ref = table
    with ckptfs.open(path, cache_size=0) as ck:
        got = ck["emb"][key]
    want = ref[key]
    assert got.shape == want.shape and np.array_equal(got, want)


def test_a_single_row_does_not_decode_its_group(table):
    path, ref = table
    with ckptfs.open(path, cache_size=0) as ck:
        got, peak = _peak_while(lambda: ck["emb"][4097])
    assert np.array_equal(got, ref[4097]) and peak < GROUP_BYTES // 2, peak


@pytest.mark.parametrize("bad", [-1, -(1 << 30)])
def test_a_negative_cache_size_is_refused(table, bad):
    with pytest.raises(ValueError, match="cache_size"):
        ckptfs.open(table[0], cache_size=bad)


def test_cache_size_zero_keeps_nothing(table):
    path, ref = table
    with ckptfs.open(path, cache_size=0) as ck:
        assert np.array_equal(ck["emb"][10:20], ref[10:20])
        stats = ck.cache.stats()
    assert (stats.entries, stats.bytes) == (0, 0)


def _assert_indexes_like_numpy(tensor, reference: np.ndarray, key) -> None:
    expected = reference[key]
    got = tensor[key]
    assert type(got) is type(expected), key
    assert np.shape(got) == np.shape(expected), key
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name", ["q3", "f3", "q1"])
@pytest.mark.parametrize("key", [True, False, (True,), (True, 0)], ids=repr)
def test_a_python_bool_index_is_a_mask_not_row_one(index_gguf, name, key):
    """numpy reads a Python bool as a 0-d mask (a new axis of length 1 or 0), not as the integer 1 or 0,
    although ``bool`` is a subclass of ``int``."""
    path, refs = index_gguf
    with ckptfs.open(path) as ck:
        _assert_indexes_like_numpy(ck[name], refs[name], key)


@pytest.mark.parametrize("name", ["q3", "f3"])
@pytest.mark.parametrize("key", [(0, slice(None), [1, 2]), (-1, Ellipsis, [3]), (1, slice(None), np.array([0, 5])),
                                 (2, slice(1, 3), np.array([True] * 32 + [False] * 32))],
                         ids=["0,:,list", "-1,...,list", "1,:,array", "2,1:3,mask"])
def test_an_integer_first_index_with_a_later_array_index_orders_axes_like_numpy(index_gguf, name, key):
    """An integer is an advanced index too: with an array index beyond a slice, numpy puts the broadcast
    axes first (``a[0, :, [1, 2]]`` has shape (2, 4)), which indexing the row ``a[0]`` afterwards does not."""
    path, refs = index_gguf
    with ckptfs.open(path) as ck:
        _assert_indexes_like_numpy(ck[name], refs[name], key)


@pytest.mark.parametrize("name, key", [("q1", 0), ("q1", -1), ("q3", (0, 1, 2)), ("f3", (2, -1, 63)),
                                       ("q1", (5, Ellipsis)), ("f3", (0, 1, 2, Ellipsis))], ids=repr)
def test_a_full_integer_index_gives_a_numpy_scalar(index_gguf, name, key):
    """numpy returns a scalar (hashable, ``isinstance(x, np.floating)``) for one element, and a 0-d array
    only where an Ellipsis is in the key."""
    path, refs = index_gguf
    with ckptfs.open(path) as ck:
        _assert_indexes_like_numpy(ck[name], refs[name], key)
