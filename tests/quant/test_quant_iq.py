"""I-quant, ternary, FP4 and 1/2-bit codecs, checked bit for bit against references.

References: gguf-py's ``quants.dequantize`` for every type it decodes, gguf-py's own copies of the grid and
sign tables, and for Q1_0 / Q2_0 (which gguf-py cannot decode) a scalar transcription of ggml's C loop in
tests/reference/scalar_lowbit.py. Block bytes are uniformly random, so every value of every field occurs
(e=255 MXFP4 scales, 0x7F/0xFF NVFP4 scales, every grid row and sign pattern); fp16 scales are additionally
forced to finite values in some blocks and to NaN/inf/zero/subnormal in others. Real quantized data comes
from gguf-py's quantizer where it has one (TQ1_0, TQ2_0, MXFP4). Block counts exceed the codecs' internal
chunk sizes, so chunk boundaries and ragged last chunks are exercised too. TQ1_0/TQ2_0 also have C kernels:
their tests run on the numpy and the native path, and the two are compared bit for bit.
"""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES
from gguf.scripts import gguf_convert_endian

from ckptfs.quant import codec_for, iq_tables, ternary
from ckptfs.quant._common import CHUNK_ELEMENTS
from quant_checks import assert_same_floats, decode_via, raw_blocks, with_paths as paths_for
from reference import scalar_lowbit  # tests/reference (pytest puts tests/ on sys.path)

GGUF_DECODABLE = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
                  "TQ1_0", "TQ2_0", "MXFP4", "NVFP4"]
GGUF_QUANTIZABLE = ["TQ1_0", "TQ2_0", "MXFP4"]
SCALAR_REFERENCE = {"Q1_0": scalar_lowbit.dequantize_q1_0, "Q2_0": scalar_lowbit.dequantize_q2_0}
ALL_TYPES = GGUF_DECODABLE + sorted(SCALAR_REFERENCE)
# docs/interfaces.md: big-endian MXFP4/NVFP4 are decodable "as gguf-py's converter does"; it swaps nothing for them.
BYTE_ONLY_TYPES = {"MXFP4": gguf_convert_endian.byteswap_noop, "NVFP4": gguf_convert_endian.byteswap_noop}

# The numpy decoders of the types the optional C extension also decodes: every test of them runs on each path.
NUMPY_DECODERS = {"TQ1_0": ternary.decode_tq1_0, "TQ2_0": ternary.decode_tq2_0}

# Byte offsets of the fp16 scale in each block (IQ1_M scatters its scale: handled in with_scales).
FP16_SCALE_AT = {"IQ4_NL": 0, "IQ4_XS": 0, "IQ2_XXS": 0, "IQ2_XS": 0, "IQ2_S": 0, "IQ3_XXS": 0, "IQ3_S": 0,
                 "IQ1_S": 0, "TQ1_0": 52, "TQ2_0": 64, "Q1_0": 0, "Q2_0": 0}
# inf, -inf, NaN, negative NaN, +0, -0, smallest subnormal, a negative subnormal, largest finite.
SPECIAL_HALVES = np.array([0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF], dtype=np.uint16)


def with_scales(raw: np.ndarray, name: str, seed: int) -> np.ndarray:
    """Random blocks whose fp16 scale is finite and moderate in every 3rd block and a special value
    (inf, NaN, signed zero, subnormal, max) in every 3rd+1 block; the rest keep their random bytes."""
    rng = np.random.default_rng(seed)
    out = raw.copy()
    n = out.shape[0]
    finite = (rng.standard_normal(n) * 4.0).astype(np.float16).view(np.uint16)
    special = SPECIAL_HALVES[rng.integers(0, SPECIAL_HALVES.size, n)]
    forced = np.arange(n) % 3 < 2
    halves = np.where(np.arange(n) % 3 == 0, finite, special)
    if name == "IQ1_M":
        # fp16 bits of d: nibble k is the top nibble of the k-th u16 of sc[4] at byte 48 (byte 49 + 2k).
        for k in range(4):
            top = ((halves >> (4 * k)) & 15).astype(np.uint8)
            col = out[:, 49 + 2 * k]
            out[:, 49 + 2 * k] = np.where(forced, (col & 0x0F) | (top << 4), col)
    elif name in FP16_SCALE_AT:
        at = FP16_SCALE_AT[name]
        pairs = halves.astype("<u2").view(np.uint8).reshape(n, 2)
        out[forced, at:at + 2] = pairs[forced]
    return out


