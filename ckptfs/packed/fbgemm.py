"""``quant_method: fbgemm_fp8`` (Llama-4 FP8 and other FBGEMM per-row FP8 checkpoints).

- Linear layers: ``weight`` F8_E4M3 ``[out, in]`` and ``weight_scale`` F32 ``[out, 1]``:
  ``W[i, j] = e4m3(w[i, j]) * weight_scale[i]``.
- Llama-4 experts, stored as transformers' ``FbgemmFp8Llama4TextExperts`` holds them, in the release's own
  layout (the experts' matrices are quantized transposed, per output feature, then stored back):
  ``gate_up_proj`` F8_E4M3 ``[E, hidden, 2 * expert_dim]`` with ``gate_up_proj_scale`` ``[E, 1, 2 *
  expert_dim]``, ``down_proj`` ``[E, expert_dim, hidden]`` with ``down_proj_scale`` ``[E, hidden, 1]``: one
  scale per column, ``W[e, i, j] = e4m3(w[e, i, j]) * scale[e, j]``. The view keeps the stored name and
  shape (``...experts.gate_up_proj``), which are the release's.

One float32 multiply, as transformers' ``_scaled_mm`` applies ``weight_scale`` to the E4M3 values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptfs.core.descriptors import TensorInfo
from ckptfs.packed.base import Absent, Context, Layout
from ckptfs.packed.detect import Method, Scheme, one_format
from ckptfs.packed.scaled import build_scaled

METHOD = "fbgemm_fp8"
F8 = ("F8_E4M3",)
SCHEMES = [
    Scheme(METHOD, METHOD, "", "fbgemm", "weight", ("weight", "weight_scale", "input_scale_ub"), marker_types=F8),
    Scheme(METHOD, METHOD, "", "fbgemm", "gate_up_proj", ("gate_up_proj", "gate_up_proj_scale"), marker_types=F8,
           view=".gate_up_proj"),
    Scheme(METHOD, METHOD, "", "fbgemm", "down_proj", ("down_proj", "down_proj_scale"), marker_types=F8,
           view=".down_proj"),
]
METHODS = [Method(METHOD, one_format)]


def build(prefix: str, parts: Mapping[str, TensorInfo], settings: Mapping[str, Any],
          context: Context | None = None) -> Layout:
    parameters = {"activation_scale_ub": settings.get("activation_scale_ub")}
    if "weight" in parts:
        weight = parts["weight"]
        if len(weight.shape) != 2:
            raise Absent(f"{weight.name} has shape {list(weight.shape)} (expected [out, in])")
        return build_scaled(METHOD, prefix, parts, weight_role="weight", scale_role="weight_scale",
                            code_types=F8, block=(1, weight.shape[1]), parameters=parameters,
                            scale_types=("F32", "BF16", "F16"), why="per-row", loose=True)
    role = "gate_up_proj" if "gate_up_proj" in parts else "down_proj"
    weight = parts[role]
    if len(weight.shape) != 3:
        raise Absent(f"{weight.name} has shape {list(weight.shape)} (expected experts [E, in, out])")
    return build_scaled(METHOD, prefix, parts, weight_role=role, scale_role=f"{role}_scale", code_types=F8,
                        block=(weight.shape[1], 1), parameters={**parameters, "experts": weight.shape[0]},
                        scale_types=("F32", "BF16", "F16"), why="per-column (experts)", loose=True)
