"""Each tensor of ``gguf/model.gguf``: its llama.cpp name, output type and shape, and its bytes for a range
of output rows, made from the stored rows that range maps to.

The converter's rules: a stored type other than F16 and F32 is widened to F32 first (BF16 exactly), then
the architecture's value shift is added (Gemma's norms); 1-D tensors, norms, anything not named ``.weight``
and the tensors llama.cpp keeps in float32 (position and token-type embeddings among them) stay F32; the rest
take the file type (``auto``: BF16 for a BF16 folder, else F16); Q8_0 falls back to F16 for rows that are not
whole 32-element blocks. Conversion is gguf-py's ``quants.quantize``, row-independent for every type served,
so a range of rows converts on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.ggufview import Config, Unsupported
from ckptfs.ggufview.quantized import Converted, QuantRows

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType, LlamaFileType

SKIPPED_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")
_STORED = {"F32": "<f4", "F16": "<f2", "BF16": "bf16"}  # numpy dtype of a stored type (BF16 widened)

#: (stored tensor, bytes of one stored row, the stored rows wanted in order) -> their bytes
RowReader = Callable[[TensorInfo, int, np.ndarray], bytes]


class Architecture(Protocol):
    """What planning asks of an entry of ``archs.ARCHITECTURES`` (a Protocol, not that class: an entry's own
    rules, gpt-oss's among them, make ``TensorPlan``s, so they import this module)."""

    @property
    def name(self) -> str: ...
    @property
    def model_arch(self) -> str: ...
    @property
    def generated(self) -> Callable[[Config], dict[str, np.ndarray]]: ...
    @property
    def parts(self) -> Callable[[Config, list[TensorInfo], Any, Any, RowReader],
                                tuple[list[TensorPlan], set[str]]]: ...
    @property
    def tensor_name(self) -> Callable[[str], str | None]: ...
    @property
    def rows_kept(self) -> Callable[[str, Path, Config], int | None]: ...
    @property
    def row_order(self) -> Callable[[str, tuple[int, int], Config], np.ndarray | None]: ...
    @property
    def shift(self) -> Callable[[str], float]: ...


@dataclass(frozen=True)
class TensorPlan:
    name: str                  # llama.cpp's name
    info: TensorInfo | None    # the stored tensor (None for one the converter computes)
    rows: int                  # output rows (the product of every dimension but the last; a vector's length)
    cols: int                  # the last dimension (1 for a vector)
    qtype: GGMLQuantizationType
    row_bytes: int             # bytes of one output row
    order: np.ndarray | None   # the stored row of each output row (None: the same row)
    constant: bytes | None = None  # a computed tensor's bytes
    shape: tuple[int, ...] = ()    # as served (numpy order)
    shift: float = 0.0             # added to every value before conversion
    stored_row_bytes: int = 0      # bytes of one stored row
    quantized: QuantRows | None = None  # a quantized layer's rows (dequantized or repacked), not stored rows

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


def file_type_of(output_type: str, infos: list[TensorInfo]) -> LlamaFileType:
    """``general.file_type`` (gguf.LlamaFileType) for ``--gguf-type``; ``auto`` from the first stored
    tensor of two or more dimensions that is BF16 or F16, as the converter guesses it (it passes over F32
    ones and a quantized folder's codes and scales), F16 when there is none."""
    import gguf

    fixed = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
    if output_type != "auto":
        return fixed[output_type]
    for info in infos:
        if len(info.shape) >= 2:
            if info.storage_type == "BF16":
                return gguf.LlamaFileType.MOSTLY_BF16
            if info.storage_type == "F16":
                return gguf.LlamaFileType.MOSTLY_F16
    return gguf.LlamaFileType.MOSTLY_F16


def plan_tensors(arch: Architecture, config: Config, converted: Converted, file_type: LlamaFileType,
                 block_count: int, folder: Path, read: RowReader, fp8_as_q8: bool = False) -> list[TensorPlan]:
    """The tensors the architecture makes from several stored parts (``arch.parts``, reading with ``read``:
    they consume those parts), the ones the converter computes (F32), then every other stored one in stored
    order (a quantized layer's weight where the converter puts it, its companion scales after it:
    ``quantized``); Unsupported for a name the architecture's map lacks or a stored type that is not a
    float. ``fp8_as_q8``: dequantized FP8
    layers of two or more dimensions in Q8_0 whatever the file type (F16 for rows that are not whole
    blocks), as the converter's ``--fp8-as-q8`` forces them."""
    import gguf

    model_arch = getattr(gguf.MODEL_ARCH, arch.model_arch)
    name_map = gguf.get_tensor_name_map(model_arch, block_count)
    always_f32 = _always_f32_names(model_arch, block_count)
    plans, consumed = arch.parts(config, converted.infos, name_map, file_type, read)
    for name, values in arch.generated(config).items():
        data = np.ascontiguousarray(values, "<f4")
        cols = data.shape[-1] if data.ndim else 1
        rows = data.size // cols if cols else 0
        plans.append(TensorPlan(name, None, rows, cols, gguf.GGMLQuantizationType.F32, 4 * cols, None,
                                data.tobytes(), tuple(data.shape)))
    for info in converted.infos:
        if info.name in consumed:
            continue
        hf_name = arch.tensor_name(info.name)
        if hf_name is None or hf_name.endswith(SKIPPED_SUFFIXES):
            continue
        quantized = converted.rows.get(info.name)
        if quantized is None and info.storage_type not in _STORED:
            raise Unsupported(f"tensor {info.name} is stored as {info.storage_type}; only F32, F16 and BF16 "
                              "folders are served")
        mapped = name_map.get_name(key=hf_name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise Unsupported(f"tensor {info.name} has no llama.cpp name for {arch.name}")
        name = mapped
        # a vector is a column (one value a row), so a permutation of its values (a q/k bias) is one of rows
        cols = info.shape[-1] if len(info.shape) > 1 else 1
        stored_rows_count = math.prod(info.shape[:-1]) if len(info.shape) > 1 else math.prod(info.shape)
        stored_row_bytes = info.stored_nbytes // stored_rows_count if stored_rows_count else 0
        rows, shape = stored_rows_count, tuple(info.shape)
        kept = arch.rows_kept(hf_name, folder, config)
        if kept is not None and kept < shape[0]:
            shape = (kept, *shape[1:])
            rows = math.prod(shape[:-1]) if len(shape) > 1 else kept
        if quantized is not None and quantized.kind == "nvfp4":
            qtype = gguf.GGMLQuantizationType.NVFP4
        elif quantized is not None and fp8_as_q8 and quantized.fp8 and len(shape) >= 2:
            qtype = output_type(name, len(shape), gguf.LlamaFileType.MOSTLY_Q8_0, cols, False)
        else:
            qtype = output_type(name, len(shape), file_type, cols, name in always_f32)
        if quantized is not None and quantized.rounded not in ("F32", qtype.name):
            raise Unsupported(f"{info.name}: its view rounds the values to {quantized.rounded} as the scheme's "
                              f"reference does, where llama.cpp's converter writes the unrounded ones in "
                              f"{qtype.name}: this folder's gguf/ is served in --gguf-type "
                              f"{quantized.rounded.lower()} only")
        order = arch.row_order(hf_name, (rows, cols), config)
        plans.append(TensorPlan(name, info, rows, cols, qtype, row_bytes(qtype, cols), order, shape=shape,
                                shift=arch.shift(hf_name), stored_row_bytes=stored_row_bytes,
                                quantized=quantized))
        for suffix, values in converted.companions.get(info.name, ()):
            plans.append(TensorPlan(name.removesuffix(".weight") + suffix, None, 1, values.size,
                                    gguf.GGMLQuantizationType.F32, 4 * values.size, None, values.tobytes(),
                                    (values.size,)))
    return plans


#: The tensors the converter keeps in float32 whatever the file type (those an architecture has).
_ALWAYS_F32 = ("FFN_GATE_INP", "FFN_GATE_INP_SHEXP", "POS_EMBD", "TOKEN_TYPES", "SSM_CONV1D", "SHORTCONV_CONV",
               "TIME_MIX_FIRST", "TIME_MIX_W1", "TIME_MIX_W2", "TIME_MIX_DECAY_W1", "TIME_MIX_DECAY_W2",
               "TIME_MIX_LERP_FUSED", "POSNET_NORM1", "POSNET_NORM2", "V_ENC_EMBD_POS", "A_ENC_EMBD_POS",
               "ALTUP_CORRECT_COEF", "ALTUP_PREDICT_COEF", "SSM_CONV1D_Q", "SSM_CONV1D_K", "SSM_CONV1D_V",
               "INDEXER_PROJ")


def _always_f32_names(model_arch, block_count: int) -> set[str]:
    """The llama.cpp ``.weight`` names of ``_ALWAYS_F32`` tensors in this architecture's blocks."""
    import gguf

    names: set[str] = set()
    for key in _ALWAYS_F32:
        tensor = getattr(gguf.MODEL_TENSOR, key, None)
        if tensor is None or tensor not in gguf.MODEL_TENSORS[model_arch]:
            continue
        template = gguf.TENSOR_NAMES[tensor]
        blocks = range(block_count) if "{bid}" in template else (None,)
        names.update(template.format(bid=bid) + ".weight" for bid in blocks)
    return names


def output_type(name: str, n_dims: int, file_type: LlamaFileType, cols: int,
                always_f32: bool = False) -> GGMLQuantizationType:
    import gguf

    qt, ft = gguf.GGMLQuantizationType, gguf.LlamaFileType
    if (n_dims <= 1 or always_f32 or name.endswith("_norm.weight")
            or name[-7:] not in (".weight", ".lora_a", ".lora_b")):
        return qt.F32
    qtype = {ft.ALL_F32: qt.F32, ft.MOSTLY_F16: qt.F16, ft.MOSTLY_BF16: qt.BF16, ft.MOSTLY_Q8_0: qt.Q8_0}[file_type]
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    return qt.F16 if cols % block else qtype


def row_bytes(qtype: GGMLQuantizationType, cols: int) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return cols // block * size


def stored_rows(plan: TensorPlan, r0: int, r1: int) -> np.ndarray:
    """The stored row behind each output row of [r0, r1)."""
    return np.arange(r0, r1) if plan.order is None else plan.order[r0:r1]


def widen(raw: bytes, storage_type: str, rows: int, cols: int) -> np.ndarray:
    """Stored rows as the converter holds them before converting: F16 and F32 as they are, BF16 as F32."""
    kind = _STORED[storage_type]
    if kind == "bf16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(rows, cols)
    return np.frombuffer(raw, np.dtype(kind)).reshape(rows, cols)


def convert(plan: TensorPlan, values: np.ndarray) -> bytes:
    """Output rows in the tensor's type, through gguf-py's quantizer (the shift added first, in the type the
    values are held in, as the converter adds it)."""
    import gguf

    if plan.shift:
        values = values + np.asarray(plan.shift, dtype=values.dtype)
    return gguf.quants.quantize(values, plan.qtype).tobytes()


def convert_quantized(plan: TensorPlan, quantized: QuantRows, rows: np.ndarray) -> bytes:
    """A quantized layer's output rows from its stored rows ``rows``: repacked bytes as they are, dequantized
    float32 values converted as a stored float32 tensor's are."""
    produced = quantized.output(rows)
    return produced if isinstance(produced, bytes) else convert(plan, produced)


def convert_stored(plan: TensorPlan, raw: bytes, rows: int) -> bytes:
    """Stored rows (in output order) as output rows. A tensor served in its stored type with no value shift
    is its stored bytes, as gguf-py's quantizer returns them (F32 and F16 unchanged; BF16 widened and rounded
    back is unchanged too, but for a NaN, whose quiet bit it sets), without widening; else ``convert``."""
    import gguf

    qt = gguf.GGMLQuantizationType
    if plan.info is None:
        raise ValueError(f"{plan.name} is computed, not stored: it has no stored rows")
    storage_type = plan.info.storage_type
    same = {("F32", qt.F32), ("F16", qt.F16), ("BF16", qt.BF16)}
    if plan.shift or (storage_type, plan.qtype) not in same:
        return convert(plan, widen(raw, storage_type, rows, plan.cols))
    if plan.qtype != qt.BF16:
        return raw
    words = np.frombuffer(raw, "<u2")
    nan = (words & 0x7FFF) > 0x7F80
    if not nan.any():
        return raw
    return np.where(nan, words | 0x0040, words).astype("<u2").tobytes()
