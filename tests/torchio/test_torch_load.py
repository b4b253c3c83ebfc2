"""ckptfs.load / Tensor.to_torch / ckptfs.load_batch on real files written by gguf-py and by the safetensors
layout: values against the references (gguf-py's dequantize, safetensors.torch), the host path against the
device path (the torch kernels, run on the CPU here), bfloat16/float16 without a whole float32 copy, row
slices reading only their blocks, one buffer for a batch, and bad input."""

from __future__ import annotations

import gc
import subprocess
import sys
import tracemalloc
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fixtures import all_dtype_tensors, quantized, write_gguf, write_mixed_gguf, write_safetensors  # noqa: E402
from quant_checks import assert_same_floats  # noqa: E402

import ckptfs  # noqa: E402
from ckptfs.engine import batch  # noqa: E402
from ckptfs.core.reads import NOTHING_SAID  # noqa: E402
from ckptfs.torchio import api  # noqa: E402

STORAGE_TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
                 "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (NaN payloads included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return write_mixed_gguf(tmp_path_factory.mktemp("torch") / "mixed.gguf")


@pytest.fixture(scope="module")
def big_q8(tmp_path_factory):
    """One 2048 x 4096 Q8_0 matrix (32 MiB as float32) and a few small tensors around it."""
    rng = np.random.default_rng(8)
    path = tmp_path_factory.mktemp("torch") / "big.gguf"
    return write_gguf(path, {
        "norm.a": (rng.standard_normal(4096).astype(np.float32), "F32"),
        "big": (quantized("Q8_0", (2048, 4096), rng), "Q8_0"),
        "norm.b": (rng.standard_normal(4096).astype(np.float32), "F32"),
        "k.mat": (quantized("Q4_K", (64, 512), rng), "Q4_K"),
    })


def test_import_ckptfs_and_load_batch_never_import_torch(mixed):
    code = ("import sys, ckptfs; ckptfs.open(sys.argv[1])['q4_k.mat'].numpy(); "
            "ckptfs.load_batch(sys.argv[1], ['q4_k.mat', 'f16.mat']); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(mixed.path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_load_gives_gguf_py_values_in_the_storage_dtype_where_torch_holds_it(mixed):
    loaded = ckptfs.load(mixed.path)
    decodable = {name for name, ref in mixed.tensors.items()}
    assert set(loaded) == decodable
    for name, ref in mixed.tensors.items():
        got = loaded[name]
        assert tuple(got.shape) == ref.shape, name
        assert got.dtype == STORAGE_TORCH.get(ref.storage_type, torch.float32), name
        assert_gguf_py_values(got, ref)


def assert_gguf_py_values(got: torch.Tensor, ref) -> None:
    """``got`` holds gguf-py's values of ``ref`` (where gguf-py decodes it), bit for bit."""
    if ref.array is None:
        return
    if got.dtype == torch.bfloat16:
        assert_same_floats(got.float().numpy(), ref.array)
    elif got.dtype == torch.float32:
        assert_same_floats(got.numpy(), ref.array)
    else:
        np.testing.assert_array_equal(got.numpy(), ref.array)


def test_the_device_path_decodes_every_piece_however_many(mixed, monkeypatch):
    """The device path reads a few pieces ahead of the one it uploads (``READ_AHEAD``); with many more
    pieces than that (here: every run a piece of its own), every piece is still read and decoded, each
    tensor gguf-py's values (a piece the read-ahead skipped would leave its tensors as the allocator had them)."""
    monkeypatch.setattr(batch, "PIECE_BYTES", 1)
    with ckptfs.open(mixed.path) as ck:
        tensors = batch.tensors_named(ck, list(mixed.tensors))
        pieces = batch.plan(batch.decode_virtual(
            [batch.Request.of(t, 0, t.size, api.TorchDestination(torch.empty(t.size))) for t in tensors]))
    assert len(pieces) > api.READ_AHEAD + 2
    loaded = api.load(mixed.path, use_kernels=True)
    for name, ref in mixed.tensors.items():
        assert_gguf_py_values(loaded[name], ref)


@pytest.mark.parametrize("dtype", [None, torch.float32, "float16", "bfloat16", torch.float64])
def test_device_path_equals_host_path_bit_for_bit(mixed, dtype):
    host = api.load(mixed.path, device="cpu", dtype=dtype)
    kernel = api.load(mixed.path, device="cpu", dtype=dtype, use_kernels=True)
    assert set(host) == set(kernel)
    for name in host:
        assert same_bits(host[name], kernel[name]), name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes_are_torchs_own_cast_of_the_float32_values(mixed, dtype):
    full = ckptfs.load(mixed.path, dtype=torch.float32)
    half = ckptfs.load(mixed.path, dtype=dtype)
    for name, values in full.items():
        if mixed.tensors[name].storage_type in ("I16", "I32", "I64"):  # kept: see test_torch_dtypes.py
            assert half[name].dtype == STORAGE_TORCH[mixed.tensors[name].storage_type], name
            continue
        assert same_bits(half[name], values.to(dtype)), name


def test_safetensors_every_dtype_against_safetensors_torch(tmp_path):
    from safetensors.torch import load_file

    every = all_dtype_tensors()
    packed = {name for name, spec in every.items() if isinstance(spec, tuple)}      # F4, F6: torch has none
    oracle = write_safetensors(tmp_path / "oracle.safetensors", {n: v for n, v in every.items() if n not in packed})
    written = write_safetensors(tmp_path / "all.safetensors", every)
    ours = ckptfs.load(written.path)
    with ckptfs.open(written.path) as ck:
        for name, theirs in load_file(str(oracle.path)).items():
            got = ours[name]
            assert tuple(got.shape) == tuple(theirs.shape), name
            if theirs.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                                torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64,
                                torch.uint16, torch.uint32, torch.uint64):
                assert same_bits(got, theirs), name          # held exactly: the storage dtype, same bytes
            else:                                            # 8-bit floats: float32 values, NaN-aware
                assert got.dtype == torch.float32, name
                assert_same_floats(got.numpy(), theirs.float().numpy())
            assert_same_floats(got.float().numpy() if not got.dtype.is_complex else got.real.numpy(),
                               np.asarray(ck[name].numpy().real, dtype=np.float32))
        for name in packed:                                  # no torch reference: the numpy codec
            assert_same_floats(ours[name].numpy(), ck[name].numpy())


