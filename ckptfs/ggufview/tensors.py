"""Each tensor of ``gguf/model.gguf``: its llama.cpp name, output type and shape, and its bytes for a range
of output rows, made from the stored rows that range maps to.

The converter's rules: a stored type other than F16 and F32 is widened to F32 first (BF16 exactly); 1-D
tensors, norms and anything not named ``.weight`` stay F32; the rest take the file type (``auto``: BF16 for a
BF16 folder, else F16); Q8_0 falls back to F16 for rows that are not whole 32-element blocks. Conversion is
gguf-py's ``quants.quantize``, row-independent for every type served, so a range of rows converts on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.ggufview import Config, Unsupported
from ckptfs.ggufview.archs import Architecture

SKIPPED_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")
_STORED = {"F32": np.float32, "F16": np.float16, "BF16": "bf16"}


@dataclass(frozen=True)
class TensorPlan:
    name: str                  # llama.cpp's name
    info: TensorInfo | None    # the stored tensor (None for one the converter computes)
    rows: int                  # output rows (the product of every dimension but the last; a vector's length)
    cols: int                  # the last dimension (1 for a vector)
    qtype: int                 # gguf.GGMLQuantizationType
    row_bytes: int             # bytes of one output row
    order: np.ndarray | None   # the stored row of each output row (None: the same row)
    constant: bytes | None = None  # a computed tensor's bytes
    shape: tuple[int, ...] = ()    # as stored (numpy order)

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def stored_row_bytes(self) -> int:
        return self.info.stored_nbytes // self.rows if self.rows else 0


def file_type_of(output_type: str, infos: list[TensorInfo]) -> int:
    """``general.file_type`` (gguf.LlamaFileType) for ``--gguf-type``; ``auto`` from the first stored
    tensor of two or more dimensions, as the converter guesses it."""
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
            break
    return gguf.LlamaFileType.MOSTLY_F16


def plan_tensors(arch: Architecture, config: Config, infos: list[TensorInfo], file_type: int,
                 block_count: int) -> list[TensorPlan]:
    """The tensors the converter computes (F32), then every stored one in stored order; Unsupported for a
    name the architecture's map lacks or a stored type that is not a float."""
    import gguf

    name_map = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.model_arch), block_count)
    plans = []
    for name, values in arch.generated(config).items():
        data = np.ascontiguousarray(values, "<f4")
        cols = data.shape[-1] if data.ndim else 1
        rows = data.size // cols if cols else 0
        plans.append(TensorPlan(name, None, rows, cols, gguf.GGMLQuantizationType.F32, 4 * cols, None,
                                data.tobytes(), tuple(data.shape)))
    for info in infos:
        hf_name = info.name.replace("language_model.", "")
        if hf_name.endswith(SKIPPED_SUFFIXES):
            continue
        if info.storage_type not in _STORED:
            raise Unsupported(f"tensor {info.name} is stored as {info.storage_type}; only F32, F16 and BF16 "
                              "folders are served")
        name = name_map.get_name(key=hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise Unsupported(f"tensor {info.name} has no llama.cpp name for {arch.name}")
        # a vector is a column (one value a row), so a permutation of its values (a q/k bias) is one of rows
        cols = info.shape[-1] if len(info.shape) > 1 else 1
        rows = math.prod(info.shape[:-1]) if len(info.shape) > 1 else math.prod(info.shape)
        qtype = _output_type(name, len(info.shape), file_type, cols)
        order = arch.row_order(hf_name, (rows, cols), config)
        plans.append(TensorPlan(name, info, rows, cols, qtype, _row_bytes(qtype, cols), order,
                                shape=tuple(info.shape)))
    return plans


def _output_type(name: str, n_dims: int, file_type: int, cols: int) -> int:
    import gguf

    qt, ft = gguf.GGMLQuantizationType, gguf.LlamaFileType
    if n_dims <= 1 or name.endswith("_norm.weight") or name[-7:] not in (".weight", ".lora_a", ".lora_b"):
        return qt.F32
    qtype = {ft.ALL_F32: qt.F32, ft.MOSTLY_F16: qt.F16, ft.MOSTLY_BF16: qt.BF16, ft.MOSTLY_Q8_0: qt.Q8_0}[file_type]
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    return qt.F16 if cols % block else qtype


def _row_bytes(qtype: int, cols: int) -> int:
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
    return np.frombuffer(raw, np.dtype(kind).newbyteorder("<")).reshape(rows, cols)


def convert(plan: TensorPlan, values: np.ndarray) -> bytes:
    """Output rows in the tensor's type, through gguf-py's quantizer."""
    import gguf

    return gguf.quants.quantize(values, plan.qtype).tobytes()
