"""Codecs for plain types, small floats, legacy quants and K-quants, checked bit for bit against references.

References: gguf-py's ``quants.dequantize`` (types it supports), ml_dtypes (F8/F6/F4/BF16 bit patterns), numpy
(plain types, byte order), and a scalar transcription of ggml's loop for Q8_1/Q8_K (tests/reference). Random
block bytes reach every value of every field (NaN/inf scales included); real quantized data comes from
gguf-py's quantizer where it has one. The decode backend (C kernels or numpy) is chosen per call, and
``dequantize_into`` writes the caller's array in place.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
import warnings

import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from gguf.scripts import gguf_convert_endian

from ckptfs.quant import Codec, codec_for, floats, kquants, legacy
from quant_checks import PATHS, assert_same_floats, decode_via, float_bits, raw_blocks, with_paths as paths_for
from reference import scalar_q8  # tests/reference (pytest puts tests/ on sys.path)

GGUF_DECODABLE = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
GGUF_QUANTIZABLE = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
PLAIN = {"F32": "f4", "F16": "f2", "F64": "f8", "I8": "i1", "I16": "i2", "I32": "i4", "I64": "i8",
         "U8": "u1", "U16": "u2", "U32": "u4", "U64": "u8", "BOOL": "b1", "C64": "c8"}
SMALL_FLOATS = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
                "F8_E8M0": ml_dtypes.float8_e8m0fnu, "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz,
                "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz}
GGML_TYPES = ["F32", "F16", "F64", "I8", "I16", "I32", "I64", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
              "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"]
ALL_TYPES = sorted(set(GGML_TYPES) | set(PLAIN) | set(SMALL_FLOATS) | {"F4", "F6_E2M3", "F6_E3M2"})
# gguf-py's endian converter: the block swappers it has, by type (a swap is its own inverse).
# The numpy reference decoders; where the optional C extension is built, the registry uses its kernels instead
# and every quant test runs through all three paths.
NUMPY_DECODERS = {"Q4_0": legacy.decode_q4_0, "Q4_1": legacy.decode_q4_1, "Q5_0": legacy.decode_q5_0,
                  "Q5_1": legacy.decode_q5_1, "Q8_0": legacy.decode_q8_0, "Q8_1": legacy.decode_q8_1,
                  "Q2_K": kquants.decode_q2_k, "Q3_K": kquants.decode_q3_k, "Q4_K": kquants.decode_q4_k,
                  "Q5_K": kquants.decode_q5_k, "Q6_K": kquants.decode_q6_k, "Q8_K": kquants.decode_q8_k,
                  "BF16": floats.decode_bf16}
GGUF_BLOCK_SWAPPERS = {"Q4_0": gguf_convert_endian.byteswap_q4_0, "Q8_0": gguf_convert_endian.byteswap_q8_0,
                       "Q4_K": gguf_convert_endian.byteswap_q4_k, "Q6_K": gguf_convert_endian.byteswap_q6_k}


def reference_dequantize(raw: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gguf_dequantize(raw, GGMLQuantizationType[name])


def decode(name: str, raw: np.ndarray, path: str = "registry") -> np.ndarray:
    return decode_via(name, raw, path, NUMPY_DECODERS)


def with_paths(names: list[str]) -> list[tuple[str, str]]:
    return paths_for(names, NUMPY_DECODERS)


@pytest.mark.parametrize("name,path", with_paths(GGUF_DECODABLE))
def test_random_blocks_match_gguf_py(name: str, path: str) -> None:
    raw = raw_blocks(name, 4000 if codec_for(name).block_elements > 1 else 200_000, seed=1)
    got = decode(name, raw, path)
    assert got.shape == (raw.shape[0], codec_for(name).block_elements)
    assert_same_floats(got.astype(np.float32), reference_dequantize(raw, name))


@pytest.mark.parametrize("name,path", with_paths(GGUF_QUANTIZABLE))
def test_quantized_data_matches_gguf_py(name: str, path: str) -> None:
    rng = np.random.default_rng(2)
    weights = (rng.standard_normal((64, 512)) * rng.uniform(1e-3, 10, size=(64, 1))).astype(np.float32)
    weights[3] = 0.0                      # all-zero rows give d = 0 blocks
    weights[5, ::7] = -0.0
    raw = np.ascontiguousarray(gguf_quantize(weights, GGMLQuantizationType[name])).view(np.uint8)  # F16: float16
    got = decode(name, raw.reshape(-1, codec_for(name).block_bytes), path)
    assert_same_floats(got.astype(np.float32), reference_dequantize(raw, name))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name,scalar", [("Q8_1", scalar_q8.dequantize_q8_1), ("Q8_K", scalar_q8.dequantize_q8_k)])
def test_q8_types_match_scalar_transcription(name: str, scalar, path: str) -> None:
    raw = raw_blocks(name, 300, seed=3)
    with np.errstate(all="ignore"):
        want = np.array(scalar(raw.tobytes()), dtype=np.float32)
    assert_same_floats(decode(name, raw, path), want)


@pytest.mark.parametrize("name", sorted(NUMPY_DECODERS))
def test_native_and_numpy_paths_are_bit_identical(name: str) -> None:
    """The C loops must do the numpy path's float32 operations: same bits, signed zeros and infinities included.

    NaNs compare as NaNs only: when both operands of ``q*d + m`` are NaN, IEEE leaves open whose payload the
    result carries, and numpy 1.26's SIMD add picks the other one than x86 scalar/SSE code does.
    """
    raw = raw_blocks(name, 3000, seed=11)
    want = float_bits(decode(name, raw, "numpy"))
    np.testing.assert_array_equal(float_bits(decode(name, raw, "native")), want)
    odd_view = np.concatenate([raw, raw], axis=1)[:, : raw.shape[1]]        # not contiguous
    np.testing.assert_array_equal(float_bits(decode(name, odd_view, "native")), want)
    readonly = np.frombuffer(raw.tobytes(), dtype=np.uint8).reshape(raw.shape)
    np.testing.assert_array_equal(float_bits(decode(name, readonly, "native")), want)
    assert decode(name, raw[:0], "native").shape == (0, codec_for(name).block_elements)


def test_no_native_environment_variable_forces_numpy() -> None:
    probe = ("from ckptfs.quant import codec_for, floats, legacy, kquants, ternary; "
             "assert codec_for('Q4_0').decode is legacy.decode_q4_0; "
             "assert codec_for('Q6_K').decode is kquants.decode_q6_k; "
             "assert codec_for('TQ2_0').decode is ternary.decode_tq2_0; "
             "assert codec_for('BF16').decode is floats.decode_bf16")
    env = dict(os.environ, CKPTFS_NO_NATIVE="1")
    subprocess.run([sys.executable, "-c", probe], env=env, check=True)


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_plain_types_are_the_stored_values(name: str) -> None:
    raw = raw_blocks(name, 5000, seed=4)
    got = decode(name, raw)
    want = np.frombuffer(raw.tobytes(), dtype="<" + PLAIN[name])
    assert codec_for(name).exact and got.dtype == want.dtype
    assert got.reshape(-1).tobytes() == want.tobytes()


@pytest.mark.parametrize("name", sorted(SMALL_FLOATS))
def test_f8_every_bit_pattern_matches_ml_dtypes(name: str) -> None:
    codes = np.arange(256, dtype=np.uint8)
    assert_same_floats(decode(name, codes.reshape(-1, 1)), codes.view(SMALL_FLOATS[name]).astype(np.float32))


def test_bf16_matches_ml_dtypes() -> None:
    codes = np.arange(1 << 16, dtype="<u2")
    got = decode("BF16", codes.view(np.uint8).reshape(-1, 2))
    assert_same_floats(got, codes.view(ml_dtypes.bfloat16).astype(np.float32))


def test_f4_every_byte_low_nibble_first() -> None:
    codes = np.arange(256, dtype=np.uint8)
    got = decode("F4", codes.reshape(-1, 1))
    fp4 = lambda c: c.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)  # noqa: E731
    want = np.stack([fp4(codes & 15), fp4(codes >> 4)], axis=1)   # element 2i: low nibble of byte i
    assert_same_floats(got, want)


@pytest.mark.parametrize("name,ml_type", [("F6_E2M3", ml_dtypes.float6_e2m3fn), ("F6_E3M2", ml_dtypes.float6_e3m2fn)])
def test_f6_every_code_in_every_position(name: str, ml_type) -> None:
    # Every 6-bit code at each of the 4 positions, next to random neighbours.
    rng = np.random.default_rng(5)
    words = [(code << (6 * pos)) | (int(rng.integers(0, 1 << 24)) & ~(63 << (6 * pos)))
             for pos in range(4) for code in range(64)]
    raw = np.array([list(w.to_bytes(3, "little")) for w in words], dtype=np.uint8)
    # The documented packing, written the simple way: element k = bits 6k..6k+5 of the little-endian word.
    codes = np.array([[(int.from_bytes(bytes(block), "little") >> (6 * k)) & 63 for k in range(4)] for block in raw],
                     dtype=np.uint8)
    assert_same_floats(decode(name, raw), codes.view(ml_type).astype(np.float32))


@pytest.mark.parametrize("name", ALL_TYPES)
def test_zero_blocks(name: str) -> None:
    codec = codec_for(name)
    out = codec.dequantize(np.empty((0, codec.block_bytes), dtype=np.uint8))
    assert out.shape == (0, codec.block_elements) and out.dtype == codec.dtype


@pytest.mark.parametrize("name,path", with_paths(ALL_TYPES))
def test_decode_leaves_input_untouched(name: str, path: str) -> None:
    raw = raw_blocks(name, 64, seed=6)
    before = raw.copy()
    decode(name, raw, path)
    np.testing.assert_array_equal(raw, before)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_output_dtype(name: str) -> None:
    codec = codec_for(name)
    out = decode(name, raw_blocks(name, 8, seed=7))
    assert out.dtype == codec.dtype
    assert codec.exact == (name in PLAIN)
    assert codec.exact or codec.dtype == np.float32


@pytest.mark.parametrize("name", GGML_TYPES)
def test_geometry_matches_ggml(name: str) -> None:
    codec = codec_for(name)
    block_elements, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    if name == "Q8_1":
        block_bytes = 36          # ggml's current block; gguf-py's table still has the old 40-byte layout
    assert (codec.block_elements, codec.block_bytes) == (block_elements, block_bytes)


@pytest.mark.parametrize("name,bits", [("BOOL", 8), ("U8", 8), ("U16", 16), ("U32", 32), ("U64", 64), ("C64", 64),
                                       ("F8_E4M3", 8), ("F8_E5M2", 8), ("F8_E8M0", 8), ("F8_E4M3FNUZ", 8),
                                       ("F8_E5M2FNUZ", 8), ("F4", 4), ("F6_E2M3", 6), ("F6_E3M2", 6)])
def test_geometry_of_safetensors_types(name: str, bits: int) -> None:
    codec = codec_for(name)
    assert codec.block_bytes * 8 == codec.block_elements * bits


@pytest.mark.parametrize("name", sorted(set(PLAIN) | {"BF16"}))
def test_plain_swap_matches_numpy_byte_order(name: str) -> None:
    codec = codec_for(name)
    le = raw_blocks(name, 1000, seed=8)
    dt = np.dtype("u2") if name == "BF16" else np.dtype(PLAIN[name])
    be = np.frombuffer(le.tobytes(), dtype=dt.newbyteorder("<")).astype(dt.newbyteorder(">"))
    be_blocks = np.frombuffer(be.tobytes(), dtype=np.uint8).reshape(le.shape)
    swapped = codec.swap(be_blocks)
    assert swapped.tobytes() == le.tobytes()
    assert decode(name, swapped).tobytes() == decode(name, le).tobytes()


@pytest.mark.parametrize("name", sorted(GGUF_BLOCK_SWAPPERS))
def test_quant_swap_matches_gguf_endian_converter(name: str) -> None:
    codec = codec_for(name)
    le = raw_blocks(name, 300, seed=9)
    tensor = types.SimpleNamespace(data=le.reshape(-1).copy())
    for block in range(le.shape[0]):          # gguf-py's own per-block swapper turns LE into BE
        GGUF_BLOCK_SWAPPERS[name](tensor, block * codec.block_bytes)
    be = tensor.data.reshape(le.shape)
    assert be.tobytes() != le.tobytes()
    assert codec.swap(be).tobytes() == le.tobytes()
    assert_same_floats(decode(name, codec.swap(be)), decode(name, le))


@pytest.mark.parametrize("name", ["Q4_1", "Q5_0", "Q5_1", "Q8_1", "Q2_K", "Q3_K", "Q5_K", "Q8_K", "F4", "F6_E2M3"])
def test_no_swap_where_no_big_endian_layout_is_defined(name: str) -> None:
    assert codec_for(name).swap is None


def test_flat_buffer_and_partial_block_handling() -> None:
    codec = codec_for("Q4_0")
    raw = raw_blocks("Q4_0", 10, seed=10)
    np.testing.assert_array_equal(float_bits(codec.dequantize(raw.reshape(-1))), float_bits(decode("Q4_0", raw)))
    np.testing.assert_array_equal(float_bits(codec.dequantize(raw.tobytes())), float_bits(decode("Q4_0", raw)))
    with pytest.raises(ValueError):
        codec.dequantize(raw.reshape(-1)[:-1])


@pytest.mark.parametrize("name", ["F32", "I8", "Q4_0", "Q6_K", "BF16"])
def test_wrong_block_shapes_raise(name: str) -> None:
    """The fast argument path of dequantize must still refuse every shape that is not (n, block_bytes)."""
    codec = codec_for(name)
    raw = raw_blocks(name, 6, seed=12)
    bad = [raw[:, :-1], np.concatenate([raw, raw[:, :1]], axis=1), raw.reshape(2, 3, -1), np.zeros((), dtype=np.uint8)]
    if codec.block_bytes > 1:
        bad += [raw.reshape(-1, 1), raw.reshape(-1)[:-1], raw.tobytes()[:-1]]
    for blocks in bad:
        with pytest.raises(ValueError):
            codec.dequantize(blocks)


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_plain_types_are_zero_copy_views(name: str) -> None:
    raw = raw_blocks(name, 100, seed=13)
    got = codec_for(name).dequantize(raw)
    assert got.shape == (100, 1) and np.shares_memory(got, raw)
    reversed_bytes = raw[:, ::-1]                       # a strided last axis cannot be viewed: decoded from a copy
    want = np.frombuffer(np.ascontiguousarray(reversed_bytes).tobytes(), dtype="<" + PLAIN[name])
    assert codec_for(name).dequantize(reversed_bytes).reshape(-1).tobytes() == want.tobytes()


@pytest.mark.parametrize("name", sorted(set(NUMPY_DECODERS) - {"BF16"}))       # BF16 does no arithmetic
def test_nan_and_inf_scales_decode_without_warnings(name: str) -> None:
    """Random blocks hold NaN/inf scales, which ggml decodes to NaN/inf: dequantize must not let numpy's
    RuntimeWarnings about them reach users. The bare numpy decoder does warn (so the check can fail)."""
    raw = raw_blocks(name, 3000, seed=14)
    registry = codec_for(name)
    numpy_codec = Codec(name, registry.block_elements, registry.block_bytes, registry.dtype, NUMPY_DECODERS[name])
    with np.errstate(all="warn"):
        with pytest.warns(RuntimeWarning):
            NUMPY_DECODERS[name](raw)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for codec in (registry, numpy_codec):
                assert not np.isfinite(codec.dequantize(raw)).all()


def test_decode_backends_are_chosen_per_call_and_decode_into_writes_in_place():
    from ckptfs.quant import codec_for, known_types
    from ckptfs.quant.native import native_types
    from fixtures import GGML_GEOMETRY, random_blocks

    rng = np.random.default_rng(3)
    if not native_types():
        pytest.skip("the C kernels are not built here")  # setup.sh builds them; the numpy path is tested anyway
    for name in sorted(native_types()):
        codec = codec_for(name)
        blocks = random_blocks(name, 5, rng)
        reference = codec.dequantize(blocks, backend="numpy")
        native = codec.dequantize(blocks, backend="native")
        assert reference.tobytes() == native.tobytes(), name
        out = np.full(5 * codec.block_elements, np.nan, codec.dtype)
        assert codec.dequantize_into(blocks, out) is out and out.tobytes() == reference.tobytes(), name
    plain = next(t for t in known_types()
                 if t in GGML_GEOMETRY and t not in native_types() and not codec_for(t).exact)
    with pytest.raises(ValueError, match="no native kernel"):
        codec_for(plain).dequantize(random_blocks(plain, 1, rng), backend="native")
    with pytest.raises(ValueError, match="unknown decode backend"):
        codec_for("Q8_0").dequantize(random_blocks("Q8_0", 1, rng), backend="gpu")
