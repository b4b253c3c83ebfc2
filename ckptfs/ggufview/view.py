"""``gguf/model.gguf``: the header built at mount, each tensor's bytes produced per read.

The header is gguf-py's ``GGUFWriter`` output (typed keys, tensor infos, offsets aligned as it aligns them)
written into memory; the data section holds each tensor at its offset, zeros between. A read converts only
the output rows it overlaps, from only the stored rows they come from (runs of adjacent rows read at once).
"""

from __future__ import annotations

import bisect
import io
import logging
from pathlib import Path

import numpy as np

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.core.descriptors import TensorInfo
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.engine.views import HeaderBodyView
from ckptfs.ggufview import Unsupported
from ckptfs.ggufview.archs import architecture_of
from ckptfs.ggufview.files import one_build, read_json, vet
from ckptfs.ggufview.hparams import add_common_keys, block_count, check_sizes
from ckptfs.ggufview.liblog import library_logs_to
from ckptfs.ggufview.staging import model_folder
from ckptfs.ggufview.quantized import converted_tensors
from ckptfs.ggufview.tensors import (TensorPlan, convert_quantized, convert_stored, file_type_of, plan_tensors,
                                     stored_rows)
from ckptfs.ggufview.writer import new_writer

log = logging.getLogger("ckptfs.ggufview")


def _config(folder: Path) -> dict:
    config = read_json(folder / "config.json")
    if not isinstance(config, dict):
        raise Unsupported("config.json is not a JSON object")
    return config


class VirtualGgufView(HeaderBodyView):
    """The GGUF file of a Hugging Face model folder, in ``output_type`` (``fp8_as_q8``: a quantized folder's
    FP8 layers in Q8_0, as the converter's ``--fp8-as-q8``)."""

    def __init__(self, ck: Checkpoint, output_type: str = "auto", fp8_as_q8: bool = False):
        self._sources = ck.sources
        with library_logs_to(log), model_folder(ck) as staged, one_build():
            folder = staged.path
            #: the folder's files the header is made from (tree.mount_tree.Entry.made_from)
            self.made_from = staged.files
            vet(folder)
            config = _config(folder)
            arch = architecture_of(config)
            converted = converted_tensors(ck, config, folder)
            check_sizes(config, converted.infos)
            file_type = file_type_of(output_type, list(ck.parsed.tensors))
            n_blocks = block_count(config)
            self.plans = plan_tensors(arch, config, converted, file_type, n_blocks, folder, self._read_rows,
                                      fp8_as_q8)
            writer = new_writer(arch.name)
            for plan in self.plans:
                writer.add_tensor_info(plan.name, plan.shape or (1,), np.dtype(np.float32), plan.nbytes,
                                       raw_dtype=plan.qtype)
            self._add_metadata(writer, folder, config, arch, converted.file_type_key(file_type))
        self.header, self._starts, self.size = _serialize(writer)

    @staticmethod
    def _add_metadata(writer, folder: Path, config: dict, arch, file_type: int) -> None:
        """general.*, the architecture's keys and the tokenizer's, in the converter's order."""
        import gguf

        total = writer.get_total_parameter_count()
        meta = gguf.Metadata.load(None, folder, None, total[0])
        _repetition_penalty(meta, folder)
        if meta.name is None:
            meta.name = folder.name
        if meta.size_label is None and total[0] > 0:
            meta.size_label = gguf.size_label(*total)
        writer.add_type(gguf.GGUFType.MODEL)
        meta.set_gguf_meta_model(writer)
        if arch.common_keys:
            add_common_keys(writer, config, file_type)
        else:
            writer.add_file_type(file_type)
        arch.extra_keys(writer, config, folder)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        arch.vocab(writer, config, folder)

    def tensor_at(self, name: str) -> tuple[TensorPlan, int]:
        """A tensor's plan and the offset of its data in the file (KeyError for a name not served)."""
        for plan, start in zip(self.plans, self._starts):
            if plan.name == name:
                return plan, start
        raise KeyError(name)

    def body_into(self, d0: int, target: np.ndarray, keep: bool = True, scope: ReadScope = NOTHING_SAID) -> None:
        """Bytes [d0, d0 + len(target)) after the header: each tensor's rows converted, zeros between tensors."""
        hlen = len(self.header)
        pos, end = d0 + hlen, d0 + len(target) + hlen
        i = max(0, bisect.bisect_right(self._starts, pos) - 1)
        while pos < end:
            if i >= len(self.plans) or pos < self._starts[i]:
                stop = min(end, self._starts[i] if i < len(self.plans) else end)
                target[pos - hlen - d0: stop - hlen - d0] = 0
                pos = stop
                continue
            plan, start = self.plans[i], self._starts[i]
            if pos < start + plan.nbytes:
                stop = min(end, start + plan.nbytes)
                target[pos - hlen - d0: stop - hlen - d0] = np.frombuffer(
                    self._tensor_bytes(plan, pos - start, stop - start, scope), np.uint8)
                pos = stop
            i += 1

    def _tensor_bytes(self, plan: TensorPlan, b0: int, b1: int, scope: ReadScope) -> bytes:
        """Bytes [b0, b1) of one converted tensor."""
        if plan.constant is not None:
            return plan.constant[b0:b1]
        if plan.info is None:
            raise ValueError(f"{plan.name} is computed but has no bytes")
        r0, r1 = b0 // plan.row_bytes, -(-b1 // plan.row_bytes)
        rows = stored_rows(plan, r0, r1)
        skip = b0 - r0 * plan.row_bytes
        if plan.quantized is not None:
            return convert_quantized(plan, plan.quantized, rows)[skip: skip + b1 - b0]
        data = read_rows(self._sources.get(plan.info.source), plan.info, plan.stored_row_bytes, rows, scope)
        out = convert_stored(plan, data, len(rows))
        return out[skip: skip + b1 - b0]


    def _read_rows(self, info: TensorInfo, size: int, rows: np.ndarray) -> bytes:
        """``read_rows`` from the stored tensor's own source (what an entry's multi-part tensors read with)."""
        return read_rows(self._sources.get(info.source), info, size, rows)


