"""bitsandbytes layouts (``ckptfs.packed.bnb``) against bitsandbytes itself, bit for bit.

Layers are quantized by bitsandbytes (``quantize_4bit`` with its packed quant state; ``int8_vectorwise_quant``)
or by transformers (``save_pretrained`` of a tiny Llama on CPU), written to a folder, and decoded through the
layout from the folder's stored tensors as ``ckptfs.open`` lists them: whole, and by row ranges that start
and end inside blocks. The float32 values equal bitsandbytes' pure-PyTorch dequantization in float32, and
rounded to the quant state's dtype equal its result in that dtype."""

from __future__ import annotations

import numpy as np
import pytest
from bnb_fixtures import (as_numpy, bnb_config, dequantize_4bit, dequantize_int8, native_dequantize_4bit,
                          quantize_4bit, quantize_int8, saved_by_transformers, stored_layers, write_folder)
from packed_fixtures import require_package, same_bits

import ckptfs
from ckptfs.packed import bnb
from ckptfs.packed.base import Absent, Context
from ckptfs.packed.detect import not_quantized
from ckptfs.packed.native import available as native_available
from ckptfs.packed.views import PartReader

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _bitsandbytes():
    require_package("bitsandbytes")  # the oracle (test-oracles extra): skipped here, a failure in CI

PREFIX = "model.layers.0.mlp.up_proj"


def layout_of(ck, prefix: str, settings: dict):
    """The layer's layout built from its stored parts' headers (``ck.stored``: the codes, where the mount's
    own view stands in their name)."""
    names = set(ck.tensors.names())
    parts = {role: ck.stored(f"{prefix}.{role}").info for role in bnb.ROLES_4BIT + bnb.ROLES_8BIT
             if f"{prefix}.{role}" in names}

    def read_small(info, limit):
        assert info.stored_nbytes <= limit
        return ck.sources.get(info.source).pread(info.offset, info.stored_nbytes)

    return bnb.build(prefix, parts, settings, Context(lambda info: (), read_small))


def decode(ck, layout, o0: int, o1: int) -> np.ndarray:
    """Rows [o0, o1) through numpy and through the C kernel where it is built, which must agree bit for bit
    (into a fresh array, and into a float32 buffer as the view's tiles are decoded)."""
    reader = PartReader(ck, layout, "test")
    values = layout.decode_rows(reader, o0, o1, backend="numpy")
    if layout.kernel is not None and native_available():
        buffer = np.full((o1 - o0) * layout.in_features, np.nan, np.float32)
        assert same_bits(layout.decode_rows(reader, o0, o1, buffer, backend="native"), values)
        assert same_bits(layout.decode_rows(reader, o0, o1, backend="native"), values)
    half = np.empty((o1 - o0) * layout.in_features, np.float16)  # float16: numpy's values, rounded
    assert np.array_equal(layout.decode_rows(reader, o0, o1, half), values.astype(np.float16), equal_nan=True)
    return values


def test_kernel_is_built():
    """The C kernel is part of the build (CI builds it); without it every layer decodes through numpy."""
    if not native_available() or bnb._bnb is None:
        from conftest import skip_or_fail
        skip_or_fail("ckptfs.packed._bnb is not built")
    assert bnb._kernel_built()


