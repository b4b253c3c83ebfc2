"""The optional C kernel for GPTQ and AWQ views (ckptfs/packed/_kernels.c) against the numpy path and the oracles.

Both backends decode the same fixtures; their values are compared bit for bit (float32 and float16 views),
and each against the references the numpy tests use: AutoGPTQ's torch dequantization, AutoAWQ's
``dequantize_gemm``, the scalar transcriptions of tests/reference/scalar_packed.py and the fp16 computation
of the fixtures (``Layer.expected``). The kernel's rounding step is compared with numpy's own conversions on
edge and random bit patterns. The fallback to numpy (extension not built, disabled, or declining a call) is
exercised with monkeypatch.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import skip_or_fail
from packed_fixtures import (same_bits, autoawq_dequantize_gemm, autogptq_dequantize, awq_gemm_layer, awq_gemv_layer,
                             compressed_config, compressed_layer, gptq_layer, require_package, write_folder)
from reference import scalar_packed

import ckptfs
from ckptfs.packed import native
from ckptfs.packed.views import PartReader

PREFIX = "model.layers.0.self_attn.q_proj"
NAME = PREFIX + ".weight"


@pytest.fixture(autouse=True)
def _kernel_built():
    if not native.available():
        skip_or_fail("ckptfs.packed._kernels is not built (python setup.py build_ext --inplace)")


def gptq_config(bits, group_size, desc_act=False, fmt=None):
    config = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": desc_act, "sym": True}
    if fmt:
        config["checkpoint_format"] = fmt
    return config


def awq_config(group_size, version):
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": version}


def decoded(folder, backend, dtype="float32", ranges=((0, None),)):
    """The whole view, a tile-path row slice, and rows decoded range by range (odd starts: AWQ's 8-row
    blocks entered mid-way), each by ``backend``, from a fresh checkpoint (tiles are cached per checkpoint)."""
    with ckptfs.open(folder, dtype=dtype) as ck:
        view = ck[NAME]
        view.data.backend = backend
        whole = view.numpy()
        sliced = view[3:17]
        reader = PartReader(ck, view.layout, view.name)
        parts = []
        for o0, o1 in ranges:
            o1 = view.shape[0] if o1 is None else min(o1, view.shape[0])
            out = np.empty((o1 - o0) * view.shape[1], view.dtype)
            parts.append(view.layout.decode_rows(reader, o0, o1, out, backend=backend).copy())
            if dtype == "float32":  # and without a buffer given: a new float32 array
                parts.append(view.layout.decode_rows(reader, o0, o1, backend=backend))
    return whole, sliced, parts


def assert_backends_agree(folder, expected, dtype="float32", ranges=((0, None), (1, 2), (5, 23), (13, 40))):
    n_whole, n_sliced, n_parts = decoded(folder, "numpy", dtype, ranges)
    c_whole, c_sliced, c_parts = decoded(folder, "native", dtype, ranges)
    a_whole, _, _ = decoded(folder, None, dtype, ranges)
    want = expected.astype(dtype)
    assert same_bits(n_whole, want) and same_bits(c_whole, want) and same_bits(a_whole, want)
    assert same_bits(c_sliced, want[3:17]) and same_bits(n_sliced, c_sliced)
    assert len(n_parts) == len(c_parts)
    for n, c in zip(n_parts, c_parts):
        assert same_bits(n, c)


# ------------------------------------------------------------------------------------------------- GPTQ

@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group_size,desc_act", [(32, False), (32, True), (-1, False), (48, True), (16, False)])
def test_gptq_v1_native_equals_numpy_and_autogptq(tmp_path, bits, group_size, desc_act):
    require_package("auto_gptq")
    rng = np.random.default_rng(1000 + bits * 10 + group_size)
    layer = gptq_layer(rng, 96, 192, bits, group_size, desc_act=desc_act, zero_range=(0, 2 ** bits))
    oracle = autogptq_dequantize(layer.tensors, bits, group_size)
    expected = layer.expected()
    assert np.array_equal(oracle, expected)  # by value: the identity matmul hides a zero's sign
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, gptq_config(bits, group_size, desc_act))
    assert_backends_agree(folder, expected)
    assert_backends_agree(folder, expected, dtype="float16")


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("with_g_idx", [True, False])
def test_gptq_v2_and_no_g_idx_native_equals_scalar(tmp_path, bits, with_g_idx):
    """v2 zero points (stored as is, 0 included) and layers without g_idx: groups i // group_size."""
    layer = gptq_layer(np.random.default_rng(bits), 40, 128, bits, 32, v2=True, with_g_idx=with_g_idx)
    t = layer.tensors
    g_idx = t.get("g_idx", np.arange(128) // 32)
    scalar = scalar_packed.gptq_dequantize(t["qweight"], t["qzeros"], t["scales"], g_idx, bits, v2=True)
    assert same_bits(scalar, layer.expected())
    folder = write_folder(tmp_path / "m", {PREFIX: t}, gptq_config(bits, 32, fmt="gptq_v2"))
    assert_backends_agree(folder, scalar)


def test_gptq_8bit_with_small_groups_computes_each_value(tmp_path):
    """8 bits in groups of 16: 256 possible values per group outnumber a group's 16, so the kernel computes
    each value instead of filling a table (its other loop)."""
    require_package("auto_gptq")
    layer = gptq_layer(np.random.default_rng(81), 32, 64, 8, 16, desc_act=True, zero_range=(0, 256))
    oracle = autogptq_dequantize(layer.tensors, 8, 16)
    assert np.array_equal(oracle, layer.expected())
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, gptq_config(8, 16, True))
    assert_backends_agree(folder, layer.expected())


