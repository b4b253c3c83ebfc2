"""The ``.npy`` of a view whose values are a closed form of its codes, read through a mount, is computed in C
(``ckptfs/fuse/_direct.c`` with ``ckptfs/quant/scaled_rows.h`` and ``nibble_pairs.h``), bit for bit:

- every layer of a DeepSeek-style FP8 folder (128 x 128 blocks, partial edge tiles, F32 scales with a NaN, the
  largest code and a signed zero among the codes) and of a compressed-tensors int8 folder with zero points:
  the whole file, and O_DIRECT reads at odd offsets (the header seam, row and block straddles, past the end),
  each equal to the formula computed here with ml_dtypes (``fp8_fixtures``) — and the C path served them
  (``c_reads`` in the stats), nothing handed back;
- NVFP4 and MXFP4 quantized by compressed-tensors (NaN and zero scales among them) and MXFP8, against its
  own ``decompress``; bitsandbytes NF4 with double quantization whose blocks straddle rows, an odd element
  count and FP4, against bitsandbytes' dequantization — at odd offsets too (elements cut by the read);
- ``--dtype float16``: the formula rounded once to float16;
- ``CKPTFS_C_READS=0`` and ``CKPTFS_NO_NATIVE=1``: the same bytes, not one ``.npy`` read served in C;
- a file rewritten under the mount (same size, new mtime) is not computed from: the read goes to Python,
  which answers EIO;
- a mount with a shared tier keeps the decode engine (its decoded tiles are what other daemons read).
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from conftest import mount_stats
from fp8_fixtures import block_quantize, expected_blocks, write_model
from mount_expect import npy_bytes, npy_header_length, odd_ranges, read_direct

from ckptfs.fuse import direct

pytestmark = pytest.mark.skipif(direct._direct is None, reason="the C helper ckptfs.fuse._direct is not built")

BLOCK = (128, 128)
LAYERS = {"model.layers.0.self_attn.kv_a_proj_with_mqa": (300, 1000),   # 3 x 8 blocks, both edges partial
          "model.layers.0.mlp.down_proj": (129, 256),                   # one row past a block
          "model.layers.0.mlp.gate_proj": (3, 5)}                       # smaller than one block


def fp8_folder(path, seed: int = 0):
    """A DeepSeek-style fp8 folder and each view's expected float32 values."""
    rng = np.random.default_rng(seed)
    tensors, expected = {}, {}
    for k, (name, shape) in enumerate(LAYERS.items()):
        codes, scales = block_quantize(rng, shape, BLOCK, np.float32, nonfinite=k == 0)
        tensors[f"{name}.weight"], tensors[f"{name}.weight_scale_inv"] = codes, scales
        expected[f"{name}.weight"] = expected_blocks(codes, scales, BLOCK)
    tensors["model.norm.weight"] = rng.standard_normal(64).astype(np.float32)
    config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": list(BLOCK)}
    return write_model(path, tensors, config), expected


def int8_folder(path):
    """A compressed-tensors ``int-quantized`` folder, channel strategy with zero points, written as its
    compressor stores it (``weight`` I8, ``weight_scale`` [out, 1], ``weight_zero_point`` [out, 1]), and the
    view's expected ``(q - z) * s`` in float32."""
    rng = np.random.default_rng(7)
    out, n = 70, 300
    q = rng.integers(-128, 128, (out, n)).astype(np.int8)
    s = (rng.uniform(0.001, 0.02, (out, 1))).astype(np.float32)
    z = rng.integers(-20, 20, (out, 1)).astype(np.int8)
    name = "model.layers.0.mlp.up_proj"
    weights = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": False}
    config = {"quant_method": "compressed-tensors", "format": "int-quantized",
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}
    folder = write_model(path, {f"{name}.weight": q, f"{name}.weight_scale": s, f"{name}.weight_zero_point": z},
                         config)
    expected = ((q.astype(np.float32) - z.astype(np.float32)) * s).astype(np.float32)
    return folder, {f"{name}.weight": expected}


