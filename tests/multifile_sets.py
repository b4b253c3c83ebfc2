"""Generated multi-file checkpoints for the multi-file tests (written with the reference libraries).

A safetensors set is written shard by shard with ``safetensors.numpy.save_file`` plus a hand-written index in
huggingface_hub's layout; a split GGUF with gguf-py's own splitting writer (``split_max_tensors``), which
names the shards ``PREFIX-NNNNN-of-NNNNN.gguf`` and writes ``split.no``/``split.count`` (u16) and
``split.tensors.count`` (i32). References come from those libraries, never from ckptfs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize
from safetensors.numpy import load_file, save_file

from fixtures import quantized

#: Non-tensor files of a Hugging Face model folder (name -> content).
MODEL_FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 16}\n',
    "generation_config.json": b'{"do_sample": true}\n',
    "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}\n',
    "tokenizer_config.json": b'{"bos_token": "<s>"}\n',
    "special_tokens_map.json": b'{"eos_token": "</s>"}\n',
    "tokenizer.model": bytes(range(256)) * 3,
    "README.md": b"# test model\n",
    "chat_template.jinja": b"{{ messages }}\n",
}

_ST_DTYPES = (np.float32, np.float16, np.int32, np.float64, np.int8, np.uint16)


def shard_name(prefix: str, number: int, count: int, ext: str) -> str:
    return f"{prefix}-{number:05d}-of-{count:05d}.{ext}"


def safetensors_tensors(n_shards: int, per_shard: int = 3, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Tensors for each shard: varied dtypes and shapes, a scalar and an empty one among them."""
    rng = np.random.default_rng(seed)
    shards = []
    for s in range(n_shards):
        tensors = {}
        for j in range(per_shard):
            dtype = _ST_DTYPES[(s + j) % len(_ST_DTYPES)]
            shape = [(3, 5), (7,), (2, 3, 4), ()][(s + j) % 4]
            values = rng.standard_normal(shape) * 50
            tensors[f"model.layers.{s}.w{j}"] = np.asarray(values).astype(dtype)
        shards.append(tensors)
    shards[0]["model.empty"] = np.zeros((0, 4), np.float32)
    return shards


def write_safetensors_set(folder: Path, shards: list[dict[str, np.ndarray]], index: bool = True,
                          prefix: str = "model", index_name: str = "model.safetensors.index.json",
                          weight_map: dict[str, str] | None = None) -> dict[str, str]:
    """Write the shards (and the index); return the weight map (tensor -> file name)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = {}
    total = 0
    for number, tensors in enumerate(shards, 1):
        file = shard_name(prefix, number, len(shards), "safetensors")
        save_file(tensors, str(folder / file), metadata={"format": "np", f"shard{number}": str(number)})
        names.update({name: file for name in tensors})
        total += sum(a.nbytes for a in tensors.values())
    if weight_map is None:
        weight_map = names
    if index:
        doc = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / index_name).write_text(json.dumps(doc, indent=2))
    return weight_map


def write_model_files(folder: Path) -> None:
    for name, data in MODEL_FILES.items():
        (folder / name).write_bytes(data)


def safetensors_reference(paths: list[str]) -> list[tuple[str, np.ndarray, str]]:
    """(name, array, file) for every tensor, shard by shard."""
    out = []
    for path in paths:
        for name, array in load_file(path).items():
            out.append((name, array, path))
    return out


def gguf_tensors(count: int = 7, seed: int = 1) -> list[tuple[str, np.ndarray, Q]]:
    """(name, stored array for GGUFWriter, storage type) with float and quantized tensors."""
    rng = np.random.default_rng(seed)
    out = []
    types = (Q.F32, Q.Q8_0, Q.F16, Q.Q4_0, Q.BF16, Q.Q4_K, Q.Q6_K)
    for i in range(count):
        qtype = types[i % len(types)]
        values = rng.standard_normal((4, 256)).astype(np.float32)
        if qtype == Q.F32:
            stored = values
        elif qtype == Q.F16:
            stored = values.astype(np.float16)
        else:
            stored = quantized(qtype.name, (4, 256), rng)  # gguf-py quantizes some types, random blocks others
        out.append((f"blk.{i}.weight", stored, qtype))
    return out


def write_split_gguf(folder: Path, tensors: list[tuple[str, np.ndarray, Q]], per_shard: int,
                     prefix: str = "model", small_first_shard: bool = False) -> list[Path]:
    """gguf-py's splitting writer: returns the shard paths it wrote, in order."""
    folder.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(folder / f"{prefix}.gguf"), "llama", split_max_tensors=per_shard,
                        small_first_shard=small_first_shard)
    writer.add_string("general.name", "split test")
    writer.add_uint32("llama.block_count", len(tensors))
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(40)])
    _add_and_write(writer, tensors)
    paths = sorted(folder.glob(f"{prefix}-*-of-*.gguf"))
    assert paths, "gguf-py did not split"
    return paths


