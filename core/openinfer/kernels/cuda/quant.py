"""CUDA wrappers of the ops on quantized weights (quant.cu), with the numpy references' signatures
(kernels/numpy_quant.py): linear_int4 / linear_fp8 and moe_experts_int4 / moe_experts_fp8.

A linear of at most GEMV_MAX_ROWS rows (decode) streams the packed weight once through q_gemv; more rows (prefill)
dequantize the weight into a transient dense copy and run the cuBLAS GEMM, so only one Linear is ever expanded.
"""
from __future__ import annotations

from typing import Any

import cupy as cp
import numpy as np

from ...quant import Fp8Weight, Int4Weight
from .blas import linear
from .module import NULL, as_index, launch, suffix
from .moe import packed_addend

GEMV_MAX_ROWS = 16
WARPS, P = 8, 8         # quant.cu: warps per block (q_gemv: a weight row each), q_gemv's activation rows per pass
EXPERT_ROWS = 4         # quant.cu's ER: weight rows a warp of the expert kernels (gate_up: 2 outputs' gate and up)
CHUNK_WEIGHTS = {"int4": 32, "fp8": 16}   # weights of the 16-byte chunk a lane reads
MOE_CHUNK = 1024        # tokens per pass of the expert path: its float32 per-pair buffers stay ~100s of MB
_PLAN_THREADS = 1024
_COMBINE_THREADS = 256  # 4 columns a thread


def _fmt(w: Any) -> str:
    if isinstance(w, Int4Weight):
        return "int4"
    if isinstance(w, Fp8Weight):
        return "fp8"
    raise TypeError(f"expected an Int4Weight or Fp8Weight, got {type(w).__name__}")


def _arrays(w: Any) -> tuple[cp.ndarray, cp.ndarray]:
    return (w.packed, w.scale) if isinstance(w, Int4Weight) else (w.data, w.scale)


def _check(w: Any, x: cp.ndarray, K: int) -> None:
    q, s = _arrays(w)
    if K % CHUNK_WEIGHTS[_fmt(w)]:
        raise ValueError(f"quantized weights need an input width divisible by 16 (INT4: 32), got {K}")
    if isinstance(w, Int4Weight) and s.dtype != x.dtype:
        raise TypeError(f"INT4 scales of {s.dtype} beside {x.dtype} activations: stage them in the model dtype")
    if isinstance(w, Fp8Weight) and s.dtype != np.float32:
        raise TypeError(f"FP8 scales must be float32, got {s.dtype}")
    if not (q.flags.c_contiguous and s.flags.c_contiguous):
        raise ValueError("quantized weights must be contiguous")
    if q.data.ptr % 16:   # rows are read as 16-byte chunks
        raise ValueError("quantized weights must start 16-byte aligned (a fresh device array, not an offset view)")


def _rows(x: cp.ndarray) -> cp.ndarray:
    """x as packed rows starting 16-byte aligned: the kernels read 8 activations at a time as 16-byte words (a
    contiguous view into a wider row, e.g. one token's column slice, may start anywhere)."""
    x = cp.ascontiguousarray(x)
    if x.data.ptr % 16 == 0:
        return x
    out = cp.empty(x.shape, x.dtype)
    out[...] = x
    return out


def dequantize(w: Any, dtype: np.dtype) -> cp.ndarray:
    """The dense [out, in] weight of one quantized Linear, in `dtype`."""
    N, K = w.shape[-2:]
    out = cp.empty((N, K), dtype=dtype)
    q, s = _arrays(w)
    _check(w, out, K)
    fmt = _fmt(w)
    if N:
        launch("quant", f"q_dequant_{fmt}_{suffix(out.dtype)}", (N,), 128, (q, s, np.int32(K), out))
    return out