def test_an_open_checkpoint_is_accepted_and_left_open(mixed):
    with ckptfs.open(mixed.path) as ck:
        got = ckptfs.load(ck, ["q4_k.mat", "i8.vec"], dtype="float32")
        assert list(got) == ["q4_k.mat", "i8.vec"]
        assert got["i8.vec"].dtype == torch.float32
        np.testing.assert_array_equal(got["i8.vec"].numpy(), ck["i8.vec"].numpy().astype(np.float32))
        assert_same_floats(ck["q4_k.mat"].to_torch().numpy(), ck["q4_k.mat"].numpy())   # still usable


def test_bfloat16_load_keeps_no_whole_tensor_float32_copy(big_q8, monkeypatch):
    """numpy and bytes allocations are traced; torch's destination is not. A whole-tensor float32
    intermediate of the big matrix would be 32 MiB; runs of 1 MiB on 4 workers stay far below that."""
    from ckptfs.core.runtime import runtime
    from ckptfs.workers.scheduler import WORKERS

    monkeypatch.setitem(runtime().get(WORKERS).concurrency, "decode", 4)  # the caller and 3 decode workers (engine/parallel.py)
    monkeypatch.setattr(batch, "RUN_ELEMENTS", 1 << 18)
    monkeypatch.setattr(batch, "RUN_STORED_BYTES", 1 << 20)
    monkeypatch.setattr(batch, "PIECE_BYTES", 1 << 20)
    with ckptfs.open(big_q8.path) as ck:
        tracemalloc.start()
        try:
            got = ck["big"].to_torch(dtype=torch.bfloat16)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 16 * 2**20, peak
        want = torch.from_numpy(ck["big"].numpy()).to(torch.bfloat16)
    assert same_bits(got, want)


def _record_reads(ck, monkeypatch) -> list[tuple[int, int]]:
    reads: list[tuple[int, int]] = []
    for path in ck.files:
        source = ck.sources.get(path)
        original = source.pread

        def pread(offset, size, *, scope=NOTHING_SAID, _original=original):
            reads.append((offset, size))
            return _original(offset, size, scope=scope)

        monkeypatch.setattr(source, "pread", pread)
    return reads


