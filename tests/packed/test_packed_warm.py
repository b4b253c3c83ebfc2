"""Packed views (GPTQ) through the paths that warm and share decoded tensors: ``ckptfs prefetch FOLDER
--cache-dir DIR`` stores the view's tiles in the folder, where a later open finds them, and ``Tensor.shared()``
maps one decoded copy of a view.

Oracle: AutoGPTQ's own torch dequantization (``packed_fixtures.autogptq_dequantize``), which must agree with
the fp16 computation ``Layer.expected`` that the values are compared with bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from cli_runs import run_cli
from packed_fixtures import autogptq_dequantize, gptq_layer, require_package, same_bits, write_folder

import ckptfs

PREFIX = "model.layers.0.mlp.up_proj"
CONFIG = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": True}


def _gptq_folder(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A GPTQ folder with one layer (384 rows of 512: three tiles) and its values as AutoGPTQ computes them."""
    require_package("auto_gptq")
    layer = gptq_layer(np.random.default_rng(31), 384, 512, 4, 32, desc_act=True, zero_range=(0, 16))
    expected = layer.expected()
    assert np.array_equal(autogptq_dequantize(layer.tensors, 4, 32), expected)
    return write_folder(tmp_path / "gptq", {PREFIX: layer.tensors}, CONFIG), expected


def test_prefetch_of_a_gptq_folder_stores_the_view_tiles(tmp_path):
    folder, expected = _gptq_folder(tmp_path)
    cache_dir = tmp_path / "cache"
    result = run_cli("prefetch", str(folder), "--cache-dir", str(cache_dir))
    assert result.returncode == 0, result.stderr
    assert "failed" not in result.stdout, result.stdout
    with ckptfs.open(folder, cache_dir=str(cache_dir)) as ck:
        view = ck[PREFIX + ".weight"]
        data = view.data
        assert data.n_blocks > 2  # several tiles, each its own entry
        assert same_bits(view[0:384], expected)  # tile by tile through the tiers
        stats = ck.cache.tier_stats()
        assert stats["disk"]["hits"] >= data.n_blocks, stats
        assert ck.cache.decoded_bytes == 0  # every tile came from the folder: nothing decoded again


def test_shared_of_a_gptq_view_is_one_mapped_copy(tmp_path):
    folder, expected = _gptq_folder(tmp_path)
    cache_dir = tmp_path / "cache"
    with ckptfs.open(folder, cache_dir=str(cache_dir)) as ck:
        values = ck[PREFIX + ".weight"].shared()
        assert not values.flags.writeable and same_bits(np.asarray(values), expected)
    entries = list((cache_dir / "tensors").rglob("*.e"))
    assert len(entries) == 1
    with ckptfs.open(folder, cache_dir=str(cache_dir)) as ck:  # found, not written again
        again = ck[PREFIX + ".weight"].shared()
        assert same_bits(np.asarray(again), expected)
        assert ck.cache.decoded_bytes == 0
    assert list((cache_dir / "tensors").rglob("*.e")) == entries
