"""The C kernel of the FP4/MX views (``_kernels.fp4_rows``, and ``scaled_rows`` for MXFP8) gives the numpy
path's bits, float32 and float16 (overflow to infinity, NaN scales), for compressed-tensors NVFP4, MXFP4,
MXFP8, ModelOpt NVFP4 and gpt-oss' transposed experts; and both equal the float32 formula."""

from __future__ import annotations

import numpy as np
import pytest
from fp4_fixtures import (GPT_OSS_CONFIG, as_numpy, ct_config, ct_layer, ct_mx_formula, gptoss_experts,
                          gptoss_formula, modelopt_nvfp4_layer, nvfp4_formula, write_torch_folder)
from packed_fixtures import same_bits, write_folder

import ckptfs

PREFIX = "model.layers.0.mlp.down_proj"
EXPERTS = "model.layers.0.mlp.experts.gate_up_proj"


def both_backends(folder, name: str) -> dict[str, dict[str, np.ndarray]]:
    values: dict[str, dict[str, np.ndarray]] = {}
    for dtype in ("float32", "float16"):
        for backend in ("numpy", "native"):
            with ckptfs.open(folder, dtype=dtype) as ck:
                view = ck[name]
                data = view.data
                data.backend = backend
                values.setdefault(dtype, {})[backend] = data.read(0, data.n_elements).reshape(view.shape)
    return values


def check(values, expected: np.ndarray) -> None:
    for dtype, pair in values.items():
        assert same_bits(pair["numpy"], pair["native"]), dtype
        with np.errstate(over="ignore"):
            assert same_bits(pair["native"], expected.astype(dtype)), dtype


@pytest.fixture(autouse=True)
def kernel_built():
    from ckptfs.packed.native import available

    if not available():
        pytest.skip("the C kernel is not built")


@pytest.mark.parametrize("preset", ["NVFP4", "MXFP4", "MXFP8"])
def test_compressed_tensors(tmp_path, preset):
    pytest.importorskip("compressed_tensors")
    config, tensors = ct_layer(preset, 70, 320, seed=11)
    a = {k: as_numpy(v) for k, v in tensors.items()}
    if preset == "NVFP4":
        expected = nvfp4_formula(a["weight_packed"], a["weight_scale"], a["weight_global_scale"], True)
    else:
        expected = ct_mx_formula(a.get("weight_packed", a.get("weight")), a["weight_scale"], 4 if preset == "MXFP4" else 8)
    folder = write_torch_folder(tmp_path / "m", {f"{PREFIX}.{k}": v for k, v in tensors.items()},
                                {"quantization_config": ct_config({"group_0": config}, config["format"])})
    check(both_backends(folder, PREFIX + ".weight"), expected)


def test_modelopt_nvfp4(tmp_path):
    layer = modelopt_nvfp4_layer(np.random.default_rng(3), 50, 256)
    a = {k: as_numpy(v) for k, v in layer.items()}
    folder = write_torch_folder(tmp_path / "m", {f"{PREFIX}.{k}": v for k, v in layer.items()},
                                {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}})
    check(both_backends(folder, PREFIX + ".weight"),
          nvfp4_formula(a["weight"], a["weight_scale"], a["weight_scale_2"], False))


def test_gptoss_experts(tmp_path):
    """Tiles of 32 rows (rows of 1088 values) are whole block columns of one expert: the kernel takes them."""
    parts = gptoss_experts(np.random.default_rng(5), 3, 1088, 96)
    stored = {f"{EXPERTS}_{role}": value for role, value in parts.items()}
    folder = write_folder(tmp_path / "m", {}, GPT_OSS_CONFIG, extra_tensors=stored)
    check(both_backends(folder, EXPERTS), gptoss_formula(parts["blocks"], parts["scales"]))