@pytest.mark.parametrize("scale", [3e-6, 5000.0, 2.0 ** -24])
def test_gptq_subnormal_and_overflowing_products(tmp_path, scale):
    layer = gptq_layer(np.random.default_rng(4), 48, 128, 4, 32, zero_range=(0, 16))
    layer.tensors["scales"] = (layer.tensors["scales"].astype(np.float32) / 0.05 * scale).astype(np.float16)
    layer.scales = layer.tensors["scales"].astype(np.float32)[layer.extra["g_idx"]].T.copy()
    expected = layer.expected()
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, gptq_config(4, 32))
    assert_backends_agree(folder, expected)
    assert_backends_agree(folder, expected, dtype="float16")


@pytest.mark.parametrize("scale_type", ["float16", "bfloat16", "float32"])
def test_gptq_special_scales_and_scale_types(tmp_path, scale_type):
    """NaN, infinities, zeros of both signs, the largest and smallest scales of each type, and bf16/f32
    scales (rounded to bf16 on the bits, or not at all): both backends give the same bits, float32 and
    float16 views."""
    import ml_dtypes
    import torch

    layer = gptq_layer(np.random.default_rng(12), 32, 64, 4, 16, zero_range=(0, 16))
    np_type = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[scale_type]
    scales = layer.tensors["scales"].astype(np.float32)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0, 6e-8, -6e-8, 3.0e38, 1.2e-38, 1e-45, 4097.0]
    scales.reshape(-1)[:len(specials)] = specials
    with np.errstate(over="ignore"):
        stored = scales.astype(np_type)
    layer.tensors["scales"] = stored
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, gptq_config(4, 16))
    g = layer.extra["g_idx"]
    wide = torch.from_numpy(stored.astype(np.float32)).to(getattr(torch, scale_type))
    diff = torch.from_numpy((layer.q.astype(np.int32) - layer.zeros.astype(np.int32)).astype(np.float32))
    expected = (diff.to(wide.dtype) * wide[torch.from_numpy(g)].T).float().numpy()
    with np.errstate(all="ignore"):
        for dtype in ("float32", "float16"):
            n_whole, _, _ = decoded(folder, "numpy", dtype)
            c_whole, c_sliced, _ = decoded(folder, "native", dtype)
            assert same_bits(n_whole, c_whole) and same_bits(c_sliced, c_whole[3:17])
            finite = np.isfinite(expected)
            assert np.array_equal(c_whole[finite], expected[finite].astype(dtype))
            assert np.array_equal(np.isnan(c_whole), np.isnan(expected))


# -------------------------------------------------------------------------------------------------- AWQ

