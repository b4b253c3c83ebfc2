"""FP8-family checkpoints written as their producers store them, and the float32 formula the tests trust.

Writers: numpy + ml_dtypes values quantized the way DeepSeek's ``weight_quant`` / Qwen3-FP8 / fbgemm /
ModelOpt do (amax per block, per row or per tensor, E4M3 codes), stored by a minimal safetensors writer
(``write_safetensors``: the header and raw little-endian bytes, any dtype string, F8_E4M3 and F8_E8M0
included) beside a ``config.json``. The expected values are computed here, independently of ckptfs: codes
decoded by ml_dtypes, scales widened to float32, one float32 multiply per element. Nothing here imports
ckptfs.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu
BF16 = ml_dtypes.bfloat16
DTYPE_NAMES = {np.dtype(E4M3): "F8_E4M3", np.dtype(E8M0): "F8_E8M0", np.dtype(BF16): "BF16",
               np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int8): "I8",
               np.dtype(np.uint8): "U8", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}


def write_safetensors(path: str | Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file holding ``tensors`` in order (the format's own layout: u64 header size, JSON
    header padded with spaces to 8 bytes, data back to back)."""
    header: dict[str, Any] = {}
    offset = 0
    blobs = []
    for name, value in tensors.items():
        value = np.ascontiguousarray(value)
        data = value.tobytes()
        header[name] = {"dtype": DTYPE_NAMES[value.dtype], "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)


def write_model(folder: str | Path, tensors: dict[str, np.ndarray], quantization_config: dict[str, Any] | None,
                *, torch_dtype: str = "bfloat16", shards: int = 1) -> Path:
    """A model folder: ``tensors`` in ``shards`` safetensors files (with an index when more than one) and a
    ``config.json`` holding ``quantization_config``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    if shards == 1:
        write_safetensors(folder / "model.safetensors", tensors)
    else:
        weight_map = {}
        for k in range(shards):
            part = names[k::shards]
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(folder / file, {n: tensors[n] for n in part})
            weight_map.update({n: file for n in part})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": torch_dtype}
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def block_quantize(rng: np.random.Generator, shape: tuple[int, ...], block: tuple[int, int], scale_dtype,
                   *, nonfinite: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek's ``weight_quant``: per ``block`` tile (partial at the edges) ``s = amax / 448``, codes
    ``e4m3(w / s)``; returns (codes as E4M3 ``shape``, scales ``[*lead, ceil(out/bh), ceil(in/bw)]`` in
    ``scale_dtype``; E8M0 scales are rounded up to a power of two as ``scale_fmt: ue8m0`` does)."""
    *lead, out, n = shape
    bh, bw = block
    gh, gw = -(-out // bh), -(-n // bw)
    w = rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.01, 3.0)
    scales = np.empty((*lead, gh, gw), np.float32)
    codes = np.empty(shape, E4M3)
    for index in np.ndindex(*lead, gh, gw):
        *e, bi, bj = index
        tile = w[(*e, slice(bi * bh, (bi + 1) * bh), slice(bj * bw, (bj + 1) * bw))]
        s = max(float(np.abs(tile).max()) / 448.0, 1e-12)
        if scale_dtype == E8M0:
            s = float(2.0 ** np.ceil(np.log2(s)))
        s = float(np.array(s, np.float32).astype(scale_dtype).astype(np.float32))
        scales[index] = s
        codes[(*e, slice(bi * bh, (bi + 1) * bh), slice(bj * bw, (bj + 1) * bw))] = (tile / s).astype(E4M3)
    if nonfinite:
        codes.reshape(-1)[:3] = np.array([np.nan, 448.0, -0.0], np.float32).astype(E4M3)
    return codes, scales.astype(scale_dtype)


def expected_blocks(codes: np.ndarray, scales: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """``e4m3(w) * s[i // bh, j // bw]`` in float32, each element on its own (no shared code path)."""
    values = codes.astype(np.float32)
    s = scales.astype(np.float32)
    bh, bw = block
    *lead, out, n = codes.shape
    rows = np.arange(out) // bh
    cols = np.arange(n) // bw
    full = s[..., rows, :][..., :, cols]
    return (values * full).astype(np.float32)


def round_bits(values: np.ndarray, dtype) -> np.ndarray:
    """float32 ``values`` rounded to ``dtype`` (ml_dtypes: nearest, ties to even) as float32."""
    return values.astype(dtype).astype(np.float32)
