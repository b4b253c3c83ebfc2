"""The library API against the references: gguf-py for GGUF, the safetensors package for safetensors."""

from __future__ import annotations

import pickle

import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFWriter
from gguf.quants import quantize
from multifile_sets import gguf_reference
from safetensors.numpy import save_file

import ckptfs

RNG = np.random.default_rng(1234)


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "model.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.block_count", 2)
    writer.add_string("general.name", "api test")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(100)])
    writer.add_array("tokenizer.ggml.scores", [float(i) / 3 for i in range(100)])
    values = RNG.standard_normal((64, 256)).astype(np.float32)
    writer.add_tensor("f32", values)
    writer.add_tensor("f16", values.astype(np.float16))
    for qtype in (Q.Q8_0, Q.Q4_0, Q.Q5_1, Q.BF16):
        writer.add_tensor(qtype.name.lower(), quantize(values, qtype), raw_dtype=qtype)
    writer.add_tensor("vector", values[0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def reference_arrays(path):
    """name -> values as gguf-py decodes them (the one gguf-py reference helper, multifile_sets.py)."""
    return {name: values for name, values, _raw, _file in gguf_reference([str(path)])}


def test_gguf_tensors_equal_gguf_py(gguf_path):
    refs = reference_arrays(gguf_path)
    with ckptfs.open(gguf_path) as ck:
        assert ck.format == "gguf"
        assert sorted(ck) == sorted(refs)
        for name, ref in refs.items():
            t = ck[name]
            got = np.asarray(t)
            assert got.shape == ref.shape == t.shape
            assert got.dtype == t.dtype
            assert got.tobytes() == ref.astype(got.dtype).tobytes(), name
            assert t.nbytes == got.nbytes


def test_storage_types_and_dtypes(gguf_path):
    with ckptfs.open(gguf_path) as ck:
        assert ck["f32"].storage_type == "F32" and ck["f32"].dtype == np.float32
        assert ck["f16"].storage_type == "F16" and ck["f16"].dtype == np.float16
        assert ck["q4_0"].storage_type == "Q4_0" and ck["q4_0"].dtype == np.float32
        assert ck["bf16"].dtype == np.float32
    with ckptfs.open(gguf_path, dtype="float32") as ck:
        assert ck["f16"].dtype == np.float32
        assert np.array_equal(np.asarray(ck["f16"]), np.asarray(ck["f32"]).astype(np.float16).astype(np.float32))
    with ckptfs.open(gguf_path, dtype="float16") as ck:
        assert ck["q8_0"].dtype == np.float16 and ck["f32"].dtype == np.float32
        ref = reference_arrays(gguf_path)["q8_0"].astype(np.float16)
        assert np.asarray(ck["q8_0"]).tobytes() == ref.tobytes()


def test_raw_bytes_equal_stored_bytes(gguf_path):
    with ckptfs.open(gguf_path) as ck:
        for t in GGUFReader(str(gguf_path)).tensors:
            assert ck[t.name].raw() == np.asarray(t.data).tobytes()
            assert ck[t.name].stored_nbytes == t.n_bytes


def test_row_slices_decode_only_what_they_cover(gguf_path):
    ref = reference_arrays(gguf_path)["q4_0"]
    with ckptfs.open(gguf_path) as ck:
        t = ck["q4_0"]
        for key in (slice(3, 9), slice(None), slice(60, 100), slice(-5, None), slice(1, 50, 7), slice(9, 2, -2),
                    5, -1, (slice(2, 4), slice(10, 20)), (7, 3)):
            assert np.array_equal(t[key], ref[key]), key
        assert len(t) == 64
        with pytest.raises(IndexError):
            t[64]


def _count_decoded_blocks(monkeypatch) -> list[int]:
    """Record every block range the tensors decode, as the list of block numbers decoded: cached groups and
    reads into the reply decode through ``TensorData._decode_blocks``, uncached reads (whole tensors, rows)
    through the batch planner's runs."""
    from ckptfs.engine import batch
    from ckptfs.engine.blocks import TensorData

    decoded: list[int] = []
    original, original_run = TensorData._decode_blocks, batch.decode_run

    def counting(self, b0, b1, *out):
        decoded.extend(range(b0, b1))
        return original(self, b0, b1, *out)

    def counting_run(run, raw):
        decoded.extend(range(run.b0, run.b1))
        return original_run(run, raw)

    monkeypatch.setattr(TensorData, "_decode_blocks", counting)
    monkeypatch.setattr(batch, "decode_run", counting_run)
    return decoded


def test_a_row_slice_decodes_only_its_rows(gguf_path, monkeypatch):
    decoded = _count_decoded_blocks(monkeypatch)  # Q4_0 rows of 256 = 8 blocks each
    ref = reference_arrays(gguf_path)["q4_0"]
    with ckptfs.open(gguf_path) as ck:
        t = ck["q4_0"]
        assert np.array_equal(t[10:11], ref[10:11])
        assert sorted(decoded) == list(range(80, 88))
        assert ck.cache.stats().entries == 0  # API row reads decode into the result, not into the cache


def test_metadata_values(gguf_path):
    with ckptfs.open(gguf_path) as ck:
        md = ck.metadata
        assert md["general.name"] == "api test"
        assert md["llama.block_count"] == 2
        assert md["tokenizer.ggml.tokens"] == [f"t{i}" for i in range(100)]
        scores = md["tokenizer.ggml.scores"]
        assert isinstance(scores, np.ndarray) and scores.dtype == np.float32
        assert np.array_equal(scores, np.array([i / 3 for i in range(100)], np.float32))


def test_meta_dict(gguf_path):
    with ckptfs.open(gguf_path) as ck:
        meta = ck["q8_0"].meta
        assert meta["name"] == "q8_0" and meta["storage_type"] == "Q8_0"
        assert meta["shape"] == [64, 256] and meta["gguf_dims"] == [256, 64]
        assert meta["npy_dtype"] == "<f4" and meta["npy_data_offset"] % 64 == 0
        assert meta["block_elements"] == 32 and meta["block_bytes"] == 34
        assert meta["damaged"] is None and meta["source"] == str(gguf_path)


def test_tensors_pickle(gguf_path):
    with ckptfs.open(gguf_path) as ck:
        t = ck["q5_1"]
        clone = pickle.loads(pickle.dumps(t))
        assert clone.name == "q5_1" and clone.shape == t.shape
        assert np.array_equal(np.asarray(clone), np.asarray(t))


def test_safetensors_against_the_reference(tmp_path):
    arrays = {
        "f32": RNG.standard_normal((7, 5)).astype(np.float32),
        "i64": RNG.integers(-1000, 1000, (3, 4)).astype(np.int64),
        "u8": RNG.integers(0, 255, (11,)).astype(np.uint8),
        "bool": RNG.integers(0, 2, (4, 2)).astype(bool),
        "f16": RNG.standard_normal((2, 3, 4)).astype(np.float16),
        "scalar": np.array(3.5, np.float64),
        "empty": np.zeros((0, 4), np.float32),
    }
    path = tmp_path / "m.safetensors"
    save_file(arrays, str(path), metadata={"format": "np", "note": "hi"})
    with ckptfs.open(path) as ck:
        assert ck.format == "safetensors"
        assert dict(ck.metadata) == {"format": "np", "note": "hi"}
        for name, ref in arrays.items():
            got = np.asarray(ck[name])
            assert got.dtype == ref.dtype and got.shape == ref.shape
            assert got.tobytes() == ref.tobytes()


def test_safetensors_bf16_values(tmp_path):
    values = RNG.standard_normal((16, 8)).astype(np.float32)
    bf16 = values.astype(ml_dtypes.bfloat16)
    from safetensors.numpy import save_file as save  # bf16 through raw bytes: the numpy API lacks it
    path = tmp_path / "b.safetensors"
    save({"x": np.zeros(1, np.float32)}, str(path))
    header = b'{"w":{"dtype":"BF16","shape":[16,8],"data_offsets":[0,256]}}'
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + bf16.tobytes())
    with ckptfs.open(path) as ck:
        t = ck["w"]
        assert t.storage_type == "BF16" and t.dtype == np.float32
        assert np.asarray(t).tobytes() == bf16.astype(np.float32).tobytes()


def test_bad_file_is_a_checkpoint_error(tmp_path):
    path = tmp_path / "junk.bin"
    path.write_bytes(b"PK\x03\x04 this is a zip, not a checkpoint")
    with pytest.raises(ckptfs.CheckpointError, match=r"junk\.bin"):
        ckptfs.open(path)
    assert issubclass(ckptfs.CheckpointError, ValueError)


def test_asarray_copy_false_is_refused_on_numpy2(gguf_path):
    with ckptfs.open(gguf_path) as ck:
        t = ck["f32"]
        if np.lib.NumpyVersion(np.__version__) >= "2.0.0":
            with pytest.raises(ValueError):
                np.asarray(t, copy=False)
        assert np.array(t, copy=True).shape == t.shape


def test_a_sparse_stepped_slice_decodes_only_the_picked_rows(gguf_path, monkeypatch):
    decoded = _count_decoded_blocks(monkeypatch)  # Q4_0 rows of 256 = 8 blocks each
    ref = reference_arrays(gguf_path)["q4_0"]
    with ckptfs.open(gguf_path) as ck:
        t = ck["q4_0"]
        assert np.array_equal(t[::20], ref[::20]) and np.array_equal(t[60:0:-25, 3:9], ref[60:0:-25, 3:9])
        picked = [*range(0, 64, 20), *range(60, 0, -25)]  # row 60 twice: once per slice
        assert sorted(decoded) == sorted(b for r in picked for b in range(8 * r, 8 * r + 8))


@pytest.mark.parametrize("key", [[5], [3, 1, 3, -1], np.array([0, 63, 7], np.int32), np.array([2, 2], np.uint8),
                                 ([4, 9], slice(10, 20)), ([4, -9], 7), ([1, 2], None), ([6, 0], Ellipsis, 3),
                                 ([1, 2], [3, 4]), ([[1, 2], [3, 4]],), [True] * 64])
def test_row_lists_index_like_numpy(gguf_path, key):
    ref = reference_arrays(gguf_path)["q4_0"]
    with ckptfs.open(gguf_path) as ck:
        got = ck["q4_0"][key]
        want = ref[key]
        assert got.shape == want.shape and np.array_equal(got, want)
        with pytest.raises(IndexError):
            ck["q4_0"][[0, 64]]


def test_an_embedding_lookup_decodes_only_the_named_rows(gguf_path, monkeypatch):
    decoded = _count_decoded_blocks(monkeypatch)  # Q4_0 rows of 256 = 8 blocks each
    ref = reference_arrays(gguf_path)["q4_0"]
    ids = [17, 3, 17, 50, 3]
    with ckptfs.open(gguf_path) as ck:
        assert np.array_equal(ck["q4_0"][ids], ref[ids])
        assert sorted(decoded) == sorted(b for r in set(ids) for b in range(8 * r, 8 * r + 8))  # once each
