"""The block cache: bounded in bytes, LRU, exact counters, one decode per key under concurrency."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ckptfs.cache.tiered import BlockCache, TieredCache


def loader(n: int, calls: list):
    def load():
        calls.append(n)
        return np.full(n, 1, np.uint8)
    return load


def test_hits_misses_and_byte_bound():
    cache = TieredCache([BlockCache(300)])
    calls: list = []
    for key in "abc":
        cache.get_or_load(key, loader(100, calls))
    assert cache.get_or_load("a", loader(100, calls)).nbytes == 100
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions, stats.bytes) == (1, 3, 0, 300)
    cache.get_or_load("d", loader(100, calls))  # evicts the least recently used: "b"
    assert "b" not in cache and "a" in cache and "d" in cache
    assert cache.stats().evictions == 1 and cache.stats().bytes <= 300


def test_value_larger_than_capacity_is_returned_but_not_kept():
    cache = TieredCache([BlockCache(10)])
    value = cache.get_or_load("big", loader(100, []))
    assert value.size == 100 and "big" not in cache and cache.stats().bytes == 0


def test_cached_values_are_read_only():
    cache = TieredCache([BlockCache(1000)])
    value = cache.get_or_load("k", loader(10, []))
    with pytest.raises(ValueError):
        value[0] = 2


def test_concurrent_misses_decode_once():
    cache = TieredCache([BlockCache(1 << 20)])
    calls: list = []

    def slow():
        calls.append(1)
        time.sleep(0.2)
        return np.zeros(10, np.float32)

    threads = [threading.Thread(target=cache.get_or_load, args=("k", slow)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1


def test_loader_error_reaches_every_waiter_and_is_not_cached():
    cache = TieredCache([BlockCache(1000)])

    def boom():
        raise RuntimeError("decode failed")

    with pytest.raises(RuntimeError):
        cache.get_or_load("k", boom)
    assert "k" not in cache
    assert cache.get_or_load("k", loader(5, [])).size == 5
