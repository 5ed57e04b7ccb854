"""The device sampler's launch sequence (sample_rows.cu): each sampled row's token, and the
logprobs it asks for, from a step's logits. Eager, after the forward or a graph replay; every
grid depends on the number of rows only."""
from __future__ import annotations

import cupy as cp
import numpy as np

from .module import launch, rows2d, suffix
from .ops import top_logprobs

GATHER_BLOCKS = 32   # blocks per row for the float32 copy of the logits


def sample(logits: cp.ndarray, params: cp.ndarray, edits: cp.ndarray, top_k: int, top_rows: np.ndarray
           ) -> tuple[cp.ndarray, cp.ndarray | None, cp.ndarray | None]:
    """params [S, 16] int32 and edits [E >= 1, 4] int32 (sampling/batch.py) on the device.
    Returns (out [2, S] int32: tokens, then the chosen logprobs as float32 bits; top values
    [len(top_rows), top_k] and ids of the rows `top_rows`, or None when top_k is 0)."""
    x, stride = rows2d(logits)
    S, n = params.shape[0], x.shape[1]
    out = cp.empty((2, S), dtype=cp.int32)
    if not S:
        return out, None, None
    work = cp.empty((S, n), dtype=cp.float32)
    launch("sample_rows", f"sampling_rows_{suffix(x.dtype)}", (GATHER_BLOCKS, S), 256,
           (x, np.int64(stride), params, np.int32(n), work))
    launch("sample_rows", "apply_edits", (S,), 128, (work, np.int32(n), params, edits))
    values = ids = None
    if top_k:  # before sample_rows overwrites the rows with exp(x / T - max / T)
        values, ids = top_logprobs(work[cp.asarray(top_rows)], top_k)
    launch("sample_rows", f"sample_rows_{suffix(x.dtype)}", (S,), 512,
           (work, np.int32(n), x, np.int64(stride), params, edits, out[0], out[1]))
    return out, values, ids