def test_gptoss_row_ranges_that_start_and_end_inside_block_columns(tmp_path):
    """The kernel decodes any view rows of gpt-oss' experts, starting and ending at any nibble of a 32-row
    block column (odd and even) and crossing experts: the formula's bits, float32 and float16, never the
    numpy fallback (the spy sees the kernel take every call)."""
    parts = gptoss_experts(np.random.default_rng(9), 3, 96, 128)
    stored = {f"{EXPERTS}_{role}": value for role, value in parts.items()}
    folder = write_folder(tmp_path / "m", {}, GPT_OSS_CONFIG, extra_tensors=stored)
    expected = gptoss_formula(parts["blocks"], parts["scales"]).reshape(3 * 128, 96)
    ranges = [(0, 1), (1, 2), (3, 36), (7, 8), (31, 33), (33, 64), (120, 140), (127, 129), (5, 383), (200, 384)]
    for dtype in ("float32", "float16"):
        with ckptfs.open(folder, dtype=dtype) as ck:
            data = ck[EXPERTS].data
            layout, taken = data.layout, []
            kernel = layout.kernel

            def spy(reader, o0, o1, dest):
                taken.append(kernel(reader, o0, o1, dest))
                return taken[-1]

            layout.kernel = spy
            data.backend = "native"
            for o0, o1 in ranges:
                got = data._decode(o0, o1).reshape(o1 - o0, 96)
                with np.errstate(over="ignore"):
                    assert same_bits(got, expected[o0:o1].astype(dtype)), (dtype, o0, o1)
            assert taken == [True] * len(ranges)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_transposed_windows_write_exactly_their_values(dtype):
    """The transposed kernel's windows (``offset``: a read's values in place, cut anywhere): stored rows in
    whole and partial 32-row bands (77 = 32 + 32 + 13), in parts of their own, spans from odd and even
    nibbles, windows starting and ending inside output rows and inside bands, smaller than a band: every
    value is the numpy path's, and not one value outside the window is written."""
    from ckptfs.packed import native
    from ckptfs.packed.minifloats import E2M1_DOUBLE_PAIRS, E8M0_HALF, e2m1_rows

    rng = np.random.default_rng(21)
    rows, columns = 77, 5
    codes = rng.integers(0, 256, (rows, columns * 16), dtype=np.uint8)
    scales = E8M0_HALF[rng.integers(100, 140, (rows, columns))]
    scales[3, 1], scales[40, 0] = E8M0_HALF[255], E8M0_HALF[0]
    values = e2m1_rows(codes, scales, 32, pairs=E2M1_DOUBLE_PAIRS)  # [rows, columns * 32]
    cases = [(first, width) for first in (0, 1, 6, 31, 33, 63) for width in (1, 2, 5, 31, 64, 160 - first)]
    for first, width in cases:
        with np.errstate(over="ignore"):
            full = values[:, first:first + width].T.astype(dtype).reshape(-1)  # the output's rows, flattened
        for skip, count in {(0, full.size), (1, full.size - 1), (13, 40), (rows - 1, 2), (5, 200), (76, 1),
                            (full.size - 3, 3), (33, rows * 3 + 7), (0, 1), (0, rows * 3 + 10),
                            (rows + 5, rows * 3 + 1)}:
            if skip + count > full.size or count <= 0:
                continue
            for parts in ([(0, rows)], [(0, 32), (32, 77)], [(0, 64), (64, 77)]):
                buf = np.full(count + 2 * 64, 7, dtype)
                window = buf[64:64 + count]
                for a, b in parts:
                    assert native.fp4_rows(window, codes.reshape(-1)[a * columns * 16:], columns * 16,
                                           E2M1_DOUBLE_PAIRS, scales.reshape(-1)[a * columns:], columns, width,
                                           32, b - a, transpose=True, first=first, out_step=rows, offset=a - skip)
                assert same_bits(window, full[skip:skip + count]), (first, width, skip, count, parts)
                assert (buf[:64] == 7).all() and (buf[64 + count:] == 7).all(), (first, width, skip, count, parts)
