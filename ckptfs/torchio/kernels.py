"""Dequantization written with torch operations, so it runs where the tensor is going (a CUDA device).

Each kernel takes the stored blocks as a uint8 tensor ``[n, block_bytes]`` on any device and returns
``[n, block_elements]`` values there: float32 for quantized and small-float types, the storage dtype for
plain types (F32, F16, I8, ...: a reinterpretation of the bytes, no arithmetic).

Registered with the engine's decode door as the "torch" device backend (``ckptfs.engine.decode``): the torch
API decodes on a device through it. Bit-exact with ckptfs/quant: ggml works in float32 and so do the numpy codecs, in a fixed order (``q * d``
rounded, then ``+ m`` or ``- min``; sub-block scales ``d * sc`` formed first). Every kernel here keeps that
order with one torch elementwise operation per step (never ``addcmul``, which may fuse the multiply-add and
round once), on the same exactly-converted integers. Lookup tables (E2M1, IQ4_NL levels, F8 codes) are the
quant package's own tables, uploaded once per device.

Bytes are read as fields of the block matrix: a column range copied contiguous, then viewed as the field's
dtype (little-endian: the layout of every supported host and of CUDA devices). Unsigned 16/32-bit fields are
read as signed integers and masked after each shift, since torch's unsigned wide types lack bit operations
on some backends.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ckptfs.engine.decode import register_device_backend
from ckptfs.quant import codec_for
from ckptfs.quant import floats as np_floats
from ckptfs.quant.iq_tables import KVALUES_FP4, KVALUES_IQ4NL

Kernel = Callable[[torch.Tensor], torch.Tensor]
QK_K = 256

_tables: dict[tuple[str, torch.device], torch.Tensor] = {}


def _table(name: str, values: np.ndarray, device: torch.device) -> torch.Tensor:
    """A numpy lookup table as a float32 tensor on ``device`` (uploaded once, then reused)."""
    key = (name, device)
    table = _tables.get(key)
    if table is None:
        table = _tables[key] = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(device)
    return table


def _field(blocks: torch.Tensor, offset: int, nbytes: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """Bytes [offset, offset + nbytes) of every block as ``dtype``: shape (n, nbytes / itemsize)."""
    column = blocks[:, offset:offset + nbytes]
    return column if dtype == torch.uint8 else column.contiguous().view(dtype)


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 scale at ``offset`` widened to float32 (exact): shape (n, 1), broadcasting over a block."""
    return _field(blocks, offset, 2, torch.float16).float()


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """u8[n, k] -> u8[n, 2k]: the k low nibbles, then the k high nibbles (ggml's 4-bit order)."""
    return torch.cat((packed & 15, packed >> 4), dim=1)