@pytest.mark.parametrize("use_kernels", [False, True])
def test_a_row_slice_reads_and_decodes_only_its_blocks(big_q8, monkeypatch, use_kernels):
    with ckptfs.open(big_q8.path) as ck:
        t = ck["big"]
        reads = _record_reads(ck, monkeypatch)
        got = api.to_torch(t, rows=slice(1000, 1003), dtype=torch.float16, use_kernels=use_kernels)
        row_bytes = 4096 // 32 * 34
        start = t.info.offset + 1000 * row_bytes
        assert sum(size for _, size in reads) == 3 * row_bytes
        assert all(start <= offset and offset + size <= start + 3 * row_bytes for offset, size in reads)
        reads.clear()
        want = t[1000:1003]
        assert reads == [] or sum(size for _, size in reads) == 3 * row_bytes
    assert tuple(got.shape) == (3, 4096)
    assert same_bits(got, torch.from_numpy(want).to(torch.float16))


def test_rows_must_be_a_plain_slice(mixed):
    with ckptfs.open(mixed.path) as ck:
        with pytest.raises(ValueError, match="rows must be a slice"):
            ck["q8_0.mat"].to_torch(rows=slice(0, 3, 2))
        assert tuple(ck["q8_0.mat"].to_torch(rows=slice(5, 9)).shape) == (0, 64)


def test_reads_of_neighbouring_tensors_are_coalesced(big_q8, monkeypatch):
    with ckptfs.open(big_q8.path) as ck:
        reads = _record_reads(ck, monkeypatch)
        small = ["norm.a", "norm.b", "k.mat"]
        ckptfs.load(ck, small)
        # three tensors, but norm.b and k.mat lie back to back in the file: fewer reads than tensors
        assert 1 <= len(reads) < len(small)


def test_load_batch_views_one_contiguous_buffer(mixed):
    names = ["q4_k.mat", "f16.mat", "i8.vec", "bf16.mat", "q8_0.mat"]
    got = ckptfs.load_batch(mixed.path, names)
    assert list(got) == names
    owners = {id(a.base) for a in got.values()}
    assert len(owners) == 1
    buffer = next(iter(got.values())).base
    start, end = buffer.ctypes.data, buffer.ctypes.data + buffer.nbytes
    with ckptfs.open(mixed.path) as ck:
        for name, array in got.items():
            assert start <= array.ctypes.data and array.ctypes.data + array.nbytes <= end
            assert array.dtype == ck[name].dtype and array.shape == ck[name].shape
            np.testing.assert_array_equal(array, ck[name].numpy())
    assert buffer.nbytes < sum(a.nbytes for a in got.values()) + batch.ALIGN * len(names)


def test_load_batch_stack(big_q8, mixed):
    stacked = ckptfs.load_batch(big_q8.path, ["norm.b", "norm.a"], stack=True)
    assert stacked.shape == (2, 4096) and stacked.flags.c_contiguous
    with ckptfs.open(big_q8.path) as ck:
        np.testing.assert_array_equal(stacked[0], ck["norm.b"].numpy())
        np.testing.assert_array_equal(stacked[1], ck["norm.a"].numpy())
    with pytest.raises(ValueError, match="one shape and dtype"):
        ckptfs.load_batch(mixed.path, ["q4_0.mat", "q4_1.mat", "f32.mat"], stack=True)


@pytest.mark.parametrize("device", ["tpu", "cpu:x", "nonsense:0"])
def test_unknown_device_is_one_clear_error(mixed, device):
    with pytest.raises(ValueError, match="device") as info:
        ckptfs.load(mixed.path, device=device)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_one_clear_error(mixed):
    with pytest.raises(ValueError, match="CUDA is not available"):
        ckptfs.load(mixed.path, device="cuda")


@pytest.mark.parametrize("dtype", ["float128", "notatype", np.dtype("U4"), torch.quint8])
def test_a_dtype_torch_lacks_is_one_clear_error(mixed, dtype):
    with pytest.raises(ValueError, match="dtype") as info:
        ckptfs.load(mixed.path, ["q8_0.mat"], dtype=dtype)
    assert "\n" not in str(info.value)