def row_ranges(rows: int) -> list[tuple[int, int]]:
    picks = [(0, rows), (0, 1), (rows - 1, rows), (rows // 3, rows // 3 + 2), (1, max(2, rows - 1))]
    return [(a, b) for a, b in picks if 0 <= a < b <= rows]


CASES_4BIT = [(quant_type, double_quant, shape, blocksize)
              for quant_type in ("nf4", "fp4") for double_quant in (False, True)
              for shape, blocksize in (((48, 96), 64), ((37, 100), 64), ((5, 3), 64), ((130, 64), 128),
                                       ((70, 33), 32))]


@pytest.mark.parametrize("quant_type,double_quant,shape,blocksize", CASES_4BIT)
def test_4bit_equals_bitsandbytes(tmp_path, quant_type, double_quant, shape, blocksize):
    """Rows that are not a multiple of the block (blocks straddle rows), an odd element count (a half-used
    last byte), a partial last block, and more than 256 blocks under double quantization (several nested
    scales), in bfloat16 as the release stores the weight."""
    seed = hash((quant_type, double_quant, shape)) % 1000
    torch.manual_seed(seed)
    weight = (torch.randn(*shape) * torch.rand(shape[0], 1) * 3).to(torch.bfloat16)
    tensors = quantize_4bit(weight, quant_type, blocksize, double_quant)
    oracle = as_numpy(dequantize_4bit(tensors, torch.float32))
    oracle_release = dequantize_4bit(tensors)  # in the quant state's dtype: bfloat16
    assert oracle_release.dtype == torch.bfloat16
    folder = write_folder(tmp_path / "m", {PREFIX: tensors}, bnb_config(4, quant_type, double_quant))
    with ckptfs.open(folder) as ck:
        layout = layout_of(ck, PREFIX, bnb_config(4, quant_type, double_quant))
        assert layout.shape == shape
        assert layout.parameters["quant_type"] == quant_type and layout.parameters["blocksize"] == blocksize
        assert layout.parameters["double_quant"] is double_quant
        values = decode(ck, layout, 0, shape[0])
        assert same_bits(values, oracle)
        assert torch.equal(torch.from_numpy(values).to(torch.bfloat16), oracle_release)
        for o0, o1 in row_ranges(shape[0]):
            assert same_bits(decode(ck, layout, o0, o1), oracle[o0:o1]), (o0, o1)


def test_native_cpu_kernel_fault_is_not_copied(tmp_path):
    """bitsandbytes' native CPU ``dequantize_4bit`` scales some values of a [5, 96] weight by another block's
    absmax (96 is not a multiple of 64); its pure-PyTorch path and the view agree with the formula. Where the
    rows are a multiple of the block, the native kernel agrees too."""
    torch.manual_seed(5)
    for shape, faulty in (((5, 96), True), ((4, 128), False)):
        tensors = quantize_4bit(torch.randn(*shape), "nf4", 64)
        oracle = as_numpy(dequantize_4bit(tensors, torch.float32))
        native = as_numpy(native_dequantize_4bit(tensors))
        folder = write_folder(tmp_path / f"m{shape[1]}", {PREFIX: tensors}, bnb_config())
        with ckptfs.open(folder) as ck:
            values = decode(ck, layout_of(ck, PREFIX, bnb_config()), 0, shape[0])
        assert same_bits(values, oracle)
        assert same_bits(values, native) is not faulty, shape


def test_formula_by_hand(tmp_path):
    """One block of 4 values (blocksize 64, n = 4): bytes 0x0F and 0x78 hold codes 0, 15, 7, 8 high nibble
    first; nf4 codes 0/15/7 are -1, 1, 0 and code 8 is 0.0795...; absmax 2: W = 2 * table[code]."""
    state = torch.tensor(list(b'{"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [2, 2]}'),
                         dtype=torch.uint8)
    tensors = {"weight": torch.tensor([[0x0F], [0x78]], dtype=torch.uint8),
               "weight.absmax": torch.tensor([2.0]), "weight.quant_map": torch.from_numpy(bnb.NF4.copy()),
               "weight.quant_state.bitsandbytes__nf4": state}
    folder = write_folder(tmp_path / "m", {PREFIX: tensors}, bnb_config())
    with ckptfs.open(folder) as ck:
        values = decode(ck, layout_of(ck, PREFIX, bnb_config()), 0, 2)
    assert values.tolist() == [[-2.0, 2.0], [0.0, float(np.float32(0.07958029955625534) * np.float32(2))]]
    assert same_bits(values, as_numpy(dequantize_4bit(tensors, torch.float32)))


def test_code_tables_are_bitsandbytes():
    import bitsandbytes.functional as F

    for name, table in bnb.TABLES.items():
        assert same_bits(table, F.get_4bit_type(name, device="cpu").numpy()), name


@pytest.mark.parametrize("shape", [(48, 96), (33, 7), (1, 1000)])
def test_int8_equals_bitsandbytes(tmp_path, shape):
    """LLM.int8: ``(w * SCB) * float32(1/127)``, bit for bit with ``int8_vectorwise_dequant``; a division by 127
    instead differs in the last bit for some of these values."""
    torch.manual_seed(shape[0])
    tensors = quantize_int8(torch.randn(*shape) * torch.rand(shape[0], 1) * 4)
    oracle = as_numpy(dequantize_int8(tensors))
    folder = write_folder(tmp_path / "m", {PREFIX: tensors}, bnb_config(8))
    with ckptfs.open(folder) as ck:
        layout = layout_of(ck, PREFIX, bnb_config(8))
        assert layout.shape == shape and layout.parameters == {"bits": 8, "format": "row"}
        assert same_bits(decode(ck, layout, 0, shape[0]), oracle)
        for o0, o1 in row_ranges(shape[0]):
            assert same_bits(decode(ck, layout, o0, o1), oracle[o0:o1])
    divided = tensors["weight"].numpy().astype(np.float32) * tensors["SCB"].numpy()[:, None] / np.float32(127)
    if shape == (48, 96):
        assert not same_bits(divided, oracle)


@pytest.mark.parametrize("bits", [4, 8])
def test_saved_by_transformers(tmp_path, bits):
    """A tiny Llama quantized and saved by transformers: every quantized layer's view equals bitsandbytes'
    dequantization of what was saved (nf4 with double quantization; LLM.int8); the skipped modules have no
    bitsandbytes parts."""
    pytest.importorskip("transformers")
    options = ({"bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                "bnb_4bit_compute_dtype": torch.bfloat16, "llm_int8_skip_modules": ["lm_head", "down_proj"]}
               if bits == 4 else {})
    folder = saved_by_transformers(tmp_path, bits, **options)
    layers = stored_layers(folder)
    assert len(layers) == (12 if bits == 4 else 14)  # q k v o gate up (+ down when not skipped), 2 layers
    assert any("down_proj" in prefix for prefix in layers) is (bits == 8)
    import json
    settings = json.loads((folder / "config.json").read_text())["quantization_config"]
    with ckptfs.open(folder) as ck:
        for prefix, tensors in layers.items():
            oracle = dequantize_4bit(tensors, torch.float32) if bits == 4 else dequantize_int8(tensors)
            layout = layout_of(ck, prefix, settings)
            assert same_bits(decode(ck, layout, 0, layout.out_features), as_numpy(oracle)), prefix


# ------------------------------------------------------------------------------------------ refused layers

def _state(**doc) -> torch.Tensor:
    import json
    base = {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [8, 16]}
    base.update(doc)
    return torch.tensor(list(json.dumps(base).encode()), dtype=torch.uint8)


def _tensors():
    torch.manual_seed(0)
    return quantize_4bit(torch.randn(8, 16), "nf4", 64)


BAD = {
    "unparsable quant state": (lambda t: t.update({"weight.quant_state.bitsandbytes__nf4":
                                                   torch.tensor(list(b"{not json"), dtype=torch.uint8)}),
                               "is not a JSON quant state"),
    "quant state nested too deep": (lambda t: t.update({"weight.quant_state.bitsandbytes__nf4": torch.tensor(
        list(b"[" * 20_000 + b"]" * 20_000), dtype=torch.uint8)}), "nested too deeply to be read"),
    "block size 0": (lambda t: t.update({"weight.quant_state.bitsandbytes__nf4": _state(blocksize=0)}),
                     "blocksize=0 is not a positive integer"),
    "block size 48": (lambda t: t.update({"weight.quant_state.bitsandbytes__nf4": _state(blocksize=48)}),
                      "blocksize 48 is not one bitsandbytes decodes"),
    "shape too large for the codes": (lambda t: t.update({"weight.quant_state.bitsandbytes__nf4":
                                                          _state(shape=[8, 18])}), "take 72 bytes"),
    "absmax of another shape": (lambda t: t.update({"weight.absmax": torch.ones(3)}), "expects 2 values"),
    "missing quant_map": (lambda t: t.pop("weight.quant_map"), "weight.quant_map is missing"),
    "fp4 state under an nf4 name": (lambda t: t.update({"weight.quant_state.bitsandbytes__nf4":
                                                        _state(quant_type="fp4")}), "not nf4 or fp4"),
    "codes held as float64": (lambda t: t.update({"weight": t["weight"].reshape(-1).view(torch.float64)}),
                              "stored as F64 \\(expected U8 or"),
    "3-D shape": (lambda t: t.update({"weight.quant_state.bitsandbytes__nf4": _state(shape=[2, 4, 16])}),
                  "is not a 2-D weight shape"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_refused_with_a_reason(tmp_path, case):
    change, reason = BAD[case]
    tensors = _tensors()
    change(tensors)
    folder = write_folder(tmp_path / "m", {PREFIX: tensors}, bnb_config())
    with ckptfs.open(folder) as ck:
        with pytest.raises(Absent, match=reason) as info:
            layout_of(ck, PREFIX, bnb_config())
    assert "\n" not in str(info.value)


def test_nested_parts_missing_or_offset_bad(tmp_path):
    torch.manual_seed(1)
    good = quantize_4bit(torch.randn(8, 64), "nf4", 64, double_quant=True)
    for change, reason in ((lambda t: t.pop("weight.nested_absmax"), "nested_absmax is missing"),
                           (lambda t: t.update({"weight.quant_state.bitsandbytes__nf4": _state(
                               shape=[8, 64], nested_blocksize=256, nested_offset="x")}), "nested_offset"),
                           (lambda t: t.update({"weight.quant_state.bitsandbytes__nf4": _state(
                               shape=[8, 64], nested_blocksize=256, nested_offset=1e39)}), "not a finite float32"),
                           (lambda t: t.update({"weight.nested_quant_map": torch.ones(16)}), "expects 256")):
        tensors = dict(good)
        change(tensors)
        folder = write_folder(tmp_path / str(abs(hash(reason))), {PREFIX: tensors}, bnb_config())
        with ckptfs.open(folder) as ck, pytest.raises(Absent, match=reason):
            layout_of(ck, PREFIX, bnb_config())


def test_quant_map_other_than_the_table_is_refused_at_read(tmp_path):
    """bitsandbytes decodes with its own table whatever ``quant_map`` holds: a different stored map is refused
    (no value that one reader would decode one way and another the other)."""
    tensors = _tensors()
    tensors["weight.quant_map"] = tensors["weight.quant_map"] * 2
    folder = write_folder(tmp_path / "m", {PREFIX: tensors}, bnb_config())
    with ckptfs.open(folder) as ck:
        layout = layout_of(ck, PREFIX, bnb_config())
        with pytest.raises(Absent, match="is not bitsandbytes' nf4 table"):
            decode(ck, layout, 0, 8)


def test_int8_refused(tmp_path):
    torch.manual_seed(2)
    good = quantize_int8(torch.randn(6, 10))
    for change, reason in ((lambda t: t.update({"SCB": torch.ones(5)}), "expects 6 values"),
                           (lambda t: t.update({"weight": t["weight"].float()}), "stored as F32")):
        tensors = dict(good)
        change(tensors)
        folder = write_folder(tmp_path / reason.replace(" ", "_"), {PREFIX: tensors}, bnb_config(8))
        with ckptfs.open(folder) as ck, pytest.raises(Absent, match=reason):
            layout_of(ck, PREFIX, bnb_config(8))
    tensors = dict(good, weight_format=torch.tensor(2, dtype=torch.uint8))
    folder = write_folder(tmp_path / "fmt", {PREFIX: tensors}, bnb_config(8))
    with ckptfs.open(folder) as ck:
        layout = layout_of(ck, PREFIX, bnb_config(8))
        with pytest.raises(Absent, match="not 0 \\(row-major\\)"):
            decode(ck, layout, 0, 6)


@pytest.mark.parametrize("pattern,prefix,hit", [
    ("lm_head", "lm_head", True), ("down_proj", "model.layers.0.mlp.down_proj", True),
    ("model.layers.1", "model.layers.1.mlp.up_proj", True), ("model.layers.1", "model.layers.11.mlp.up_proj", False),
    ("model.layers.*.mlp.gate", "model.layers.3.mlp.gate_proj", False), ("mlp.gate", "model.layers.3.mlp.gate", True),
    ("model.layers.*.self_attn", "model.layers.3.self_attn.q_proj", True), ("q_proj", "model.layers.0.k_proj", False)])
def test_skip_modules_as_transformers_matches_them(pattern, prefix, hit):
    from transformers.quantizers.quantizers_utils import should_convert_module

    assert should_convert_module(prefix, [pattern]) is not hit
    assert (not_quantized(prefix, {"llm_int8_skip_modules": [pattern]}) is not None) is hit


@pytest.mark.parametrize("storage", ["bfloat16", "float32"])
def test_codes_stored_in_another_quant_storage(tmp_path, storage):
    """``bnb_4bit_quant_storage``: the same code bytes held as bfloat16 or float32 elements."""
    import bitsandbytes.functional as F

    torch.manual_seed(9)
    codes, state = F.quantize_4bit(torch.randn(24, 40), blocksize=64, compress_statistics=True, quant_type="nf4",
                                   quant_storage=getattr(torch, storage))
    tensors = {"weight": codes, **{f"weight.{k}": v for k, v in state.as_dict(packed=True).items()}}
    assert codes.dtype == getattr(torch, storage)
    oracle = as_numpy(dequantize_4bit(dict(tensors, weight=codes.view(torch.uint8)), torch.float32))
    folder = write_folder(tmp_path / "m", {PREFIX: tensors}, bnb_config(4, "nf4", True))
    with ckptfs.open(folder) as ck:
        layout = layout_of(ck, PREFIX, bnb_config(4, "nf4", True))
        assert same_bits(decode(ck, layout, 0, 24), oracle)
        assert same_bits(decode(ck, layout, 7, 11), oracle[7:11])


def test_kernel_checks_its_buffers():
    """Every index the C kernel would touch is checked first: a buffer too small is a ValueError, nothing
    written."""
    if bnb._bnb is None:
        pytest.skip("ckptfs.packed._bnb is not built")
    codes, table, out = np.zeros(32, np.uint8), bnb.NF4, np.zeros(64, np.float32)
    nested_map, nested_scales = np.ones(256, np.float32), np.ones(1, np.float32)
    bnb._bnb.dequantize_4bit(codes, table, np.ones(1, np.float32), 64, 0, 64, out, None, None, 1, 0, 0.0)
    assert out.tolist() == [-1.0] * 64
    for args, message in [((codes[:31], table, np.ones(1, np.float32), 64, 0, 64, out, None, None, 1, 0, 0.0), "codes"),
                          ((codes, table, np.ones(0, np.float32), 64, 0, 64, out, None, None, 1, 0, 0.0), "absmax"),
                          ((codes, table, np.ones(1, np.float32), 64, 0, 64, out[:63], None, None, 1, 0, 0.0), "output"),
                          ((codes, table[:15], np.ones(1, np.float32), 64, 0, 64, out, None, None, 1, 0, 0.0), "table"),
                          ((codes, table, np.zeros(1, np.uint8), 64, 0, 64, out, nested_map, nested_scales, 256, 256,
                            0.0), "nested scales"),
                          ((codes, table, np.zeros(1, np.uint8), 64, 0, 64, out, nested_map[:255], nested_scales, 256,
                            0, 0.0), "nested scales"),
                          ((codes, table, np.ones(1, np.float32), 0, 0, 64, out, None, None, 1, 0, 0.0), "geometry")]:
        with pytest.raises(ValueError, match=message):
            bnb._bnb.dequantize_4bit(*args)
    with pytest.raises(ValueError, match="SCB"):
        bnb._bnb.dequantize_int8(np.zeros(6, np.int8), np.ones(1, np.float32), 2, 3, np.zeros(6, np.float32))


@pytest.mark.parametrize("double_quant", [False, True])
def test_non_finite_and_extreme_scales(tmp_path, double_quant):
    """Block scales of inf, NaN, -0.0, a subnormal and the float32 maximum (a hostile file, or an overflowing
    nested decode) give the IEEE products bitsandbytes gives (0 · inf is NaN), bit for bit, on both paths."""
    torch.manual_seed(10)
    tensors = quantize_4bit(torch.randn(8, 64), "nf4", 64, double_quant)
    if double_quant:
        tensors["weight.nested_absmax"] = torch.tensor([3e38])          # products overflow to inf
        tensors["weight.nested_quant_map"][0] = float("nan")
        tensors["weight.absmax"][:3] = torch.tensor([0, 255, 128], dtype=torch.uint8)
    else:
        tensors["weight.absmax"][:6] = torch.tensor([float("inf"), float("nan"), -0.0, 1e-40, 3.4028235e38, -2.0])
    oracle = as_numpy(dequantize_4bit(tensors, torch.float32))
    assert not np.isfinite(oracle).all()
    folder = write_folder(tmp_path / "m", {PREFIX: tensors}, bnb_config(4, "nf4", double_quant))
    with ckptfs.open(folder) as ck:
        assert same_bits(decode(ck, layout_of(ck, PREFIX, bnb_config(4, "nf4", double_quant)), 0, 8), oracle)
