"""The bitsandbytes row kernels (``_bnb.c``): what ``ckptfs.packed.bnb`` calls."""

import numpy as np

def dequantize_4bit(codes: np.ndarray, table: np.ndarray, absmax: np.ndarray, blocksize: int, skip: int,
                    count: int, out: np.ndarray, nested_map: np.ndarray | None, nested_absmax: np.ndarray | None,
                    nested_blocksize: int, first_block: int, offset: float) -> None: ...
def dequantize_int8(weights: np.ndarray, scb: np.ndarray, rows: int, in_features: int, out: np.ndarray) -> None: ...
