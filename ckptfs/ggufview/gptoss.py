"""gpt-oss (``GptOssForCausalLM``, quantized ``mxfp4``) by the rules of the converter's class for it.

The release stores each layer's experts as ``mlp.experts.PROJ_blocks`` (U8 ``[E, out, in / 32, 16]``: per
expert and output row, 32-value blocks of E2M1 codes, value ``2j`` of a block in the low nibble of byte
``j``), ``PROJ_scales`` (U8 ``[E, out, in / 32]``, each block's E8M0 exponent) and ``PROJ_bias``; ``PROJ`` is
``gate_up_proj`` (gate and up rows interleaved: even rows gate, odd rows up) or ``down_proj``. The converter
repacks those parts into GGML's MXFP4 blocks without changing a value: per block the scale byte, then 16
bytes whose byte ``j`` holds value ``j`` in its low nibble and value ``j + 16`` in its high one (both sides
index the same E2M1 table: GGML doubles the table and halves the scale). ``gate_up_proj`` becomes
``ffn_gate_exps`` (its even rows) and ``ffn_up_exps`` (its odd rows), each ``[E, out / 2, in]``; its bias
``[E, 2 * out]`` splits the same way by column. Each output row is made on read from only the stored rows
it comes from (``Repack``, ``Columns``: the plans' ``QuantRows``). ``sinks`` is renamed ``sinks.weight`` and
``down_proj_bias`` ``down_proj.bias`` before gguf-py's name map; ``general.file_type`` says
``MOSTLY_MXFP4_MOE`` for a float output type (``quantized.Converted.file_type_key``) while the other tensors
take the output type.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ckptfs.core.descriptors import TensorInfo
from ckptfs.ggufview import Config, Unsupported
from ckptfs.ggufview.quantized import halves
from ckptfs.ggufview.tensors import RowReader, TensorPlan, output_type, row_bytes, widen
from ckptfs.ggufview.transforms import default_name

BLOCK = 32                     # values of one MXFP4 block
_EXPERTS = ".mlp.experts."
#: a stored projection -> (its output projections, the first stored row of each, the row step)
_SPLITS = {"gate_up_proj": (("gate_proj", 0, 2), ("up_proj", 1, 2)), "down_proj": (("down_proj", 0, 1),)}


def check(config: Config) -> None:
    """Only the MXFP4 release: a folder with dense experts (a BF16 copy) is refused with one line."""
    method = (config.get("quantization_config") or {}).get("quant_method")
    if method != "mxfp4":
        raise Unsupported(f"a gpt-oss folder whose experts are not MXFP4 (quant_method {method!r}) is not "
                          "served yet")


def gptoss_keys(writer, config: Config, folder: Path) -> None:
    """The sliding window and the experts' feed-forward length (the common keys carry the expert counts)."""
    writer.add_sliding_window(config["sliding_window"])
    writer.add_expert_feed_forward_length(config["intermediate_size"])


def tensor_name(name: str) -> str | None:
    """``sinks`` as ``sinks.weight`` and ``down_proj_bias`` as ``down_proj.bias``, as the converter renames
    them for gguf-py's map."""
    name = default_name(name) or name
    if "sinks" in name:
        name += ".weight"
    return name.replace("down_proj_bias", "down_proj.bias")


