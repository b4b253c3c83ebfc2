"""The ``dtype=`` of ``Tensor.to_torch`` and ``ckptfs.load`` (docs/torch.md, "dtype"): floating values only as
float32/float16/bfloat16/float64 (anything else a ValueError naming the tensor and the dtype, where torch's
cast gave zeros or all True); integer and bool storage in the dtype asked for where that holds every value
of its type, else its own. The oracle for "holds exactly" is torch itself: the storage type's extremes cast
to the dtype keep their values."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fixtures import all_dtype_tensors, write_mixed_gguf, write_safetensors  # noqa: E402

import ckptfs  # noqa: E402

FLOATING = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
NOT_FOR_FLOATS = (torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn,
                  torch.float8_e5m2, torch.complex64, torch.complex128)
INTEGER_TARGETS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32,
                   torch.uint64, torch.bool, *FLOATING, torch.float8_e4m3fn, torch.complex64)
INTEGER_STORAGE = ("t.i8", "t.i16", "t.i32", "t.i64", "t.u8", "t.u16", "t.u32", "t.u64", "t.bool")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return write_mixed_gguf(tmp_path_factory.mktemp("dtypes") / "mixed.gguf")


@pytest.fixture(scope="module")
def every(tmp_path_factory):
    """Every safetensors dtype (integers with their extremes included), and safetensors' own torch tensors."""
    from safetensors.torch import load_file

    tensors = {n: v for n, v in all_dtype_tensors().items() if not isinstance(v, tuple)}
    for name in INTEGER_STORAGE[:-1]:  # the type's min and max in the first two elements
        values = tensors[name].copy()
        info = np.iinfo(values.dtype)
        values.flat[0], values.flat[1] = info.min, info.max
        tensors[name] = values
    written = write_safetensors(tmp_path_factory.mktemp("dtypes") / "every.safetensors", tensors)
    return written, load_file(str(written.path))


def keeps_extremes(storage: torch.dtype, target: torch.dtype) -> bool:
    """torch's answer: do the storage type's smallest and largest values survive a cast to ``target``?"""
    if storage == torch.bool:
        lo, hi = 0, 1
        extremes = torch.tensor([False, True])
    else:
        info = torch.iinfo(storage)
        lo, hi = info.min, info.max
        extremes = torch.tensor([lo, hi], dtype=storage)
    cast = extremes.to(target)
    if target.is_complex:
        cast = cast.real
    values = cast.double().tolist() if target.is_floating_point or target.is_complex else cast.tolist()
    return values == [lo, hi]  # Python compares a float with an int exactly (2.0**63 != 2**63 - 1)


@pytest.mark.parametrize("dtype", NOT_FOR_FLOATS, ids=str)
def test_floating_values_refuse_a_dtype_that_cannot_hold_them(mixed, every, dtype):
    floating = [n for n, t in mixed.tensors.items() if t.storage_type not in ("I8", "I16", "I32", "I64")]
    with ckptfs.open(mixed.path) as ck:
        for name in floating:
            with pytest.raises(ValueError, match=rf"tensor '{name}' holds floating values .*{dtype}"):
                ck[name].to_torch(dtype=dtype)
        with pytest.raises(ValueError, match=rf"tensor 'q4_k.mat' .*{dtype}"):
            ckptfs.load(ck, ["i8.vec", "q4_k.mat"], dtype=dtype)
        with pytest.raises(ValueError, match=str(dtype)):
            ckptfs.load(mixed.path, dtype=dtype)           # the whole checkpoint: refused, not zeros
    written, _ = every
    with ckptfs.open(written.path) as ck:
        for name in ("t.f8_e4m3", "t.bf16", "t.f64"):       # stored floats: the same rule
            with pytest.raises(ValueError, match=rf"tensor '{name}'"):
                ck[name].to_torch(dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATING, ids=str)
def test_floating_values_in_the_four_floating_dtypes(mixed, dtype):
    with ckptfs.open(mixed.path) as ck:
        got = ck["q4_k.mat"].to_torch(dtype=dtype)
        full = torch.from_numpy(np.ascontiguousarray(ck["q4_k.mat"].numpy()))
    assert got.dtype == dtype and torch.equal(got, full.to(dtype))


@pytest.mark.parametrize("name", INTEGER_STORAGE)
def test_integer_and_bool_storage_takes_a_dtype_only_where_it_is_exact(every, name):
    written, theirs = every
    reference = theirs[name]
    with ckptfs.open(written.path) as ck:
        for target in INTEGER_TARGETS:
            exact = keeps_extremes(reference.dtype, target) and not target.is_complex and \
                target not in (torch.float8_e4m3fn,)
            got = ck[name].to_torch(dtype=target)
            assert got.dtype == (target if exact else reference.dtype), (name, target)
            if got.dtype == reference.dtype:
                assert torch.equal(got, reference), (name, target)
            else:  # every value as torch's cast gives it, and the cast lost nothing
                assert torch.equal(got, reference.to(target)), (name, target)
                assert torch.equal(got.to(reference.dtype), reference), (name, target)
        loaded = ckptfs.load(ck, [name, "t.f32"], dtype=torch.bfloat16)
        assert loaded["t.f32"].dtype == torch.bfloat16
        assert loaded[name].dtype == (torch.bfloat16 if keeps_extremes(reference.dtype, torch.bfloat16)
                                      else reference.dtype)


def test_complex_storage_takes_only_complex_dtypes(every):
    written, theirs = every
    with ckptfs.open(written.path) as ck:
        got = ck["t.c64"].to_torch(dtype=torch.complex128)
        assert got.dtype == torch.complex128 and torch.equal(got, theirs["t.c64"].to(torch.complex128))
        for dtype in (torch.float32, torch.int64, torch.bool):
            with pytest.raises(ValueError, match=rf"tensor 't.c64' is complex .*{dtype}"):
                ck["t.c64"].to_torch(dtype=dtype)
