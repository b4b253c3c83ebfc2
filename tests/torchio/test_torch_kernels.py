"""The torch dequantization kernels (ckptfs/torchio/kernels.py), run on the CPU: bit for bit the numpy codecs'
values (the registry path, which is the C kernel where one is built, and the pure-numpy decoder), and
gguf-py's ``quants.dequantize`` as the independent oracle for the GGML types. The same kernels run on a
CUDA device in scripts/gpu_check.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fixtures import Q, random_blocks  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402
from quant_checks import assert_same_floats  # noqa: E402

from ckptfs.quant import codec_for, floats, fp4, iquants, kquants, legacy  # noqa: E402
from ckptfs.torchio import kernels  # noqa: E402

GGML_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
              "IQ4_NL", "IQ4_XS", "MXFP4", "BF16"]
BYTE_TYPES = ["F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4"]
PLAIN_TYPES = ["F32", "F16", "F64", "I8", "I16", "I32", "I64", "U8", "BOOL"]


def numpy_decoder(name: str):
    """The module-level pure-numpy decoder of ``name`` (decode_q4_k, ...), or None if it has none."""
    for module in (legacy, kquants, iquants, fp4, floats):
        fn = getattr(module, f"decode_{name.lower()}", None)
        if fn is not None:
            return fn
    return None


def torch_values(name: str, raw: np.ndarray) -> np.ndarray:
    return kernels.dequantize(name, torch.from_numpy(raw)).numpy()


def test_every_type_the_issue_names_has_a_kernel():
    for name in GGML_TYPES + BYTE_TYPES + ["F16"]:
        assert kernels.has_kernel(name), name


@pytest.mark.parametrize("name", GGML_TYPES)
@pytest.mark.parametrize("scales", ["finite", "any"])
def test_ggml_types_match_the_numpy_codecs_bit_for_bit(name, scales):
    rng = np.random.default_rng(abs(hash((name, scales))) % 2**32)
    codec = codec_for(name)
    if scales == "finite":
        raw = random_blocks(name, 513, rng)
    else:  # every byte random: NaN/inf/subnormal fp16 scales, every E8M0 exponent
        raw = rng.integers(0, 256, (513, codec.block_bytes), dtype=np.uint8)
    got = torch_values(name, raw)
    assert got.shape == (513, codec.block_elements)
    assert_same_floats(got, codec.dequantize(raw))
    reference = numpy_decoder(name)
    if reference is not None:
        with np.errstate(all="ignore"):
            assert_same_floats(got, reference(raw).reshape(got.shape))


@pytest.mark.parametrize("name", GGML_TYPES)
def test_ggml_types_match_gguf_py(name):
    rng = np.random.default_rng(sum(map(ord, name)))
    raw = random_blocks(name, 200, rng)
    with np.errstate(all="ignore"):
        want = gguf_quants.dequantize(raw, Q[name])
    assert_same_floats(torch_values(name, raw), want)


@pytest.mark.parametrize("name", BYTE_TYPES)
def test_small_floats_match_their_tables_for_every_code(name):
    codec = codec_for(name)
    raw = np.arange(256, dtype=np.uint8).reshape(-1, 1)        # every bit pattern
    got = torch_values(name, raw)
    assert_same_floats(got, codec.dequantize(raw))


@pytest.mark.parametrize("name", PLAIN_TYPES)
def test_plain_types_are_their_bytes(name):
    codec = codec_for(name)
    raw = np.random.default_rng(5).integers(0, 256, (100, codec.block_bytes), dtype=np.uint8)
    if name == "BOOL":
        raw &= 1
    got = torch_values(name, raw)
    want = codec.dequantize(raw)
    assert got.dtype == want.dtype
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def test_kernel_input_is_checked():
    with pytest.raises(ValueError, match="uint8"):
        kernels.dequantize("Q8_0", torch.zeros((2, 34), dtype=torch.int8))


def test_zero_blocks_decode_to_an_empty_result():
    got = kernels.dequantize("Q4_K", torch.zeros((0, 144), dtype=torch.uint8))
    assert tuple(got.shape) == (0, 256)