def _add_and_write(writer: GGUFWriter, tensors: list[tuple[str, np.ndarray, Q]]) -> None:
    """Add the tensors (plain types as arrays, quantized ones as their stored bytes) and write the file(s)."""
    for name, stored, qtype in tensors:
        if qtype in (Q.F32, Q.F16):
            writer.add_tensor(name, stored)
        else:
            writer.add_tensor(name, stored, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_gguf_by_hand(path: Path, tensors: list[tuple[str, np.ndarray, Q]], split: tuple[int, int, int] | None,
                       extra: dict[str, str] | None = None) -> None:
    """One GGUF file with explicit split keys (no, count, tensors.count) — for sets gguf-py would not write."""
    writer = GGUFWriter(str(path), "llama")
    for key, value in (extra or {}).items():
        writer.add_string(key, value)
    if split is not None:
        no, count, total = split
        writer.add_uint16("split.no", no)
        writer.add_uint16("split.count", count)
        writer.add_int32("split.tensors.count", total)
    _add_and_write(writer, tensors)


def gguf_reference(paths: list[str]) -> list[tuple[str, np.ndarray, bytes, str]]:
    """(name, float values as gguf-py decodes them, stored bytes, file) per tensor, shard by shard."""
    out = []
    for path in paths:
        for t in GGUFReader(str(path)).tensors:
            data = np.asarray(t.data)
            shape = tuple(reversed([int(d) for d in t.shape]))
            if t.tensor_type in (Q.F32, Q.F16):
                values = data.reshape(shape)
            else:
                values = dequantize(data, t.tensor_type).reshape(shape)
            out.append((t.name, values, data.tobytes(), path))
    return out


def hf_cache_layout(root: Path, source: Path) -> Path:
    """Copy ``source``'s files into ``root/blobs/<hash-like name>`` and link them from ``root/snapshots/rev``.

    Links are relative (``../../blobs/...``), as huggingface_hub makes them; returns the snapshot folder.
    """
    blobs = root / "blobs"
    snapshot = root / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(p for p in source.iterdir() if p.is_file())):
        blob = blobs / f"{i:02d}{'f' * 38}"
        blob.write_bytes(file.read_bytes())
        os.symlink(os.path.join("..", "..", "blobs", blob.name), snapshot / file.name)
    return snapshot


def check_merged(merged: GGUFReader, shards: list) -> None:
    readers = [GGUFReader(str(p)) for p in shards]
    expected = {k: v for k, v in _fields(readers[0]).items() if not k.startswith("split.")}
    assert _fields(merged) == expected
    assert list(_fields(merged)) == list(expected)  # same order as the first shard
    assert _tensors([merged]) == _tensors(readers)


def _fields(reader: GGUFReader) -> dict:
    return {k: (f.types, f.contents()) for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def _tensors(readers: list[GGUFReader]) -> list[tuple]:
    return [(t.name, int(t.tensor_type), t.shape.tolist(), bytes(np.asarray(t.data).view(np.uint8)))
            for r in readers for t in r.tensors]
