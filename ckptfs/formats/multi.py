"""Which files form a checkpoint, given what the user named (a file, for now).

Multi-file checkpoints (shard folders, index files, split GGUF) resolve here to one ParsedCheckpoint whose
descriptors each point at their own file.
"""

from __future__ import annotations

import os

from ..descriptors import ParsedCheckpoint
from ..errors import CheckpointError
from . import read_file


def read_checkpoint(src: str) -> ParsedCheckpoint:
    if os.path.isdir(src):
        raise CheckpointError(src, None, "is a directory; multi-file checkpoints are not supported yet")
    if not os.path.exists(src):
        raise CheckpointError(src, None, "no such file")
    return read_file(src)