def test_unknown_and_repeated_names(mixed):
    with pytest.raises(KeyError):
        ckptfs.load(mixed.path, ["q8_0.mat", "no.such"])
    with pytest.raises(ValueError, match="twice"):
        ckptfs.load_batch(mixed.path, ["q8_0.mat", "q8_0.mat"])
    with pytest.raises(TypeError, match="list of tensor names"):
        ckptfs.load(mixed.path, "q8_0.mat")


def test_out_of_memory_frees_what_was_loaded(mixed, monkeypatch):
    """A device without memory (simulated: torch raises its OutOfMemoryError at the third allocation): one
    error naming the tensor, and the tensors allocated before it are gone even while the error is held."""
    real_empty, made = torch.empty, []

    def empty(*args, **kwargs):
        if len(made) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        tensor = real_empty(*args, **kwargs)
        made.append(weakref.ref(tensor))
        return tensor

    monkeypatch.setattr(api.torch, "empty", empty)
    names = ["q8_0.mat", "q4_k.mat", "q6_k.cube", "f32.vec"]
    with pytest.raises(MemoryError, match=r"q6_k\.cube") as info:
        ckptfs.load(mixed.path, names)
    assert "\n" not in str(info.value) and "nothing was kept" in str(info.value)
    gc.collect()
    assert len(made) == 2 and all(ref() is None for ref in made)


def test_out_of_memory_while_decoding_is_one_error(mixed, monkeypatch):
    from ckptfs.torchio import kernels

    def exhausted(name, blocks):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(kernels, "dequantize", exhausted)
    with pytest.raises(MemoryError, match="out of memory while loading"):
        api.load(mixed.path, ["q8_0.mat", "q4_k.mat"], use_kernels=True)


def test_damaged_checkpoint_loads_what_is_intact(big_q8, tmp_path):
    data = big_q8.path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:len(data) - 1000])                # the last tensor (k.mat) loses its tail
    with ckptfs.open(cut) as ck:
        damaged = {t.name for t in ck.damaged()}
    assert damaged == {"k.mat"}
    got = ckptfs.load(cut)
    assert set(got) == {"norm.a", "big", "norm.b"}
    with pytest.raises(ckptfs.CheckpointError, match=r"k\.mat"):
        ckptfs.load(cut, ["norm.a", "k.mat"])


def test_big_endian_file_loads_the_same_values(tmp_path, mixed):
    big = write_mixed_gguf(tmp_path / "be.gguf", big_endian=True)
    little = ckptfs.load(mixed.path)
    for use_kernels in (False, True):
        got = api.load(big.path, use_kernels=use_kernels)
        for name, ref in big.tensors.items():
            if ref.array is not None:
                assert same_bits(got[name], little[name]), name


@pytest.mark.parametrize("use_kernels", [False, True])
def test_bf16_storage_into_bfloat16_keeps_every_bit_pattern(tmp_path, use_kernels):
    words = np.array([0x7F81, 0xFFC1, 0x7FC0, 0x0001, 0x8000, 0x7F80, 0x3F80, 0xFFFF], dtype="<u2")
    written = write_safetensors(tmp_path / "bf16.safetensors", {"w": (words.tobytes(), "BF16", (2, 4))})
    for dtype in (None, torch.bfloat16):
        got = api.load(written.path, dtype=dtype, use_kernels=use_kernels)["w"]
        assert got.dtype == torch.bfloat16
        assert got.view(torch.int16).numpy().view("<u2").tolist() == words.reshape(2, 4).tolist()


def test_device_path_raises_a_read_error_from_the_pieces_read_ahead(big_q8, tmp_path):
    """The device path reads its next pieces on the scheduler's read pool: a source's error there is the
    load's error, not a piece of zeros or a hang."""
    copy = tmp_path / "shrinks.gguf"
    copy.write_bytes(big_q8.path.read_bytes())
    with ckptfs.open(copy) as ck:
        with open(copy, "r+b") as f:
            f.truncate(copy.stat().st_size // 2)            # "big" loses its second half after the open
        with pytest.raises(ckptfs.CheckpointError, match="changed since it was opened"):
            api.load(ck, ["norm.a", "big", "norm.b"], use_kernels=True)