def check_views(mnt, expected: dict[str, np.ndarray], dtype=np.float32) -> int:
    """Every view's .npy whole and at odd O_DIRECT ranges equals ``expected`` as ``dtype``; the bytes asked."""
    rng = np.random.default_rng(1)
    asked = 0
    for name, values in expected.items():
        want = npy_bytes(values.astype(dtype))
        path = mnt / f"{name}.npy"
        assert path.read_bytes() == want, name
        header = npy_header_length(values.shape, np.dtype(dtype))
        row = values.shape[-1] * np.dtype(dtype).itemsize
        ranges = odd_ranges(len(want), header, row, rng) + [(header + row - 3, 7), (header + 128 * row - 1, 2 * row + 2)]
        for (offset, size), got in zip(ranges, read_direct(path, ranges)):
            assert got == want[offset:offset + size], (name, offset, size)
            asked += len(got)
    return asked


@pytest.mark.parametrize("make", [fp8_folder, int8_folder], ids=["fp8-blocks", "int8-zero-points"])
def test_scaled_views_are_computed_in_c_bit_for_bit(tmp_path, mounted, make):
    folder, expected = make(tmp_path / "m")
    mnt = mounted(folder)
    asked = check_views(mnt, expected)
    served = mount_stats(mnt)["c_reads"]
    assert served["handed_back"] == 0
    assert served["by_kind"]["npy"]["bytes"] >= asked  # the O_DIRECT reads alone, besides the buffered ones
    stored = next(iter(expected))
    assert (mnt / f"{stored}.raw").stat().st_size == expected[stored].size  # the codes stay there, one byte each


def test_float16_views_are_the_formula_rounded_once(tmp_path, mounted):
    folder, expected = fp8_folder(tmp_path / "m", seed=3)
    mnt = mounted(folder, "--dtype", "float16")
    with np.errstate(over="ignore"):
        check_views(mnt, expected, np.float16)
    assert mount_stats(mnt)["c_reads"]["by_kind"]["npy"]["reads"] > 0


@pytest.mark.parametrize("env", [{"CKPTFS_C_READS": "0"}, {"CKPTFS_NO_NATIVE": "1"}], ids=["c-reads-off", "no-native"])
def test_without_the_c_path_the_same_bytes_come_from_python(tmp_path, mounted, env):
    folder, expected = fp8_folder(tmp_path / "m", seed=4)
    mnt = mounted(folder, env=env)
    check_views(mnt, expected)
    assert mount_stats(mnt)["c_reads"]["by_kind"].get("npy", {"reads": 0})["reads"] == 0