@pytest.mark.parametrize("group_size", [32, 64, -1])
def test_awq_gemm_native_equals_numpy_and_autoawq(tmp_path, group_size):
    require_package("awq")
    layer = awq_gemm_layer(np.random.default_rng(group_size + 20), 120, 256, group_size)
    oracle = autoawq_dequantize_gemm(layer.tensors, group_size)
    assert same_bits(oracle, layer.expected())
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, awq_config(group_size, "gemm"))
    ranges = ((0, None), (0, 8), (13, 99), (7, 9), (119, 120))  # rows entering 8-row blocks mid-way
    assert_backends_agree(folder, oracle, ranges=ranges)
    assert_backends_agree(folder, oracle, dtype="float16", ranges=ranges)


@pytest.mark.parametrize("group_size", [32, 128])
def test_awq_gemv_native_equals_numpy_and_scalar(tmp_path, group_size):
    layer = awq_gemv_layer(np.random.default_rng(group_size + 5), 48, 512, group_size)
    t = layer.tensors
    scalar = scalar_packed.awq_gemv_dequantize(t["qweight"], t["qzeros"], t["scales"], group_size)
    folder = write_folder(tmp_path / "m", {PREFIX: t}, awq_config(group_size, "gemv"))
    assert_backends_agree(folder, scalar)
    assert_backends_agree(folder, scalar, dtype="float16")


# ------------------------------------------------------------------------------- the rounding step alone

def edge_patterns() -> np.ndarray:
    """float32 bit patterns around every float16 and bfloat16 rounding boundary and range edge."""
    rng = np.random.default_rng(5)
    halves = np.arange(1 << 16, dtype=np.int64)
    f16_bits = halves.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32).astype(np.int64)
    around = [f16_bits + d for d in (-1, 0, 1)]
    midpoints = [f16_bits + (1 << 12) + d for d in (-1, 0, 1)]  # halfway to the next float16 (normal range)
    sub = np.arange(0x33000000 - 4, 0x38800000 + 4, 997, dtype=np.int64)  # the subnormal range, densely
    bf = [(halves << 16) + d for d in (0x7FFF, 0x8000, 0x8001, 0xFFFF)]
    extremes = np.array([0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x477FEFFF, 0x477FF000, 0x47800000,
                         0x33000000, 0x33000001, 0x7F7FFFFF], np.int64)
    values = np.concatenate([*around, *midpoints, sub, *bf, extremes, rng.integers(0, 2 ** 32, 1 << 20)])
    values = (values & 0xFFFFFFFF).astype(np.uint32)
    values = np.concatenate([values, values | np.uint32(0x80000000)])
    keep = ~np.isnan(values.view(np.float32)) | ((values & np.uint32(0x00400000)) != 0)  # quiet NaNs only:
    return values[keep].view(np.float32)  # products are never signaling (a multiply quiets them)


def test_convert_equals_numpy_conversions():
    from ckptfs.packed.bits import round_to

    x = edge_patterns()
    out32 = np.empty(x.size, np.float32)
    out16 = np.empty(x.size, np.float16)
    with np.errstate(all="ignore"):
        native._kernels.convert(x, out32, native.ROUNDING["F16"], 0)
        assert same_bits(out32, round_to(x.copy(), "F16"))                       # numpy's float16 conversion
        native._kernels.convert(x, out16, native.ROUNDING["F16"], 1)
        assert same_bits(out16, x.astype(np.float16))
        native._kernels.convert(x, out32, native.ROUNDING["BF16"], 0)
        assert same_bits(out32, round_to(x.copy(), "BF16"))
        import ml_dtypes
        assert same_bits(out32[~np.isnan(x)], x[~np.isnan(x)].astype(ml_dtypes.bfloat16).astype(np.float32))
        native._kernels.convert(x, out16, native.ROUNDING["F32"], 1)
        assert same_bits(out16, x.astype(np.float16))
        native._kernels.convert(x, out32, native.ROUNDING["F32"], 0)
        assert same_bits(out32, x)


# ------------------------------------------------------------------------------------------- fallbacks