def scaled_blocks(name: str, n: int, seed: int) -> np.ndarray:
    """Random blocks whose scales ``with_scales`` keeps in a range the I-quant references decode finitely."""
    return with_scales(raw_blocks(name, n, seed), name, seed + 1000)


def decode(name: str, raw: np.ndarray, path: str = "registry") -> np.ndarray:
    return decode_via(name, raw, path, NUMPY_DECODERS)


def with_paths(names: list[str]) -> list[tuple[str, str]]:
    return paths_for(names, NUMPY_DECODERS)


def gguf_dequantize(raw: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gguf_quants.dequantize(raw, GGMLQuantizationType[name])


@pytest.mark.parametrize("name,path", with_paths(GGUF_DECODABLE))
def test_random_blocks_match_gguf_py(name: str, path: str) -> None:
    codec = codec_for(name)
    raw = scaled_blocks(name, 6000 if codec.block_elements <= 64 else 1500, seed=7)
    got = decode(name, raw, path)
    assert got.shape == (raw.shape[0], codec.block_elements)
    assert_same_floats(got, gguf_dequantize(raw, name))


@pytest.mark.parametrize("name", [t for t in ALL_TYPES if t in FP16_SCALE_AT or t == "IQ1_M"])
def test_scale_cases_are_present(name: str) -> None:
    """Guard for the fixture itself: the fp16 scales do produce finite, infinite and NaN outputs."""
    got = decode(name, scaled_blocks(name, 600, seed=3))
    assert np.isfinite(got).any() and np.isinf(got).any() and np.isnan(got).any()


@pytest.mark.parametrize("name", [t for t in ALL_TYPES if t in FP16_SCALE_AT or t == "IQ1_M"])
def test_nan_and_inf_scales_decode_without_warnings(name: str) -> None:
    """NaN/inf scales decode to NaN/inf as in ggml; numpy's RuntimeWarnings about them must not reach users."""
    raw = scaled_blocks(name, 600, seed=3)
    with np.errstate(all="warn"), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not np.isfinite(codec_for(name).dequantize(raw)).all()


@pytest.mark.parametrize("name,path", with_paths(GGUF_QUANTIZABLE))
def test_quantized_data_matches_gguf_py(name: str, path: str) -> None:
    rng = np.random.default_rng(2)
    weights = (rng.standard_normal((32, 1024)) * rng.uniform(1e-3, 10, size=(32, 1))).astype(np.float32)
    weights[0] = 0.0
    raw = gguf_quants.quantize(weights, GGMLQuantizationType[name])
    codec = codec_for(name)
    got = decode(name, raw.reshape(-1, codec.block_bytes), path)
    assert_same_floats(got, gguf_dequantize(raw, name))


@pytest.mark.parametrize("name", sorted(NUMPY_DECODERS))
def test_native_and_numpy_paths_are_bit_identical(name: str) -> None:
    """The C loops must do the numpy path's float32 operations: same bits, NaN payloads included (each value
    is one multiply with at most one NaN operand), on contiguous, strided and read-only inputs."""
    raw = scaled_blocks(name, 3000, seed=11)
    want = decode(name, raw, "numpy").view(np.uint32)
    np.testing.assert_array_equal(decode(name, raw, "native").view(np.uint32), want)
    odd_view = np.concatenate([raw, raw], axis=1)[:, : raw.shape[1]]        # not contiguous
    np.testing.assert_array_equal(decode(name, odd_view, "native").view(np.uint32), want)
    readonly = np.frombuffer(raw.tobytes(), dtype=np.uint8).reshape(raw.shape)
    np.testing.assert_array_equal(decode(name, readonly, "native").view(np.uint32), want)
    assert decode(name, raw[:0], "native").shape == (0, codec_for(name).block_elements)


@pytest.mark.parametrize("name", sorted(SCALAR_REFERENCE))
def test_random_blocks_match_scalar_reference(name: str) -> None:
    raw = scaled_blocks(name, 300, seed=11)
    got = decode(name, raw)
    with np.errstate(all="ignore"):
        want = np.array(SCALAR_REFERENCE[name](raw.tobytes()), dtype=np.float32)
    assert_same_floats(got, want)


@pytest.mark.parametrize("name", sorted(BYTE_ONLY_TYPES))
def test_byte_only_swap_matches_gguf_endian_converter(name: str) -> None:
    codec = codec_for(name)
    le = scaled_blocks(name, 50, seed=9)
    assert gguf_convert_endian.byteswap_tensors[GGMLQuantizationType[name]] is BYTE_ONLY_TYPES[name]
    tensor = types.SimpleNamespace(data=le.reshape(-1).copy())
    for block in range(le.shape[0]):          # gguf-py's own per-block swapper turns LE into BE
        BYTE_ONLY_TYPES[name](tensor, block * codec.block_bytes)
    be = tensor.data.reshape(le.shape)
    assert codec.swap is not None
    assert codec.swap(be).tobytes() == le.tobytes()
    assert_same_floats(decode(name, codec.swap(be)), decode(name, le))


@pytest.mark.parametrize("name", [t for t in ALL_TYPES if t not in BYTE_ONLY_TYPES])
def test_no_swap_where_no_big_endian_layout_is_defined(name: str) -> None:
    assert codec_for(name).swap is None


@pytest.mark.parametrize("name", ALL_TYPES)
def test_geometry_matches_gguf_constants(name: str) -> None:
    codec = codec_for(name)
    assert codec is not None and codec.dtype == np.float32
    qtype = getattr(GGMLQuantizationType, name, None)
    if qtype is not None and qtype in GGML_QUANT_SIZES:
        assert (codec.block_elements, codec.block_bytes) == GGML_QUANT_SIZES[qtype]


@pytest.mark.parametrize("name", ALL_TYPES)
def test_zero_blocks_and_input_untouched(name: str) -> None:
    codec = codec_for(name)
    empty = codec.decode(np.zeros((0, codec.block_bytes), dtype=np.uint8))
    assert empty.size == 0 and empty.dtype == np.float32
    raw = scaled_blocks(name, 64, seed=5)
    before = raw.copy()
    decode(name, raw)
    np.testing.assert_array_equal(raw, before)
    raw.setflags(write=False)                 # what the block engine passes (np.frombuffer of bytes)
    assert_same_floats(decode(name, raw), decode(name, before))


@pytest.mark.parametrize("name", ALL_TYPES)
def test_split_decoding_matches_whole(name: str) -> None:
    """Codecs decode in cache-sized chunks internally: any split of the blocks gives the same values, and
    decoding a non-contiguous (strided) block array equals decoding its contiguous copy."""
    codec = codec_for(name)
    n = 5 * CHUNK_ELEMENTS // (2 * codec.block_elements) + 3        # 2.5 internal chunks and a ragged tail
    raw = scaled_blocks(name, n, seed=13)
    whole = decode(name, raw)
    for cut in (1, n // 3, n - 1):
        assert_same_floats(np.concatenate([decode(name, raw[:cut]), decode(name, raw[cut:])]), whole)
    wide = np.zeros((n, codec.block_bytes + 5), dtype=np.uint8)
    wide[:, 3:3 + codec.block_bytes] = raw
    assert_same_floats(decode(name, wide[:, 3:3 + codec.block_bytes]), whole)


@pytest.mark.parametrize("table, quant", [
    ("IQ2XXS_GRID", "IQ2_XXS"), ("IQ2XS_GRID", "IQ2_XS"), ("IQ2S_GRID", "IQ2_S"), ("IQ1S_GRID", "IQ1_S"),
    ("IQ3XXS_GRID", "IQ3_XXS"), ("IQ3S_GRID", "IQ3_S"),
])
def test_grids_match_gguf_py(table: str, quant: str) -> None:
    cls = getattr(gguf_quants, quant)
    cls.init_grid()
    want = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    got = getattr(iq_tables, table)
    assert got.dtype == np.int8 and got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float32), want)


def test_small_tables_match_gguf_py() -> None:
    assert iq_tables.KSIGNS_IQ2XS.tolist() == list(gguf_quants.IQ2_XXS.ksigns)
    assert iq_tables.KVALUES_IQ4NL.tolist() == list(gguf_quants.IQ4_NL.kvalues)
    assert iq_tables.KVALUES_FP4.tolist() == list(gguf_quants.MXFP4.kvalues)
    assert iq_tables.KVALUES_FP4.tolist() == list(gguf_quants.NVFP4.kvalues)
