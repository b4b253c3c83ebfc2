"""One copy of a decoded tensor for many worker processes: ``Tensor.shared()``.

DataLoader workers, a multiprocessing pool or tensors pickled to other processes each decoding a tensor
into private memory hold N copies. ``Tensor.shared()`` instead decodes the whole tensor once per machine
into the cache folder (namespace ``tensors`` of the ``DiskStore``, next to the decoded groups and fetched
bytes, under the same size bound) and returns a read-only ``np.memmap``-like view of that file. Every
process mapping the same file maps the same page-cache pages, so the kernel holds one copy whatever N is
(each process's PSS carries 1/N of it). The first process decodes while holding a per-entry ``flock``; the
others wait for it rather than decode too, and a killed decoder releases the lock and leaves no entry.

Where the file lives decides what "one copy" costs: a folder on a disk keeps it across reboots and lets
the kernel evict it under memory pressure (it is read back from the disk); a folder on ``/dev/shm`` (tmpfs)
keeps it in RAM until deleted (``ckptfs cache clear --cache-dir DIR``).

The folder is the checkpoint's ``cache_dir`` (``ckptfs.open(src, cache_dir=DIR)``; pickled tensors carry
it), else ``$CKPTFS_CACHE_DIR``, with its key (the checkpoint's ``cache_key_file``, else
``$CKPTFS_CACHE_KEY_FILE``, else the folder's own). The folder passes the mode checks before anything is
written (``auth.py``), and a mapped entry's MAC is checked over the whole mapping before it is returned: a
copy someone else wrote is never served. When the entry cannot be written (full, read-only) the tensor is decoded
into private memory as ``numpy()`` does, read-only like a shared result, and the log says why once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

import numpy as np

from ckptfs.cache.disk import DEFAULT_CACHE_DIR_SIZE, DiskStore, DiskTier
from ckptfs.cache.tiered import TieredCache, cache_key
from ckptfs.core.options import env_of
from ckptfs.engine.values import TensorValues

log = logging.getLogger(__name__)

NAMESPACE = "tensors"
#: the environment variables ``--cache-dir`` and ``--cache-key-file`` fall back on (ckptfs.core.options)
ENV_DIR, ENV_KEY_FILE = env_of("cache_dir"), env_of("cache_key_file")
DECODE_STEP_BYTES = 16 << 20  # the writer holds one step of decoded values at a time, never the tensor

_stores: dict[tuple[str, int, str | None], DiskStore] = {}


def tensor_store(cache: TieredCache, cache_key_file: str | None) -> DiskStore:
    """The ``tensors`` store of a checkpoint's cache folder (its ``cache``'s disk tier, else
    ``$CKPTFS_CACHE_DIR`` with the checkpoint's ``cache_key_file``); ValueError if none, or for a folder or
    key file this user must not trust (``auth.CacheRefused``)."""
    root: str | None = None
    max_bytes, key_file = DEFAULT_CACHE_DIR_SIZE, None
    for tier in cache.tiers:
        if isinstance(tier, DiskTier):
            store = tier.store
            root, max_bytes, key_file = str(store.root), store.max_bytes, store.key_file
            break
    if root is None:
        root = os.environ.get(ENV_DIR) or None
        key_file = cache_key_file or os.environ.get(ENV_KEY_FILE) or None
    if root is None:
        raise ValueError("Tensor.shared() needs a cache folder: ckptfs.open(src, cache_dir=DIR) "
                         f"or ${ENV_DIR}")
    known = _stores.get((root, max_bytes, key_file))
    if known is None:
        known = _stores[(root, max_bytes, key_file)] = DiskStore(root, max_bytes, NAMESPACE, key_file)
    return known


def shared_array(name: str, data: TensorValues, store: DiskStore, private: Callable[[], np.ndarray]) -> np.ndarray:
    """Tensor ``name``'s values (``data``) as a flat read-only array backed by a file of ``store`` mapped by
    every process; ``private()`` (the values decoded into this process's memory) when it cannot be written."""
    n_blocks = data.available_blocks()
    key = cache_key(data.content_id(), data.info.offset, data.info.storage_type, data.dtype.str, 0, n_blocks)
    values = store.map_array(key)
    if values is None:
        with store.key_lock(key):
            values = store.map_array(key)  # another process may have written it while we waited
            if values is None:
                nbytes = data.n_elements * data.dtype.itemsize
                if store.write_chunks(key, data.dtype, nbytes, _decoded_steps(data)):
                    values = store.map_array(key)
    if values is None or values.size != data.n_elements or values.dtype != data.dtype:
        log.warning("tensor %r: no shared copy in %s (see the cache log above): decoded privately",
                    name, store.root)
        values = private().reshape(-1)
        values.setflags(write=False)
    return values


def _decoded_steps(data: TensorValues) -> Iterator[np.ndarray]:
    step = max(1, DECODE_STEP_BYTES // data.dtype.itemsize)
    for e0 in range(0, data.n_elements, step):
        yield data.read(e0, min(e0 + step, data.n_elements), use_cache=False)
