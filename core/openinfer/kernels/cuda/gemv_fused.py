"""The decode GEMV with the elementwise op after it folded into its epilogue (gemv.cu), where each value
is computed once: linear + silu_mul and linear + add_rms_norm, one kernel each instead of two.

At small batch a decode step is hundreds of few-microsecond kernels and every boundary costs a few
microseconds; these two remove the boundary after three of a layer's four projections (o, gate_up,
down; Qwen3.5's linear-attention out_proj too). Each launcher
returns None where the fused kernel does not apply (the GEMV's own conditions, plus its epilogue's
layout needs), and ops.py then runs the two ops.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from . import blas
from .module import BF16, arrival_counters

# The last CTA normalizes the M rows one after another, each pass a few dependent L2 round trips (3 for a
# 2560-wide row at 128 threads): a tail that grows with M, against the one kernel boundary it saves. Above
# this many rows add_rms_norm runs as its own kernel (scripts/gemv_bench.py --fused measures M = 1, 2, 4, 8).
ADD_RMS_NORM_MAX_M = blas.GEMV_MAX_M


def _gemv_rows(x: cp.ndarray, w: cp.ndarray) -> tuple[cp.ndarray, cp.ndarray] | None:
    """x as [M, K] rows and w, where the GEMV kernel takes them."""
    x2, w = blas.operands(x, w)
    m, k = x2.shape
    return (x2, w) if blas._gemv_usable(x2, w, m, k) else None


def gemv_silu_mul(x: cp.ndarray, w: cp.ndarray) -> cp.ndarray | None:
    """silu_mul(linear(x, w)) bit for bit, for w = [gate; up] ([2I, K], gate rows first): one GEMV whose
    tile t takes gate rows 8t..8t+7 and the matching up rows, so each lane holds both factors. I % 8 == 0."""
    rows = _gemv_rows(x, w)
    inter = w.shape[0] // 2
    if rows is None or w.shape[0] % 16:
        return None
    x2, w = rows
    out = cp.empty((*x.shape[:-1], inter), dtype=x.dtype)
    blas.launch_gemv("gemv_silu_bf16", x2, w, (out, np.int64(inter), np.int32(inter)))
    return out


def gemv_add_rms_norm(x: cp.ndarray, w: cp.ndarray, residual: cp.ndarray, norm_w: cp.ndarray, eps: float,
                      sfx: str) -> cp.ndarray | None:
    """add_rms_norm(linear(x, w), residual, norm_w, eps)'s normed output, residual updated in place: one
    GEMV into a scratch y whose last CTA runs the add + RMSNorm over the whole rows. `sfx`: the norm's
    kernel suffix (ops.norm_suffix). Its rows move as 16-byte words: N % 8 == 0, a bf16 residual [M, N]
    with 16-byte aligned rows, packed aligned norm weights. Its grid counter is slot 0 of
    arrival_counters("gemv_grid")."""
    rows = _gemv_rows(x, w)
    n = w.shape[0]
    if (rows is None or rows[0].shape[0] > ADD_RMS_NORM_MAX_M or n % 8 or residual.dtype != BF16
            or residual.shape != (rows[0].shape[0], n)):
        return None
    if (residual.strides[1] != 2 or residual.strides[0] % 16 or residual.data.ptr % 16
            or not norm_w.flags.c_contiguous or norm_w.shape != (n,) or norm_w.data.ptr % 16):
        return None
    counters = arrival_counters("gemv_grid")
    if counters is None:
        return None
    x2, w = rows
    y = cp.empty((x2.shape[0], n), dtype=BF16)
    out = cp.empty((*x.shape[:-1], n), dtype=BF16)
    blas.launch_gemv(f"gemv_add_rms_norm_{sfx}", x2, w,
                     (y, np.int32(n), residual, np.int64(residual.strides[0] // 2), norm_w, out, np.float32(eps),
                      counters))
    return out