def test_codes_rewritten_under_the_mount_are_not_computed_from(tmp_path, mounted):
    folder, expected = fp8_folder(tmp_path / "m", seed=5)
    name = "model.layers.0.mlp.down_proj.weight"
    mnt = mounted(folder)
    want = npy_bytes(expected[name])
    fd = os.open(mnt / f"{name}.npy", os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.pread(fd, 4096, 0) == want[:4096]
        before = mount_stats(mnt)["c_reads"]
        assert before["by_kind"]["npy"]["reads"] >= 1
        shard = folder / "model.safetensors"
        st = shard.stat()
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # "rewritten"
        with pytest.raises(OSError) as info:
            os.pread(fd, 4096, 0)
        assert info.value.errno == errno.EIO
    finally:
        os.close(fd)
    after = mount_stats(mnt)["c_reads"]
    assert after["handed_back"] == before["handed_back"] + 1
    assert after["by_kind"]["npy"]["reads"] == before["by_kind"]["npy"]["reads"]


def test_a_shared_tier_keeps_views_in_the_decode_engine(tmp_path, mounted):
    folder, expected = fp8_folder(tmp_path / "m", seed=6)
    mnt = mounted(folder, "--cache-dir", str(tmp_path / "tier"))
    check_views(mnt, expected)
    stats = mount_stats(mnt)
    assert stats["c_reads"]["by_kind"].get("npy", {"reads": 0})["reads"] == 0


def fp4_folder(path):
    """compressed-tensors NVFP4, MXFP4 and MXFP8 layers (one folder per format, as its configs hold one), each
    view's values by compressed-tensors' own decompress (in bfloat16, the release's dtype: the view's float32
    values are compared rounded to it)."""
    pytest.importorskip("compressed_tensors")
    from fp4_fixtures import ct_config, ct_decompress, ct_layer, to_bf16, write_torch_folder

    folders = []
    for k, (preset, shape) in enumerate({"NVFP4": (33, 160), "MXFP4": (20, 96), "MXFP8": (17, 64)}.items()):
        config, tensors = ct_layer(preset, *shape, seed=k)
        name = f"model.layers.{k}.mlp.up_proj"
        folder = write_torch_folder(path / preset, {f"{name}.{role}": v for role, v in tensors.items()},
                                    {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                     "quantization_config": ct_config({"group_0": config}, config["format"])})
        folders.append((folder, {f"{name}.weight": ct_decompress(preset, config, tensors)}, to_bf16))
    return folders


def bnb_folder(path):
    """bitsandbytes 4-bit layers as Linear4bit saves them: NF4 with double quantization [37, 100] (blocks of 64
    straddle rows), NF4 [7, 9] (an odd element count), FP4 blocks of 128; bitsandbytes' float32 values."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from packed.bnb_fixtures import bnb_config, dequantize_4bit, quantize_4bit, write_folder

    torch.manual_seed(11)
    layers = {"model.layers.0.self_attn.q_proj": quantize_4bit(torch.randn(37, 100).to(torch.bfloat16), "nf4", 64, True),
              "model.layers.0.self_attn.k_proj": quantize_4bit(torch.randn(7, 9).to(torch.bfloat16), "nf4", 64, True)}
    fp4 = {"model.layers.1.self_attn.q_proj": quantize_4bit(torch.randn(24, 200).to(torch.bfloat16), "fp4", 128)}
    made = []
    for sub, group, quant_type in (("nf4", layers, "nf4"), ("fp4", fp4, "fp4")):
        folder = write_folder(path / sub, group, bnb_config(4, quant_type, quant_type == "nf4"))
        made.append((folder, {f"{prefix}.weight": dequantize_4bit(tensors, torch.float32).numpy()
                              for prefix, tensors in group.items()}, lambda values: values))
    return made


@pytest.mark.parametrize("make", [fp4_folder, bnb_folder], ids=["compressed-tensors-mx-nvfp4", "bitsandbytes-4bit"])
def test_nibble_views_are_computed_in_c_bit_for_bit(tmp_path, mounted, make):
    """The values are the oracle's (a NaN for a NaN: its payload is the arithmetic's), and each byte the one
    Python serves (``CKPTFS_C_READS=0``: numpy's NaN bits), whole and at odd offsets, float32 and float16."""
    from fp4_fixtures import same_values

    for folder, oracle, as_oracle in make(tmp_path):
        python = mounted(folder, env={"CKPTFS_C_READS": "0"})
        expected = {name: np.load(python / f"{name}.npy") for name in oracle}
        for name, values in oracle.items():
            assert same_values(as_oracle(expected[name]), values), name
        mnt = mounted(folder)
        asked = check_views(mnt, expected)
        served = mount_stats(mnt)["c_reads"]
        assert served["handed_back"] == 0 and served["by_kind"]["npy"]["bytes"] >= asked, folder.name
        half = mounted(folder, "--dtype", "float16")
        with np.errstate(over="ignore", invalid="ignore"):
            check_views(half, expected, np.float16)
        assert mount_stats(half)["c_reads"]["by_kind"]["npy"]["reads"] > 0
