"""FP4 views through a real FUSE mount (``NAME.npy`` byte for byte ``np.save`` of the float32 formula, in
float32 and under ``--dtype float16``; the parts' ``.raw`` as stored), and a small read that reads only the
rows under it from the source."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from counting import Counting
from fp4_fixtures import as_numpy, ct_config, ct_layer, nvfp4_formula, write_torch_folder
from mount_expect import npy_bytes
from test_packed_mount import read_at

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.formats.multi import read_checkpoint

pytest.importorskip("compressed_tensors")
PREFIX = "model.layers.2.self_attn.o_proj"


def nvfp4_folder(path, out: int, in_features: int):
    config, tensors = ct_layer("NVFP4", out, in_features, seed=out, edge_scales=False)
    arrays = {k: as_numpy(v) for k, v in tensors.items()}
    expected = nvfp4_formula(arrays["weight_packed"], arrays["weight_scale"], arrays["weight_global_scale"], True)
    folder = write_torch_folder(path, {f"{PREFIX}.{k}": v for k, v in tensors.items()},
                                {"quantization_config": ct_config({"group_0": config}, config["format"])})
    return folder, arrays, expected


def test_nvfp4_view_through_the_mount(tmp_path, mounted):
    folder, arrays, expected = nvfp4_folder(tmp_path / "m", 96, 512)
    mnt = mounted(folder)
    path = mnt / (PREFIX + ".weight.npy")
    data = npy_bytes(expected)
    assert os.path.getsize(path) == len(data)
    rng = np.random.default_rng(0)
    for offset in [0, 128, len(data) - 4096, *rng.integers(0, len(data), 16).tolist()]:
        assert read_at(path, offset, 4096) == data[offset:offset + 4096], offset
    assert path.read_bytes() == data
    assert not (mnt / (PREFIX + ".weight.raw")).exists()
    for role, array in arrays.items():
        assert (mnt / f"{PREFIX}.{role}.raw").read_bytes() == array.tobytes()
    meta = json.loads((mnt / (PREFIX + ".weight.meta.json")).read_text())
    assert (meta["scheme"], meta["shape"], meta["npy_dtype"]) == ("compressed-tensors/nvfp4-pack-quantized", [96, 512], "<f4")
    assert meta["parameters"]["format"] == "nvfp4-pack-quantized"
    assert set(meta["parts"]) == {"weight_packed", "weight_scale", "weight_global_scale"}

    half = mounted(folder, "--dtype", "float16")
    assert (half / (PREFIX + ".weight.npy")).read_bytes() == npy_bytes(expected.astype(np.float16))


def test_a_small_read_reads_only_its_rows(tmp_path):
    """Two rows of a 512 x 4096 NVFP4 layer are decoded from those rows' codes (2048 bytes a row) and scales
    (256 bytes a row) and the 4-byte global scale; 4 KiB of the values through the tile cache (what a mount
    read does) read one tile's (16 rows: 256 KiB of float32)."""
    folder, arrays, expected = nvfp4_folder(tmp_path / "m", 512, 4096)
    calls: list[tuple[int, int]] = []
    ck = Checkpoint(read_checkpoint(str(folder)), str(folder), source_wrapper=lambda s: Counting(s, calls))
    try:
        view = ck[PREFIX + ".weight"]
        calls.clear()
        assert np.array_equal(view[37:39], expected[37:39])
        packed, scale, glob = (ck[f"{PREFIX}.{r}"].info for r in ("weight_packed", "weight_scale",
                                                                   "weight_global_scale"))
        assert sorted(calls) == sorted([(packed.offset + 37 * 2048, 2 * 2048), (scale.offset + 37 * 256, 2 * 256),
                                        (glob.offset, 4)])
        calls.clear()
        start = 37 * 4096 + 100
        assert np.array_equal(view.data.read(start, start + 1024), expected.reshape(-1)[start:start + 1024])
        # the global scale is cached with the parts read whole
        assert sorted(calls) == sorted([(packed.offset + 32 * 2048, 16 * 2048), (scale.offset + 32 * 256, 16 * 256)])
    finally:
        ck.close()
