"""The packed-layer row kernels (``_kernels.c``): what ``ckptfs.packed.native`` calls."""

import numpy as np

def dequantize_rows(mode: int, words: np.ndarray, row_step: int, word_step: int, bits: int, in_features: int,
                    phase: int, zeros: np.ndarray, scales: np.ndarray, groups: int, g_idx: np.ndarray | None,
                    group_size: int, rounding: int, out: np.ndarray, half: int, rows: int) -> None: ...

def scaled_rows(codes: np.ndarray, table: np.ndarray, width: int, scales: np.ndarray, scale_rows: np.ndarray,
                groups: int, block_width: int, zeros: np.ndarray | None, out: np.ndarray, out_half: int,
                n_rows: int) -> None: ...

def fp4_rows(codes: np.ndarray, code_step: int, pairs: np.ndarray, scales: np.ndarray, scale_step: int, first: int,
             width: int, group: int, out: np.ndarray, out_half: int, n_rows: int, transpose: bool,
             out_step: int, offset: int) -> None: ...