def linear_quant(x: cp.ndarray, w: Any) -> cp.ndarray:
    """x [M, in] @ W.T for a quantized W [out, in]."""
    N, K = w.shape
    x = _rows(x)
    M = x.shape[0]
    if M > GEMV_MAX_ROWS:
        return linear(x, dequantize(w, x.dtype))
    _check(w, x, K)
    y = cp.empty((M, N), dtype=x.dtype)
    q, s = _arrays(w)
    fmt = _fmt(w)
    if M and N:
        launch("quant", f"q_gemv_{fmt}_{suffix(x.dtype)}", (-(-N // WARPS), -(-M // P)), 32 * WARPS,
               (x, np.int64(K), q, s, np.int32(M), np.int32(N), np.int32(K), y))
    return y


def moe_experts_quant(x: cp.ndarray, gate_up: Any, down: Any, ids: Any, weights: Any,
                      expert_offset: int, addend: cp.ndarray | None = None) -> cp.ndarray:
    """The routed experts of one layer on quantized stacks (numpy_quant.moe_experts_quant's contract), MOE_CHUNK
    tokens at a time (the per-pair float32 intermediates of a long prefill stay bounded)."""
    fmt = _fmt(gate_up)
    if _fmt(down) != fmt:
        raise TypeError("gate_up and down experts must share one format")
    x = _rows(x)
    T, D = x.shape
    I = gate_up.shape[1] // 2
    _check(gate_up, x, D)
    _check(down, x, I)
    ids = cp.ascontiguousarray(as_index(ids, np.int32))
    weights = cp.ascontiguousarray(cp.asarray(weights, dtype=cp.float32))
    y = cp.empty((T, D), dtype=x.dtype)
    add = None if addend is None else packed_addend(addend, y)
    for t0 in range(0, T, MOE_CHUNK):
        t1 = min(T, t0 + MOE_CHUNK)
        _moe_chunk(fmt, x[t0:t1], gate_up, down, ids[t0:t1], weights[t0:t1], expert_offset,
                   NULL if add is None else add[t0:t1], y[t0:t1])
    return y


def expert_pass(fmt: str, K: int) -> int:
    """U of quant.cu's expert kernels for rows of K weights: the 16-byte chunks a lane loads per row and pass (a warp
    reads EXPERT_ROWS rows, so a lane has EXPERT_ROWS * U loads in flight). Measured on H100 at Kimi-K2's shapes
    (1-32 tokens): U = 1 streams FP8 rows fastest; INT4 rows of more than 64 chunks (hidden 7168: 224) stream a
    few percent faster with U = 2 at 8-32 tokens, rows of 64 (width 2048) equally fast with either; U = 4 was
    slower for every row and token count, so it is not built."""
    return 2 if fmt == "int4" and K // CHUNK_WEIGHTS[fmt] > 64 else 1


def _moe_chunk(fmt: str, x: cp.ndarray, gate_up: Any, down: Any, ids: cp.ndarray, weights: cp.ndarray,
               expert_offset: int, addend: Any, y: cp.ndarray) -> None:
    """The four launches of quant.cu's expert path for tokens x [T, D] (contiguous rows), into y; `addend` packed
    [T, D] rows or NULL."""
    T, D = x.shape
    E_local, I2, _ = gate_up.shape
    I = I2 // 2
    k = ids.shape[1] if ids.ndim == 2 else 1
    n = T * k
    slots = min(E_local, n)
    slot_expert = cp.empty(slots, cp.int32)
    slot_start = cp.empty(slots + 1, cp.int32)
    pair_list = cp.empty(n, cp.int32)
    launch("quant", "moe_plan", (1,), _PLAN_THREADS,
           (ids, np.int32(n), np.int32(E_local), np.int32(expert_offset), np.int32(slots), slot_expert, slot_start,
            pair_list), smem=4 * E_local)
    h = cp.empty((n, I), dtype=cp.float32)
    q, s = _arrays(gate_up)
    launch("quant", f"moe_q_gate_up_{fmt}_{suffix(x.dtype)}_u{expert_pass(fmt, D)}",
           (-(-I // (WARPS * EXPERT_ROWS // 2)), slots), 32 * WARPS,
           (x, q, s, slot_expert, slot_start, pair_list, np.int32(k), np.int32(D), np.int32(I), h))
    yk = cp.empty((n, D), dtype=cp.float32)
    q, s = _arrays(down)
    launch("quant", f"moe_q_down_{fmt}_{suffix(x.dtype)}_u{expert_pass(fmt, I)}",
           (-(-D // (WARPS * EXPERT_ROWS)), slots), 32 * WARPS,
           (h, q, s, slot_expert, slot_start, pair_list, weights, np.int32(D), np.int32(I), yk))
    launch("quant", f"moe_combine_{suffix(x.dtype)}", (T, -(-D // (4 * _COMBINE_THREADS))), _COMBINE_THREADS,
           (yk, ids, np.int32(k), np.int32(D), np.int32(E_local), np.int32(expert_offset), addend, y))
