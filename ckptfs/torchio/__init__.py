"""Checkpoint tensors straight into torch (optional: needs torch), and batches of tensors into one buffer.

``ckptfs.load`` and ``Tensor.to_torch`` import this package on first use, so ``import ckptfs`` never
imports torch (``ckptfs.load_batch`` needs only numpy: ckptfs.engine.batch). api.py and kernels.py import
torch.
"""

from __future__ import annotations


def __getattr__(name):  # the public functions, imported only when asked for (torch stays unimported)
    if name in ("load", "to_torch"):
        from ckptfs.torchio import api
        return getattr(api, name)
    raise AttributeError(name)