def repack(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The release's ``blocks`` ``[n, k, 16]`` and ``scales`` ``[n, k]`` (u8) as GGML MXFP4 rows ``[n, 17 * k]``:
    each block's scale byte, then byte ``j`` = value ``j`` (low nibble) and value ``j + 16`` (high nibble)."""
    n, k = scales.shape
    return np.concatenate((scales.reshape(n, k, 1), halves(blocks)), axis=-1).reshape(n, k * 17)


class Repack:
    """An MXFP4 expert tensor's rows (``QuantRows``, kind ``mxfp4``: bytes as they are): output row ``(x, r)``
    is stored row ``x * out + first + step * r`` of the blocks and scales, repacked. A range reads one span of
    stored rows (for gate or up, the other one's rows between them too: one read instead of one a row)."""

    kind = "mxfp4"
    fp8 = False
    rounded = "F32"

    def __init__(self, read: RowReader, blocks: TensorInfo, scales: TensorInfo, out: int, columns: int,
                 first: int, step: int):
        self._read, self._blocks, self._scales = read, blocks, scales
        self._out, self._columns, self._first, self._step = out, columns, first, step

    def output(self, rows: np.ndarray) -> bytes:
        """The output rows ``rows`` (ascending, adjacent: the tensor's own row numbers)."""
        if len(rows) == 0:
            return b""
        expert, row = np.divmod(rows, self._out // self._step)
        stored = expert * self._out + self._first + self._step * row
        span = np.arange(int(stored[0]), int(stored[-1]) + 1)
        pick = stored - span[0]
        blocks = np.frombuffer(self._read(self._blocks, self._columns * 16, span), np.uint8)
        scales = np.frombuffer(self._read(self._scales, self._columns, span), np.uint8)
        return repack(blocks.reshape(len(span), self._columns, 16)[pick],
                      scales.reshape(len(span), self._columns)[pick]).tobytes()


class Columns:
    """Every ``step``-th column from ``first`` of each stored row (the gate or up half of
    ``gate_up_proj_bias``) as float32 values (``QuantRows``, kind ``dequantized``: converted as a float32
    tensor's rows; the converter widens the stored type exactly before it splits)."""

    kind = "dequantized"
    fp8 = False
    rounded = "F32"  # the stored values widened, never rounded

    def __init__(self, read: RowReader, info: TensorInfo, first: int, step: int):
        self._read, self._info, self._first, self._step = read, info, first, step

    def output(self, rows: np.ndarray) -> np.ndarray:
        cols = self._info.shape[-1]
        raw = self._read(self._info, self._info.stored_nbytes // self._info.shape[0], rows)
        values = widen(raw, self._info.storage_type, len(rows), cols)[:, self._first::self._step]
        return np.ascontiguousarray(values, np.float32)


def expert_parts(config: Config, infos: list[TensorInfo], name_map, file_type,
                 read: RowReader) -> tuple[list[TensorPlan], set[str]]:
    """The expert tensors made from the release's parts (``_blocks`` with ``_scales``; ``gate_up_proj_bias``
    split by column), reading with ``read``, and the stored names they consume."""
    import gguf

    by_name = {info.name: info for info in infos}
    plans: list[TensorPlan] = []
    consumed: set[str] = set()
    for info in infos:
        if _EXPERTS not in info.name:
            continue
        prefix, _, part = info.name.rpartition("_")
        stem, _, projection = prefix.rpartition(".")
        if part == "blocks":
            splits = _projection_splits(info.name, projection)
            scales, (experts, out, columns) = _check_parts(info, by_name.get(f"{prefix}_scales"))
            for new, first, step in splits:
                name = _mapped(name_map, f"{stem}.{new}.weight", info.name)
                plans.append(TensorPlan(name, info, experts * out // step, columns * BLOCK,
                                        gguf.GGMLQuantizationType.MXFP4, columns * 17, None,
                                        shape=(experts, out // step, columns * BLOCK),
                                        quantized=Repack(read, info, scales, out, columns, first, step)))
            consumed.update((info.name, f"{prefix}_scales"))
        elif part == "bias" and projection == "gate_up_proj":
            if len(info.shape) != 2 or info.shape[1] % 2 or info.storage_type not in ("F32", "F16", "BF16"):
                raise Unsupported(f"{info.name} is {info.storage_type} {list(info.shape)}: expected a float "
                                  "[experts, 2 * out] bias")
            experts, cols = info.shape
            for new, first, step in _SPLITS[projection]:
                name = _mapped(name_map, f"{stem}.{new}.bias", info.name)
                qtype = output_type(name, 2, file_type, cols // step)
                plans.append(TensorPlan(name, info, experts, cols // step, qtype, row_bytes(qtype, cols // step),
                                        None, shape=(experts, cols // step),
                                        quantized=Columns(read, info, first, step)))
            consumed.add(info.name)
    return plans, consumed


def _projection_splits(name: str, projection: str) -> tuple[tuple[str, int, int], ...]:
    if projection not in _SPLITS:
        raise Unsupported(f"{name}: MXFP4 blocks of an unknown projection {projection!r}")
    return _SPLITS[projection]


def _check_parts(blocks: TensorInfo, scales: TensorInfo | None) -> tuple[TensorInfo, tuple[int, int, int]]:
    """The scales and (experts, stored rows per expert, blocks per row) of a ``_blocks`` / ``_scales`` pair,
    or Unsupported."""
    if scales is None:
        raise Unsupported(f"{blocks.name} has no _scales beside it")
    if blocks.storage_type != "U8" or len(blocks.shape) != 4 or blocks.shape[3] != BLOCK // 2:
        raise Unsupported(f"{blocks.name} is {blocks.storage_type} {list(blocks.shape)}: expected U8 "
                          f"[experts, out, in / {BLOCK}, {BLOCK // 2}]")
    experts, out, columns, _ = blocks.shape
    if scales.storage_type not in ("U8", "F8_E8M0") or tuple(scales.shape) != (experts, out, columns):
        raise Unsupported(f"{scales.name} is {scales.storage_type} {list(scales.shape)}: expected U8 "
                          f"{[experts, out, columns]}")
    if out % 2 and blocks.name.endswith("gate_up_proj_blocks"):
        raise Unsupported(f"{blocks.name} has an odd number of gate/up rows ({out})")
    return scales, (experts, out, columns)


def _mapped(name_map, hf_name: str, stored: str) -> str:
    name = name_map.get_name(key=hf_name, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise Unsupported(f"tensor {stored} has no llama.cpp name for gpt-oss")
    return name
