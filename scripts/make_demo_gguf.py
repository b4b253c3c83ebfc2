"""Write the built-in demo checkpoint: a small GGUF with several storage types (needs gguf-py).

    python scripts/make_demo_gguf.py demo/demo.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

# Where the fp16 scale fields of the K-quant blocks lie (gguf-py cannot quantize to K-quants, so the demo
# fills those blocks with random bytes and sane scales).
SCALE_FIELDS = {Q.Q4_K: (0, 2), Q.Q6_K: (208,)}


def random_kquant(shape: tuple[int, ...], qtype: Q, rng: np.random.Generator) -> np.ndarray:
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = int(np.prod(shape)) // block_elems
    blocks = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    for pos in SCALE_FIELDS[qtype]:
        scale = (rng.random(n_blocks) * 0.01 + 0.001).astype(np.float16)
        blocks[:, pos:pos + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(shape[:-1] + (shape[-1] // block_elems * block_bytes,))


def write_demo(path: str) -> dict[str, Q]:
    rng = np.random.default_rng(0)
    tensors = {
        "token_embd.weight": ((512, 256), Q.Q8_0),
        "blk.0.attn_q.weight": ((256, 256), Q.Q4_K),
        "blk.0.attn_k.weight": ((256, 256), Q.Q6_K),
        "blk.0.ffn_up.weight": ((512, 256), Q.Q4_0),
        "blk.0.ffn_down.weight": ((256, 512), Q.Q5_0),
        "blk.0.attn_norm.weight": ((256,), Q.F32),
        "output.weight": ((512, 256), Q.F16),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(path, "llama")
    writer.add_name("ckptfs demo")
    writer.add_context_length(2048)
    writer.add_embedding_length(256)
    writer.add_block_count(1)
    writer.add_token_list([f"tok{i}" for i in range(512)])
    writer.add_token_scores([float(-i) for i in range(512)])
    for name, (shape, qtype) in tensors.items():
        values = rng.standard_normal(shape).astype(np.float32)
        if qtype == Q.F32:
            writer.add_tensor(name, values)
        elif qtype == Q.F16:
            writer.add_tensor(name, values.astype(np.float16))
        else:
            data = random_kquant(shape, qtype, rng) if qtype in SCALE_FIELDS else quantize(values, qtype)
            writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {name: qtype for name, (_, qtype) in tensors.items()}


if __name__ == "__main__":
    write_demo(sys.argv[1] if len(sys.argv) > 1 else "demo/demo.gguf")
