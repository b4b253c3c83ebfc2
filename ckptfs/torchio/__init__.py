"""Checkpoint tensors straight into torch (optional: needs torch), and batches of tensors into one buffer.

``ckptfs.load``/``ckptfs.load_batch`` and ``Tensor.to_torch`` import this package on first use, so
``import ckptfs`` never imports torch. ``load_batch`` itself needs only numpy (batch.py); api.py and
kernels.py import torch.
"""

from __future__ import annotations


def __getattr__(name):  # the public functions, imported only when asked for (torch stays unimported)
    if name == "load_batch":
        from ckptfs.engine.batch import load_batch
        return load_batch
    if name in ("load", "to_torch"):
        from ckptfs.torchio import api
        return getattr(api, name)
    raise AttributeError(name)