def test_fallback_without_the_extension(tmp_path, monkeypatch):
    """Not built (or CKPTFS_NO_NATIVE=1): auto decodes through numpy, the same values; native refuses."""
    layer = gptq_layer(np.random.default_rng(2), 32, 64, 3, 16, desc_act=True)
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, gptq_config(3, 16, True))
    calls = []
    real = native._kernels.dequantize_rows
    monkeypatch.setattr(native._kernels, "dequantize_rows", lambda *a: calls.append(1) or real(*a))
    assert same_bits(decoded(folder, None)[0], layer.expected()) and calls  # auto: the kernel, when built
    for attribute, value in (("_kernels", None), ("DISABLED", True)):
        with monkeypatch.context() as patch:
            patch.setattr(native, attribute, value)
            calls.clear()
            assert not native.available()
            whole, sliced, parts = decoded(folder, None)
            assert same_bits(whole, layer.expected()) and same_bits(sliced, layer.expected()[3:17])
            assert not calls
            with pytest.raises(ValueError, match="no native kernel"):
                decoded(folder, "native")
    with pytest.raises(ValueError, match="unknown decode backend"):
        decoded(folder, "cuda")


def test_fallback_when_the_kernel_declines(tmp_path, monkeypatch):
    """A call the kernel does not take (here: all of them) is decoded by numpy, never left unwritten."""
    layer = awq_gemm_layer(np.random.default_rng(3), 32, 64, 32)
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, awq_config(32, "gemm"))
    monkeypatch.setattr(native, "dequantize_rows", lambda *a, **k: False)
    for dtype in ("float32", "float16"):
        whole, sliced, _ = decoded(folder, "native", dtype)
        assert same_bits(whole, layer.expected().astype(dtype)) and same_bits(sliced, whole[3:17])
    out = np.empty((4, 64), np.float32)[:, ::2]  # not contiguous: the wrapper declines it
    monkeypatch.undo()
    assert native.dequantize_rows(out, np.zeros((4, 4), np.uint32), 4, 32, np.zeros((4, 1), np.int16),
                                  np.ones((4, 1), np.float32), 32, "F16") is False


def test_compressed_tensors_has_no_kernel(tmp_path):
    pytest.importorskip("compressed_tensors")
    layer = compressed_layer(np.random.default_rng(1), 16, 64, 4, "group", 32, True, "float16")
    config = compressed_config({"group_0": layer.extra["scheme"]})
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, config)
    with pytest.raises(ValueError, match="no native kernel"):
        decoded(folder, "native")
    assert same_bits(decoded(folder, None)[0], decoded(folder, "numpy")[0])


def test_kernel_checks_its_buffers():
    """Sizes and group indices are checked before anything is written (a ValueError, never a stray write)."""
    k = native._kernels
    words, zeros, scales = np.zeros((2, 4), np.uint32), np.zeros((2, 1), np.int16), np.ones((2, 1), np.float32)
    out = np.empty(2 * 32, np.float32)
    k.dequantize_rows(0, words, 4, 1, 4, 32, 0, zeros, scales, 1, None, 32, 1, out, 0, 2)
    assert (out == 0).all()
    k.dequantize_rows(0, words, 1, 2, 4, 32, 0, zeros, scales, 1, None, 32, 1, out, 0, 2)  # strided columns
    bad = [
        (0, words, 4, 1, 4, 32, 0, zeros, scales, 1, None, 32, 1, out[:63], 0, 2),        # output too small
        (0, words, 4, 1, 4, 40, 0, zeros, scales, 1, None, 40, 1, out, 0, 2),             # fields beyond words
        (0, words, 1, 3, 4, 32, 0, zeros, scales, 1, None, 32, 1, out, 0, 2),             # column stride too long
        (0, words, 4, 0, 4, 32, 0, zeros, scales, 1, None, 32, 1, out, 0, 2),             # no word step
        (0, words, 4, 1, 5, 32, 0, zeros, scales, 1, None, 32, 1, out, 0, 2),             # bits
        (0, words, 4, 1, 4, 32, 0, zeros, scales, 1, np.full(32, 1, np.int64), 32, 1, out, 0, 2),  # g out of range
        (1, words, 4, 1, 4, 32, 3, zeros, scales, 1, None, 32, 1, out, 0, 2),             # AWQ blocks too short
        (0, words, 4, 1, 4, 32, 0, zeros, scales, 1, None, 16, 1, out, 0, 2),             # too few groups
    ]
    for args in bad:
        with pytest.raises(ValueError):
            k.dequantize_rows(*args)
