"""A quantized folder's tensors as llama.cpp's converter sees them: which stored parts it consumes, which
layers it dequantizes and which NVFP4 layers it repacks bit for bit.

The converter handles a quantized safetensors folder before naming any tensor:

- ``quant_method: fp8`` (block-scaled or per tensor), compressed-tensors ``float-quantized`` /
  ``int-quantized`` / ``naive-quantized`` (``channel`` or ``block`` strategy) and ModelOpt's FP8 layers are
  dequantized, ``float32(code) * float32(scale)`` with the scale repeated over its block, then written in the
  file type like any float tensor. That is the float32 value the scheme views of ``ckptfs.packed`` compute
  (no rounding in between), so their rows are decoded through the engine's one decode door and converted as
  a stored float32 tensor would be.
- compressed-tensors ``nvfp4-pack-quantized`` (and a ``mixed-precision`` config whose every group is) and
  ModelOpt ``NVFP4`` layers are repacked into GGML's NVFP4 (type 40) without touching a value: per 64
  weights, the four E4M3 group scales with their sign bit cleared, then 32 bytes holding, per group of 16,
  element ``j`` in the low nibble and ``j + 8`` in the high one of byte ``j``. The per-tensor scale llama.cpp
  multiplies in is a companion F32 tensor ``NAME.scale`` (ModelOpt's ``weight_scale_2``; for
  compressed-tensors ``1 / weight_global_scale`` in float32), the activations' ``NAME.input_scale`` likewise
  (``input_scale``; ``1 / input_global_scale``); each is left out when it is one value within 1e-6 of 1.
- ``quant_method: mxfp4`` (gpt-oss) is served as stored: the architecture's entry repacks the MoE experts'
  blocks and scales into GGML's MXFP4 (``gptoss``), and ``general.file_type`` says ``MOSTLY_MXFP4_MOE``.
- GPTQ (2, 4 or 8 bits, with ``g_idx``) and compressed-tensors ``pack-quantized`` (int, group strategy) are
  dequantized by the converter in float32, ``scale * (q - zero)``; their views compute that product and then
  round it to the scales' type as AutoGPTQ and compressed-tensors do, and a value rounded once to a type is
  unchanged by rounding to it again: the file is the converter's when the output type of those layers is the
  scales' type (F16 for AutoGPTQ's folders, whose ``auto`` type is F16), and refused in one line otherwise.
- Any other method (bitsandbytes, AWQ, fbgemm FP8, ...) gets no ``gguf/``: the converter refuses them.

Activation and KV-cache scales the converter drops are dropped here too; a part it keeps (an FP8 layer's
``input_scale``) reaches the name map, which refuses it as the converter does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.core.descriptors import TensorInfo
from ckptfs.engine.decode import decode_parts
from ckptfs.ggufview import Config, Unsupported
from ckptfs.ggufview.files import read_json
from ckptfs.packed.bits import scale_to_f32
from ckptfs.packed.views import PackedTensor, PartReader

#: GGML NVFP4: 64 weights in 4 groups of 16, stored as 4 scale bytes then 32 code bytes
NVFP4_BLOCK, NVFP4_GROUP, NVFP4_BYTES = 64, 16, 36
DEQUANTIZED = ("fp8", "modelopt/FP8", "compressed-tensors/float-quantized", "compressed-tensors/int-quantized",
               "compressed-tensors/naive-quantized", "gptq", "compressed-tensors")
REPACKED = ("compressed-tensors/nvfp4-pack-quantized", "modelopt/NVFP4")
CT = "compressed-tensors"
CT_DEQUANTIZED_FORMATS = ("float-quantized", "int-quantized", "naive-quantized")
NVFP4_FORMAT = "nvfp4-pack-quantized"
MXFP4 = "mxfp4"  # gpt-oss's quant_method
#: the parts of a layer the converter uses up, by scheme (None: all); the others reach its name map (an FP8
#: layer's input_scale, a zero point), which refuses them
CONSUMED: dict[str, tuple[str, ...]] = {
    "fp8": ("weight", "weight_scale_inv", "activation_scale"),
    "gptq": ("qweight", "qzeros", "scales", "g_idx"),
    CT: ("weight_packed", "weight_shape", "weight_scale", "weight_zero_point"),
    **{f"{CT}/{fmt}": ("weight", "weight_scale") for fmt in ("float-quantized", "int-quantized",
                                                             "naive-quantized")}}


class QuantRows(Protocol):
    """The output rows of one converted layer, from the stored rows ``rows`` (in output order)."""

    kind: str  # "dequantized": float32 values to convert; "nvfp4", "mxfp4": the tensor's bytes as they are
    fp8: bool  # dequantized from FP8 codes (what the converter's --fp8-as-q8 writes in Q8_0)
    #: the type the view rounds its values to as the scheme's reference does (F32: not rounded)
    rounded: str

    def output(self, rows: np.ndarray) -> np.ndarray | bytes: ...


@dataclass
class Converted:
    """The folder's tensors for the converter's rules: ``infos`` in stored order, a layer's consumed parts
    left out and its weight standing in the first part's place (``TensorInfo`` of the dense weight, type
    ``F32`` for a dequantized layer, ``NVFP4`` for a repacked one); ``rows`` how each such weight is made;
    ``companions`` the F32 tensors written beside a weight (suffix replacing ``.weight`` -> values)."""

    infos: list[TensorInfo]
    rows: dict[str, QuantRows] = field(default_factory=dict)
    companions: dict[str, list[tuple[str, np.ndarray]]] = field(default_factory=dict)
    nvfp4: bool = False  # the converter takes its NVFP4 path (the folder's settings say NVFP4)
    mxfp4: bool = False  # quant_method mxfp4 (gpt-oss: its entry repacks the experts, ``gptoss``)

    def file_type_key(self, file_type: int) -> int:
        """``general.file_type`` as the converter writes it: an NVFP4 folder converted to a float type
        (``f32``, ``f16``, ``bf16``, ``auto``) is called ``MOSTLY_NVFP4``, an MXFP4 one ``MOSTLY_MXFP4_MOE``,
        its other tensors still in that float type."""
        import gguf

        ft = gguf.LlamaFileType
        if file_type in (ft.ALL_F32, ft.MOSTLY_F16, ft.MOSTLY_BF16):
            if self.nvfp4:
                return int(ft.MOSTLY_NVFP4)
            if self.mxfp4:
                return int(ft.MOSTLY_MXFP4_MOE)
        return int(file_type)


def converted_tensors(ck: Checkpoint, config: Config, folder: Path) -> Converted:
    """The converter's view of ``ck``'s tensors (a folder without quantization settings: as stored)."""
    stored = [info for info in ck.parsed.tensors]
    method, fmt, groups = _settings(config, folder)
    if method == MXFP4:  # gpt-oss: its architecture entry makes the experts from the stored parts
        return Converted(stored, mxfp4=True)
    if not ck.packed_views:
        return Converted(stored)
    repack = _is_nvfp4(method, fmt, groups, config, folder)
    _check_method(method, fmt, groups, repack, config)
    dropped = _dropped_suffixes(method, repack)
    consumed: dict[str, str] = {}          # stored part -> the layer's weight name
    made: dict[str, tuple[TensorInfo, QuantRows, list[tuple[str, np.ndarray]]]] = {}
    for row in ck.packed_views:
        name, scheme = row["name"], row["scheme"]
        if not row["present"]:
            raise Unsupported(f"layer {name} has no dequantized view ({row.get('reason')}), so no gguf/")
        tensor = ck[name]
        if not isinstance(tensor, PackedTensor):
            raise Unsupported(f"{name} is not a view of packed parts")
        prefix = name.removesuffix(".weight")
        if scheme in REPACKED and repack:
            info, rows, companions = _nvfp4(ck, tensor, prefix, row["parts"])
        elif scheme in DEQUANTIZED:
            if scheme == "fp8" and "weight_scale_inv" not in tensor.layout.parts:
                raise Unsupported(f"layer {name} has no weight_scale_inv, which llama.cpp's converter "
                                  "dequantizes an fp8 weight by, so no gguf/")
            if scheme == "gptq" and "g_idx" not in tensor.layout.parts:
                raise Unsupported(f"layer {name} has no g_idx, which llama.cpp's converter needs to dequantize "
                                  "a gptq layer, so no gguf/")
            info, companions = _dequantized(ck, tensor), []
            rows = DequantizedRows(ck, tensor, _fp8_marked(scheme, tensor, groups))
        else:
            raise Unsupported(f"layer {name} is quantized as {scheme}, which llama.cpp's converter does not "
                              "convert as ckptfs serves it, so no gguf/")
        roles = CONSUMED.get(scheme)
        for part in row["parts"]:
            if roles is None or part.removeprefix(prefix + ".") in roles:
                consumed[part] = name
        made[name] = (info, rows, companions)
    result = Converted([], nvfp4=repack)
    for info in stored:
        owner = consumed.get(info.name)
        if owner is None:
            if not info.name.endswith(dropped):
                result.infos.append(info)
            continue
        if owner in made:  # the layer's first part in stored order takes its place
            weight, rows, companions = made.pop(owner)
            result.infos.append(weight)
            result.rows[weight.name] = rows
            result.companions[weight.name] = companions
    return result


def _settings(config: Config, folder: Path) -> tuple[str | None, str | None, Mapping[str, Any]]:
    """(quant_method, format, config_groups) as the converter reads them: ``config.json``'s
    ``quantization_config``, else ModelOpt's ``hf_quant_config.json`` (its producer's name the method)."""
    quant = config.get("quantization_config")
    quant = quant if isinstance(quant, dict) else {}
    method, fmt, groups = quant.get("quant_method"), quant.get("format"), quant.get("config_groups") or {}
    if not quant.get("quant_algo"):
        older = read_json(folder / "hf_quant_config.json")
        if isinstance(older, dict):
            inner = older.get("quantization") or {}
            producer = older.get("producer") or {}
            if method is None and isinstance(producer, dict):
                method = str(producer.get("name") or "").lower()
            if isinstance(inner, dict):
                method = inner.get("quant_method", method)
                fmt = inner.get("format", fmt)
                groups = inner.get("config_groups", groups) or {}
    return (method if isinstance(method, str) else None, fmt if isinstance(fmt, str) else None,
            groups if isinstance(groups, dict) else {})


def _is_nvfp4(method: str | None, fmt: str | None, groups: Mapping[str, Any], config: Config,
              folder: Path) -> bool:
    """Whether the converter takes the NVFP4 repacking path for this folder."""
    if method == CT:
        return fmt == NVFP4_FORMAT or (fmt == "mixed-precision" and bool(groups) and all(
            g.get("format") == NVFP4_FORMAT for g in groups.values() if isinstance(g, dict)))
    quant = config.get("quantization_config")
    quant = quant if isinstance(quant, dict) else {}
    older = read_json(folder / "hf_quant_config.json")
    inner = older.get("quantization") if isinstance(older, dict) else None
    inner = inner if isinstance(inner, dict) else {}
    algo = quant.get("quant_algo") or inner.get("quant_algo")
    layers = quant.get("quantized_layers") or inner.get("quantized_layers") or {}
    if algo == "NVFP4":
        return True
    return isinstance(layers, dict) and any(str(v.get("quant_algo")).endswith("NVFP4")
                                            for v in layers.values() if isinstance(v, dict))


def _quant(config: Config) -> Mapping[str, Any]:
    quant = config.get("quantization_config")
    return quant if isinstance(quant, dict) else {}


def _check_method(method: str | None, fmt: str | None, groups: Mapping[str, Any], repack: bool,
                  config: Config) -> None:
    """Unsupported, in one line, for a method or format the converter does not convert as served here."""
    if repack or method in ("fp8", "modelopt"):
        return
    if method == "gptq":
        if _quant(config).get("bits") not in (2, 4, 8):
            raise Unsupported(f"llama.cpp's converter does not convert {_quant(config).get('bits')}-bit gptq, "
                              "so no gguf/")
        return
    if method == CT and fmt == "pack-quantized":
        weights = next(iter(groups.values())).get("weights") or {} if len(groups) == 1 else {}
        if weights.get("strategy") != "group" or weights.get("type", "int") != "int":
            raise Unsupported("llama.cpp's converter converts compressed-tensors pack-quantized of one config "
                              "group with strategy group and int weights only, so no gguf/")
        return
    if method == CT and fmt in CT_DEQUANTIZED_FORMATS:
        if len(groups) != 1:
            raise Unsupported("llama.cpp's converter does not convert compressed-tensors with several config "
                              "groups, so no gguf/")
        weights = next(iter(groups.values())).get("weights") or {}
        strategy = weights.get("strategy")
        if strategy not in ("channel", "block") or weights.get("group_size") is not None:
            raise Unsupported(f"llama.cpp's converter does not convert compressed-tensors {fmt} with strategy "
                              f"{strategy!r} (only channel or block), so no gguf/")
        return
    shown = repr(method) if fmt is None or method != CT else f"{method!r} format {fmt!r}"
    raise Unsupported(f"no gguf/ for quant_method {shown}: llama.cpp's converter does not convert it to the "
                      "values ckptfs's view decodes (see docs/gguf-view.md)")


def _dropped_suffixes(method: str | None, repack: bool) -> tuple[str, ...]:
    """Names of stored tensors the converter drops without using them (activation and KV-cache scales)."""
    dropped: tuple[str, ...] = ()
    if method == "fp8":
        dropped += (".activation_scale", "_activation_scale")
    if method == "modelopt":
        dropped += (".input_scale", ".k_scale", ".v_scale")
    if repack:
        dropped += (".k_scale", ".v_scale")
    return dropped


def _dequantized(ck: Checkpoint, tensor: PackedTensor) -> TensorInfo:
    """The dense weight's descriptor: float32 values of the view's shape."""
    shape = tuple(tensor.layout.shape)
    return replace(tensor.info, storage_type="F32", stored_nbytes=4 * math.prod(shape), shape=shape,
                   block_elements=0, block_bytes=0)


class DequantizedRows:
    """A dequantized layer's rows as float32, decoded by its view's layout through the engine's decode door
    (runs of adjacent rows at once), not cached: a GGUF reader reads each tensor once."""

    kind = "dequantized"

    def __init__(self, ck: Checkpoint, tensor: PackedTensor, fp8: bool):
        self.fp8 = fp8
        self.rounded = tensor.layout.scale_type
        self._layout = tensor.layout
        self._reader = PartReader(ck, tensor.layout, tensor.name)

    def output(self, rows: np.ndarray) -> np.ndarray:
        cols = self._layout.in_features
        out = np.empty((len(rows), cols), np.float32)
        for start, stop, at in _runs(rows):
            decode_parts("packed", self._layout, self._reader, start, stop, out[at: at + stop - start])
        return out


def _fp8_marked(scheme: str, tensor: PackedTensor, groups: Mapping[str, Any]) -> bool:
    """Whether the converter's ``--fp8-as-q8`` counts this dequantized layer as FP8: every ``fp8`` layer,
    a compressed-tensors ``float-quantized`` one whose group says 8-bit floats, a ModelOpt one whose weight
    is stored as E4M3 or E5M2."""
    if scheme == "fp8":
        return True
    if scheme == f"{CT}/float-quantized":
        weights = next(iter(groups.values())).get("weights") or {}
        return weights.get("type") == "float" and weights.get("num_bits") == 8
    if scheme == "modelopt/FP8":
        return any(part.storage_type in ("F8_E4M3", "F8_E5M2") for role, part in tensor.layout.parts.items()
                   if role == "weight")
    return False


def _runs(rows: np.ndarray) -> list[tuple[int, int, int]]:
    """(first stored row, one past the last, position in the output) of each run of adjacent rows."""
    if len(rows) == 0:
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(rows)]))
    return [(int(rows[a]), int(rows[b - 1]) + 1, int(a)) for a, b in zip(starts, stops)]


class Nvfp4Rows:
    """An NVFP4 layer's rows in GGML's NVFP4 layout: the stored codes and group scales of the rows, bits
    moved (module docstring)."""

    kind = "nvfp4"
    fp8 = False
    rounded = "F32"

    def __init__(self, ck: Checkpoint, tensor: PackedTensor, codes_role: str):
        self._reader = PartReader(ck, tensor.layout, tensor.name)
        self._codes = codes_role
        self._cols = tensor.layout.in_features

    def output(self, rows: np.ndarray) -> bytes:
        n, groups = len(rows), self._cols // NVFP4_GROUP
        codes = np.empty((n, self._cols // 2), np.uint8)
        scales = np.empty((n, groups), np.uint8)
        for start, stop, at in _runs(rows):
            codes[at: at + stop - start] = self._reader.rows(self._codes, start, stop)
            scales[at: at + stop - start] = self._reader.rows("weight_scale", start, stop)
        return nvfp4_blocks(codes, scales).tobytes()


def halves(pairs: np.ndarray) -> np.ndarray:
    """Blocks of 4-bit codes as the releases pack them (``[..., half]`` bytes, code ``2i`` in the low nibble of
    byte ``i``) as GGML packs a block: code ``j`` in the low nibble of byte ``j``, code ``j + half`` in its
    high nibble. The codes themselves are unchanged: GGML's FP4 blocks index the same E2M1 table."""
    half = pairs.shape[-1]
    values = np.stack((pairs & 0x0F, pairs >> 4), axis=-1).reshape(*pairs.shape[:-1], 2 * half)
    return values[..., :half] | (values[..., half:] << 4)