def _bits(packed: torch.Tensor) -> torch.Tensor:
    """Bit i of a little-endian bit string, per block: u8[n, k] -> u8[n, 8k] of 0/1."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    return ((packed[:, :, None] >> shifts) & 1).reshape(packed.shape[0], -1)


def _shifts(values, shape, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8, device=device).reshape(shape)


def _scale(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
    """``q * d (+ m)`` in float32, the product rounded before the sum (ggml's order)."""
    values = codes.float() * d
    return values if m is None else values + m


# ------------------------------------------------------------------------------------------------ legacy


def q4_0(blocks):
    return _scale(_nibbles(_field(blocks, 2, 16)).to(torch.int16) - 8, _f16(blocks, 0))


def q4_1(blocks):
    return _scale(_nibbles(_field(blocks, 4, 16)), _f16(blocks, 0), _f16(blocks, 2))


def _five_bit(blocks, qh_at, qs_at):
    return _nibbles(_field(blocks, qs_at, 16)) | (_bits(_field(blocks, qh_at, 4)) << 4)


def q5_0(blocks):
    return _scale(_five_bit(blocks, 2, 6).to(torch.int16) - 16, _f16(blocks, 0))


def q5_1(blocks):
    return _scale(_five_bit(blocks, 4, 8), _f16(blocks, 0), _f16(blocks, 2))


def q8_0(blocks):
    return _scale(_field(blocks, 2, 32).view(torch.int8), _f16(blocks, 0))


# ------------------------------------------------------------------------------------------------ K-quants


def _subblocks(codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None = None) -> torch.Tensor:
    """``scale * q (- min)`` per sub-block: codes [n, sub, per_sub], scale/min float32 [n, sub]."""
    values = codes.float() * scale[:, :, None]
    if minimum is not None:
        values = values - minimum[:, :, None]
    return values.reshape(codes.shape[0], QK_K)


def q2_k(blocks):
    n = blocks.shape[0]
    scales = _field(blocks, 0, 16)
    qs = _field(blocks, 16, 64).reshape(n, 2, 1, 32)
    codes = (qs >> _shifts([0, 2, 4, 6], (4, 1), blocks.device)) & 3          # (n, h, j, 16k + l)
    scale = _f16(blocks, 80) * (scales & 15).float()
    minimum = _f16(blocks, 82) * (scales >> 4).float()
    return _subblocks(codes.reshape(n, 16, 16), scale, minimum)


_I16 = np.arange(16)
_Q3_LO_BYTE, _Q3_LO_SHIFT = (_I16 % 8).tolist(), (4 * (_I16 // 8)).tolist()
_Q3_HI_BYTE, _Q3_HI_SHIFT = (8 + _I16 % 4).tolist(), (2 * (_I16 // 4)).tolist()


def q3_k(blocks):
    n, device = blocks.shape[0], blocks.device
    hmask = _field(blocks, 0, 32).reshape(n, 1, 1, 32)
    qs = _field(blocks, 32, 64).reshape(n, 2, 1, 32)
    codes = (qs >> _shifts([0, 2, 4, 6], (4, 1), device)) & 3
    codes = codes | (((hmask >> _shifts(list(range(8)), (2, 4, 1), device)) & 1) << 2)
    packed = _field(blocks, 96, 12)
    low = (packed[:, _Q3_LO_BYTE] >> _shifts(_Q3_LO_SHIFT, (16,), device)) & 15
    high = (packed[:, _Q3_HI_BYTE] >> _shifts(_Q3_HI_SHIFT, (16,), device)) & 3
    sc = (low | (high << 4)).to(torch.int16) - 32
    scale = _f16(blocks, 108) * sc.float()
    return _subblocks((codes.to(torch.int16) - 4).reshape(n, 16, 16), scale)


def _k4_scale_min(blocks):
    """ggml's get_scale_min_k4 for the 8 sub-blocks, times d and dmin: float32 [n, 8] twice."""
    packed = _field(blocks, 4, 12)
    first, second, third = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat((first & 63, (third & 15) | ((first >> 6) << 4)), dim=1)
    mn = torch.cat((second & 63, (third >> 4) | ((second >> 6) << 4)), dim=1)
    return _f16(blocks, 0) * sc.float(), _f16(blocks, 2) * mn.float()


def _k4_nibbles(qs):
    """Q4_K/Q5_K element order 64c + 32t + l: nibble t of byte 32c + l -> u8[n, 4, 2, 32]."""
    grouped = qs.reshape(qs.shape[0], 4, 1, 32)
    return torch.cat((grouped & 15, grouped >> 4), dim=2)


def q4_k(blocks):
    scale, minimum = _k4_scale_min(blocks)
    codes = _k4_nibbles(_field(blocks, 16, 128))
    return _subblocks(codes.reshape(blocks.shape[0], 8, 32), scale, minimum)


def q5_k(blocks):
    n = blocks.shape[0]
    scale, minimum = _k4_scale_min(blocks)
    qh = _field(blocks, 16, 32).reshape(n, 1, 1, 32)
    high = (qh >> _shifts(list(range(8)), (4, 2, 1), blocks.device)) & 1            # bit 2c + t
    codes = _k4_nibbles(_field(blocks, 48, 128)) | (high << 4)
    return _subblocks(codes.reshape(n, 8, 32), scale, minimum)


def q6_k(blocks):
    n = blocks.shape[0]
    ql = _field(blocks, 0, 128).reshape(n, 2, 1, 64)
    codes = torch.cat((ql & 15, ql >> 4), dim=2).reshape(n, 2, 4, 32)            # (h, r, l)
    qh = _field(blocks, 128, 64).reshape(n, 2, 1, 32)
    codes = codes | (((qh >> _shifts([0, 2, 4, 6], (1, 4, 1), blocks.device)) & 3) << 4)
    scale = _f16(blocks, 208) * _field(blocks, 192, 16).view(torch.int8).float()
    return _subblocks((codes.to(torch.int16) - 32).reshape(n, 16, 16), scale)


# ------------------------------------------------------------------------------------------------ I-quants, FP4


def iq4_nl(blocks):
    levels = _table("iq4nl", KVALUES_IQ4NL, blocks.device)
    return levels[_nibbles(_field(blocks, 2, 16)).long()] * _f16(blocks, 0)


def iq4_xs(blocks):
    n, device = blocks.shape[0], blocks.device
    levels = _table("iq4nl", KVALUES_IQ4NL, device)
    low_packed = _field(blocks, 4, 4)                                             # sub-block ib: nibble ib % 2
    low = (low_packed[:, :, None] >> _shifts([0, 4], (2,), device)) & 15          # of byte ib // 2
    high = (_field(blocks, 2, 2, torch.int16).int() >> (2 * torch.arange(8, device=device, dtype=torch.int32))) & 3
    ls = low.reshape(n, 8).int() | (high << 4)
    dl = (ls - 32).float() * _f16(blocks, 0)
    qs = _field(blocks, 8, 128).reshape(n, 8, 16)
    codes = torch.cat((qs & 15, qs >> 4), dim=2)                                  # (n, sub-block, 32)
    return (levels[codes.long()] * dl[:, :, None]).reshape(n, QK_K)


def _e8m0_half(device) -> torch.Tensor:
    """ggml_e8m0_to_fp32_half for every byte: float32 bits 0x00200000 << e (e < 2), else (e - 1) << 23."""
    e = torch.arange(256, dtype=torch.int32, device=device)
    subnormal = torch.full_like(e, 0x00200000) << e.clamp(max=1)       # both bit patterns stay below 2^31
    return torch.where(e < 2, subnormal, (e - 1) << 23).view(torch.float32)


def mxfp4(blocks):
    device = blocks.device
    key = ("e8m0_half", device)
    if key not in _tables:
        _tables[key] = _e8m0_half(device)
    levels = _table("fp4", KVALUES_FP4, device)
    scale = _tables[key][_field(blocks, 0, 1).long()]
    return levels[_nibbles(_field(blocks, 1, 16)).long()] * scale


# ------------------------------------------------------------------------------------------------ floats


def bf16(blocks):
    """bfloat16 is the top half of a float32: its two bytes go above two zero bytes (exact, NaNs kept)."""
    wide = torch.zeros((blocks.shape[0], 4), dtype=torch.uint8, device=blocks.device)
    wide[:, 2:] = blocks
    return wide.view(torch.float32)


def _lookup(name: str, table: np.ndarray) -> Kernel:
    def decode(blocks):
        return _table(name, table, blocks.device)[blocks.long()]
    decode.__name__ = name.lower()
    return decode


def _plain(dtype: torch.dtype) -> Kernel:
    def decode(blocks):
        return blocks.contiguous().view(dtype)
    return decode


def f4(blocks):
    table = _table("F4", np_floats.F4_E2M1_TABLE, blocks.device)
    codes = blocks[:, 0].long()
    return torch.stack((table[codes & 15], table[codes >> 4]), dim=1)


KERNELS: dict[str, Kernel] = {
    "Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1, "Q8_0": q8_0,
    "Q2_K": q2_k, "Q3_K": q3_k, "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k,
    "IQ4_NL": iq4_nl, "IQ4_XS": iq4_xs, "MXFP4": mxfp4, "BF16": bf16, "F4": f4,
    "F8_E4M3": _lookup("F8_E4M3", np_floats.F8_E4M3_TABLE),
    "F8_E5M2": _lookup("F8_E5M2", np_floats.F8_E5M2_TABLE),
    "F8_E8M0": _lookup("F8_E8M0", np_floats.F8_E8M0_TABLE),
    "F8_E4M3FNUZ": _lookup("F8_E4M3FNUZ", np_floats.F8_E4M3FNUZ_TABLE),
    "F8_E5M2FNUZ": _lookup("F8_E5M2FNUZ", np_floats.F8_E5M2FNUZ_TABLE),
    "F32": _plain(torch.float32), "F16": _plain(torch.float16), "F64": _plain(torch.float64),
    "I8": _plain(torch.int8), "I16": _plain(torch.int16), "I32": _plain(torch.int32), "I64": _plain(torch.int64),
    "U8": _plain(torch.uint8), "BOOL": _plain(torch.bool),
}


def has_kernel(storage_type: str) -> bool:
    return storage_type in KERNELS


def dequantize(storage_type: str, blocks: torch.Tensor) -> torch.Tensor:
    """``u8[n, block_bytes]`` (little-endian blocks, any device) -> values ``[n, block_elements]`` there."""
    if blocks.dtype != torch.uint8 or blocks.dim() != 2:
        raise ValueError(f"{storage_type}: expected a 2-D uint8 tensor of blocks, got {blocks.dtype} "
                         f"{tuple(blocks.shape)}")
    codec = codec_for(storage_type)
    assert codec is not None  # every type with a kernel has a codec
    return KERNELS[storage_type](blocks).reshape(blocks.shape[0], codec.block_elements)


class TorchKernels:
    """The "torch" device backend of ``ckptfs.engine.decode``: these kernels, behind the engine's one decode
    door (looked up at each call, so a replaced ``dequantize`` is the one used)."""

    def has_kernel(self, storage_type: str) -> bool:
        return has_kernel(storage_type)

    def dequantize(self, storage_type: str, blocks: torch.Tensor) -> torch.Tensor:
        return dequantize(storage_type, blocks)


register_device_backend("torch", TorchKernels())