def _repetition_penalty(meta, folder: Path) -> None:
    """``general.sampling.penalty_repeat`` from ``generation_config.json``'s ``repetition_penalty`` when it has
    no ``penalty_repeat``: the converter's gguf-py reads both, the pinned gguf-py 0.19.0 only the latter."""
    generation = read_json(folder / "generation_config.json")
    if isinstance(generation, dict) and "penalty_repeat" not in generation and "repetition_penalty" in generation:
        meta.sampling_penalty_repeat = generation["repetition_penalty"]


def read_rows(source, info: TensorInfo, size: int, rows: np.ndarray, scope: ReadScope = NOTHING_SAID) -> bytes:
    """The stored bytes of ``rows`` (``size`` bytes each) in that order, each run of adjacent rows read at
    once (under the caller's ``scope``)."""
    if len(rows) == 0:
        return b""
    if len(rows) == 1 or bool((np.diff(rows) == 1).all()):
        return source.pread(info.offset + int(rows[0]) * size, len(rows) * size, scope=scope)
    wanted = np.unique(rows)
    runs = np.split(wanted, np.flatnonzero(np.diff(wanted) != 1) + 1)
    data = b"".join(source.pread(info.offset + int(run[0]) * size, len(run) * size, scope=scope) for run in runs)
    block = np.frombuffer(data, np.uint8).reshape(len(wanted), size)
    return block[np.searchsorted(wanted, rows)].tobytes()


def _serialize(writer) -> tuple[bytes, list[int], int]:
    """The header gguf-py writes (magic to tensor infos, padded to the alignment), each tensor's absolute
    start and the file's size (every tensor padded to the alignment, the last one too, as gguf-py writes
    them), without touching a file: the writer's output stream is a buffer in memory."""
    import gguf

    buffer = io.BytesIO()
    writer.fout = [buffer]
    writer.state = gguf.WriterState.EMPTY
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    header = buffer.getvalue()
    align = writer.data_alignment
    header += bytes(-len(header) % align)
    starts, pos = [], len(header)
    for info in writer.tensors[0].values():
        starts.append(pos)
        pos += writer.ggml_pad(info.nbytes, align)
    return header, starts, pos