def nvfp4_blocks(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Rows of packed E2M1 codes (element ``2i`` in the low nibble of byte ``i``) and their E4M3 group
    scales as GGML NVFP4 blocks ``[rows, cols / 64 * 36]``."""
    n, groups = scales.shape
    packed = halves(codes.reshape(n, groups, 8))
    supers = groups // 4
    out = np.empty((n, supers, NVFP4_BYTES), np.uint8)
    out[:, :, :4] = (scales & 0x7F).reshape(n, supers, 4)
    out[:, :, 4:] = packed.reshape(n, supers, 32)
    return out.reshape(n, supers * NVFP4_BYTES)


def _nvfp4(ck: Checkpoint, tensor: PackedTensor, prefix: str,
           parts: list[str]) -> tuple[TensorInfo, QuantRows, list[tuple[str, np.ndarray]]]:
    """A repacked NVFP4 layer: its descriptor, rows and companion scales as the converter writes them."""
    layout = tensor.layout
    if re.search(r"\.experts\.\d+\.", prefix):
        raise Unsupported(f"NVFP4 experts ({prefix}) are not served in gguf/ yet")
    out, cols = layout.out_features, layout.in_features
    if cols % NVFP4_BLOCK:
        raise Unsupported(f"{prefix}: {cols} columns are not whole NVFP4 blocks of {NVFP4_BLOCK} (llama.cpp's "
                          "converter cannot repack it either)")
    compressed = "weight_packed" in layout.parts
    reader = PartReader(ck, layout, tensor.name)
    if compressed:
        scale2 = np.float32(1.0) / _values(reader, layout.parts["weight_global_scale"], "weight_global_scale")
        input_name = prefix + ".input_global_scale"
    else:
        scale2 = _values(reader, layout.parts["weight_scale_2"], "weight_scale_2")
        input_name = prefix + ".input_scale"
    companions = [(".scale", scale2)]
    if input_name in parts:
        info = ck.stored(input_name).info
        value = _stored_values(ck, info)
        companions.append((".input_scale", np.float32(1.0) / value if compressed else value))
    companions = [(suffix, v.astype(np.float32).reshape(-1)) for suffix, v in companions if not _trivial(v)]
    weight = replace(tensor.info, storage_type="NVFP4", shape=(out, cols),
                     stored_nbytes=out * cols // NVFP4_BLOCK * NVFP4_BYTES, block_elements=0, block_bytes=0)
    return weight, Nvfp4Rows(ck, tensor, "weight_packed" if compressed else "weight"), companions


def _trivial(values: np.ndarray) -> bool:
    """The converter leaves out a scale of at most one value within 1e-6 of 1."""
    return values.size <= 1 and abs(float(values.astype(np.float64).sum()) - 1.0) < 1e-6


def _values(reader: PartReader, info: TensorInfo, role: str) -> np.ndarray:
    return scale_to_f32(reader.whole(role).reshape(-1), info.storage_type)


def _stored_values(ck: Checkpoint, info: TensorInfo) -> np.ndarray:
    """A small stored float tensor (an activation scale) as float32."""
    dtypes = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
    if info.storage_type not in dtypes or info.stored_nbytes > 4096:
        raise Unsupported(f"{info.name} is not a small float tensor ({info.storage_type} {list(info.shape)})")
    raw = ck.sources.get(info.source).pread(info.offset, info.stored_nbytes)
    return scale_to_f32(np.frombuffer(raw, dtypes[info.storage_type]), info.storage_type)
