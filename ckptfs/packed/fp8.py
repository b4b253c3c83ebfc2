"""``quant_method: fp8`` (transformers' fine-grained FP8: DeepSeek-V3/R1, Kimi-K2, Qwen3-*-FP8).

Per layer: ``weight`` F8_E4M3 ``[out, in]`` (or ``[E, out, in]`` for experts stored together) and
``weight_scale_inv``:

- with ``weight_block_size: [bh, bw]``: ``[ceil(out / bh), ceil(in / bw)]`` (per expert: ``[E, ...]``), F32
  (DeepSeek), BF16 (Qwen3) or, with ``scale_fmt: ue8m0``, E8M0 (``F8_E8M0``, or U8 bytes) or F32 powers of
  two; the edge blocks are partial (DeepSeek-V3's ``kv_a_proj_with_mqa`` is 576 x 7168: a 5 x 56 grid);
- without it: one scale for the tensor.

``W[i, j] = e4m3(w[i, j]) * s[i // bh, j // bw]`` in float32 (a multiply despite the ``_inv`` in its name,
as DeepSeek's ``weight_dequant`` and transformers compute it), then rounded to the release's dtype by the
reader. An E4M3 code 0x7F/0xFF is NaN; an E8M0 scale 255 is NaN (OCP's rule). Activation scales
(``input_scale``, ``activation_scale``) are parts of the layer but not of the weight.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptfs.core.descriptors import TensorInfo
from ckptfs.packed.base import Absent, Context, Layout
from ckptfs.packed.detect import Method, Scheme, one_format
from ckptfs.packed.scaled import SCALE_TYPES, build_scaled

ROLES = ("weight", "weight_scale_inv", "weight_scale", "input_scale", "activation_scale")
SCHEMES = [Scheme("fp8", "fp8", "", "fp8", "weight", ROLES, marker_types=("F8_E4M3",))]
METHODS = [Method("fp8", one_format)]
SCALE_FORMATS = ("float", "ue8m0")


def block_setting(settings: Mapping[str, Any], key: str) -> tuple[int, int] | None:
    """``settings[key]`` as (rows, columns) of a block, None when absent or null."""
    block = settings.get(key)
    if block is None:
        return None
    if not isinstance(block, (list, tuple)) or len(block) != 2 \
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in block):
        raise Absent(f"quantization setting {key}={block!r} is not two integers")
    if block[0] <= 0 or block[1] <= 0:
        raise Absent(f"quantization setting {key}={list(block)} is not a block size")
    return int(block[0]), int(block[1])


def build(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any],
          context: Context | None = None) -> Layout:
    block = block_setting(settings, "weight_block_size")
    scale_fmt = str(settings.get("scale_fmt") or "float")
    if scale_fmt not in SCALE_FORMATS:
        raise Absent(f"fp8 scale_fmt {scale_fmt!r} is not supported (float or ue8m0)")
    role = "weight_scale_inv" if "weight_scale_inv" in parts or "weight_scale" not in parts else "weight_scale"
    scale = parts.get(role)
    scale_as = "F8_E8M0" if scale is not None and scale.storage_type == "U8" and scale_fmt == "ue8m0" else None
    parameters = {"weight_block_size": list(block) if block else None, "scale_fmt": scale_fmt,
                  "activation_scheme": settings.get("activation_scheme")}
    return build_scaled("fp8", prefix, parts, weight_role="weight", scale_role=role, code_types=("F8_E4M3",),
                        block=block, parameters=parameters,
                        scale_types=SCALE_TYPES + (("U8",) if scale_as else ()), scale_as=scale_as,
                        why="weight_block_size" if block else "a per-tensor")
