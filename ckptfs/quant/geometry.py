"""Block geometry of every storage type ckptfs knows: (elements per block, bytes per block), in one table.

Readers use it to size a tensor's stored bytes, codecs are checked against it when they register, and a type
that has a geometry but no codec (a plugin not installed, a codec disabled) is still served raw with its
exact extent instead of a guess from the neighbouring tensors' offsets. GGML values are ggml-common.h's
(``docs/block-formats.md``); the safetensors types are their element sizes (F4: two per byte; F6: four in
three bytes).
"""

from __future__ import annotations

GEOMETRY: dict[str, tuple[int, int]] = {
    # GGML (GGUF) types
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "F64": (1, 8),
    "I8": (1, 1), "I16": (1, 2), "I32": (1, 4), "I64": (1, 8),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34), "Q8_1": (32, 36),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
    "Q8_K": (256, 292),
    "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74), "IQ2_S": (256, 82), "IQ3_XXS": (256, 98), "IQ3_S": (256, 110),
    "IQ1_S": (256, 50), "IQ1_M": (256, 56), "IQ4_NL": (32, 18), "IQ4_XS": (256, 136),
    "TQ1_0": (256, 54), "TQ2_0": (256, 66), "MXFP4": (32, 17), "NVFP4": (64, 36), "Q1_0": (128, 18),
    "Q2_0": (64, 18),
    # safetensors-only types
    "F8_E4M3": (1, 1), "F8_E5M2": (1, 1), "F8_E8M0": (1, 1), "F8_E4M3FNUZ": (1, 1), "F8_E5M2FNUZ": (1, 1),
    "F4": (2, 1), "F6_E2M3": (4, 3), "F6_E3M2": (4, 3),
    "U8": (1, 1), "U16": (1, 2), "U32": (1, 4), "U64": (1, 8), "BOOL": (1, 1), "C64": (1, 8),
}


def geometry(storage_type: str) -> tuple[int, int] | None:
    """(elements per block, bytes per block) of ``storage_type``, or None when ckptfs does not know it."""
    return GEOMETRY.get(storage_type)
