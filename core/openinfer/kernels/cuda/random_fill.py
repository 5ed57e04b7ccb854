"""Dummy weights on the device: a tensor filled with mean + std * N(0, 1) in one kernel (random_fill.cu)."""
from __future__ import annotations

import cupy as cp
import numpy as np

from .module import launch, suffix

_THREADS = 256
_MAX_BLOCKS = 8192   # a grid-stride loop covers the rest: enough blocks to fill every SM many times


def fill_normal(x: cp.ndarray, key: tuple[int, int], mean: float, std: float) -> None:
    """x[...] = mean + std * philox.normals(x.size, key), rounded to x's dtype (bf16 or f32), on the
    current stream; x must be contiguous."""
    if not x.flags.c_contiguous:
        raise ValueError("fill_normal writes contiguous arrays only")
    groups = -(-x.size // 4)
    if groups:
        launch("random_fill", f"fill_normal_{suffix(x.dtype)}", (min(-(-groups // _THREADS), _MAX_BLOCKS),),
               _THREADS, (x, np.int64(x.size), np.uint32(key[0]), np.uint32(key[1]), np.float32(mean),
                          np.float32(std)))
