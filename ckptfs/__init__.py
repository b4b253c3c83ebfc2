"""ckptfs: LLM checkpoints (GGUF, safetensors) as lazy tensors and as a read-only FUSE filesystem.

``ckptfs.open(path)[name]`` is a lazy tensor; ``ckptfs mount`` serves the same data as NAME.npy /
NAME.raw / NAME.meta.json files. Importing ckptfs never needs libfuse: only a mount does.
"""

from __future__ import annotations

from .checkpoint import Checkpoint, Tensor, open
from .errors import CheckpointError
from .quant import Codec, register_codec

__version__ = "0.1.0"

__all__ = ["open", "Checkpoint", "Tensor", "CheckpointError", "Codec", "register_codec", "__version__"]
