"""CUDA wrappers of the ops on quantized weights (quant.cu, quant_mma.cu), with the numpy references' signatures
(kernels/numpy_quant.py): linear_int4 / linear_fp8 and moe_experts_int4 / moe_experts_fp8.

A linear of at most GEMV_MAX_ROWS rows (decode) streams the packed weight once through q_gemv; more rows (prefill)
dequantize the weight into a transient dense copy and run the cuBLAS GEMM, so only one Linear is ever expanded.

The routed experts take decode kernels while each local expert has few (token, expert) pairs (they stream each
selected expert's rows once per few pairs): quant.cu's GEMV kernels, or for INT4 on bf16 quant_mma.cu's, which do the
multiply-adds on the tensor cores (tensor_core_gemv); and from MMA_ROWS_PER_EXPERT pairs an expert on average
(prefill) the grouped GEMM on the tensor cores (moe_gemm.cuh with quant.cu's INT4 / FP8 weight policy): moe.cu's
moe_align groups the pairs into row tiles, each weight tile is expanded once in shared memory for the tile's 32 or
128 rows. Every choice depends only on the token count, so each captures into a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cupy as cp
import numpy as np

from ...quant import Fp8Weight, Int4Weight
from .beside import Beside, ready
from .blas import linear
from .module import BF16, NULL, as_index, launch, suffix
from .moe import (ALIGN_MAX_EXPERTS, BF16_TILE_BYTES, GEMM_BK, GEMM_BN, GEMM_THREADS, WIDE_ROWS_PER_EXPERT,
                  align_tiles, gemm_smem, packed_addend)

GEMV_MAX_ROWS = 16
WARPS, P = 8, 8         # quant.cu: warps per block (q_gemv: a weight row each), q_gemv's activation rows per pass
CHUNK_WEIGHTS = {"int4": 32, "fp8": 16}   # weights of the 16-byte chunk a lane reads
EXPERT_PAIRS = 4        # quant.cu NP: pairs of an expert kernel pass
MMA_WARPS, MMA_PAIRS = 8, 8   # quant_mma.cu: warps a block, pairs a pass (the mma's n)
MMA_STAGE_PAD = 4       # quant_mma.cu PAIR_PAD: words after a staged pair
MOE_CHUNK = 1024        # tokens per pass of the GEMV expert path: its float32 per-pair buffers stay ~100s of MB
MMA_CHUNK = 4096        # tokens per pass of the GEMM path (Kimi-K2: 0.9 GB of float32 per-pair outputs, and ~85
                        # pairs an expert, so the 128-row tiles)
MMA_ROWS_PER_EXPERT = 16   # average pairs a local expert from which the experts run as the tensor-core GEMM
MMA_K_MULTIPLE = 64     # its widths (hidden, expert) are whole 64-column k tiles (INT4: each tile's two scales in
                        # one aligned 4-byte copy)
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
    if getattr(w, "tiled", False):
        raise TypeError("a tiled INT4 stack is an expert stack, not a Linear")
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
                      expert_offset: int, addend: cp.ndarray | Beside | None = None) -> cp.ndarray:
    """The routed experts of one layer on quantized stacks (numpy_quant.moe_experts_quant's contract), in passes of
    MOE_CHUNK tokens on the GEMV kernels or MMA_CHUNK on the tensor-core GEMM (the per-pair float32 intermediates of
    a long prefill stay bounded), each pass on the path its own token count picks (expert_tile_rows)."""
    fmt = _fmt(gate_up)
    if _fmt(down) != fmt:
        raise TypeError("gate_up and down experts must share one format")
    if fmt == "int4" and not (gate_up.tiled and down.tiled):
        raise TypeError("INT4 expert stacks are read in the tiled layout: stage them with quant.staging."
                        "stack_to_backend or Int4Weight.tiles()")
    x = _rows(x)
    T, D = x.shape
    I = gate_up.shape[1] // 2
    _check(gate_up, x, D)
    _check(down, x, I)
    ids = cp.ascontiguousarray(as_index(ids, np.int32))
    E, k = gate_up.shape[0], ids.shape[1] if ids.ndim == 2 else 1
    ids = ids.reshape(T, k)
    weights = cp.ascontiguousarray(cp.asarray(weights, dtype=cp.float32)).reshape(T, k)
    y = cp.empty((T, D), dtype=x.dtype)
    add = None if addend is None else packed_addend(addend, y)
    chunk = MMA_CHUNK if expert_tile_rows(x.dtype, min(T, MMA_CHUNK), k, E, D, I) else MOE_CHUNK
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        args = (x[t0:t1], gate_up, down, ids[t0:t1], weights[t0:t1], expert_offset,
                NULL if add is None else add[t0:t1], y[t0:t1])
        mt = expert_tile_rows(x.dtype, t1 - t0, k, E, D, I) // 16
        if mt:
            moe_chunk_mma(fmt, mt, *args)
        else:
            moe_chunk_gemv(fmt, *args)
    return y


def expert_tile_rows(dtype: np.dtype, T: int, k: int, E: int, D: int, I: int) -> int:
    """Rows of the tensor-core GEMM's tiles for T tokens of top-k over E local experts (hidden D, width I), or 0 for
    the GEMV kernels: the GEMM from MMA_ROWS_PER_EXPERT pairs an expert on average, with 128-row tiles from moe.py's
    WIDE_ROWS_PER_EXPERT on and 32-row ones below (a 1k-token chunk of Kimi-K2: ~21 pairs an expert); for bf16
    activations and widths of whole k tiles."""
    if np.dtype(dtype) != BF16 or D % MMA_K_MULTIPLE or I % MMA_K_MULTIPLE or not 0 < E <= ALIGN_MAX_EXPERTS:
        return 0
    pairs = T * k
    if pairs < MMA_ROWS_PER_EXPERT * E:
        return 0
    return 128 if pairs >= WIDE_ROWS_PER_EXPERT * E else 32


def mma_stage_bytes(fmt: str) -> int:
    """quant.cu's QuantExperts stage: the 64 W rows' packed chunks of a 64-column k tile, a 4-byte scale word each."""
    return GEMM_BN * (GEMM_BK // CHUNK_WEIGHTS[fmt] * 16 + 4)


@dataclass(frozen=True)
class ExpertPass:
    """One form of quant.cu's expert kernels: a row is read by a group of `lanes` lanes (32 / lanes groups a warp),
    each group reads `rows` rows (gate_up: the gate and up rows of rows / 2 outputs), and a lane loads `chunks`
    16-byte chunks per row and pass (rows * chunks loads in flight)."""
    lanes: int
    rows: int
    chunks: int

    @property
    def name(self) -> str:
        return f"l{self.lanes}r{self.rows}u{self.chunks}"

    @property
    def warp_rows(self) -> int:
        return 32 // self.lanes * self.rows


def expert_pass(fmt: str, K: int) -> ExpertPass:
    """The expert kernel form for rows of K weights. Measured on H100 at Kimi-K2's shapes (1-32 tokens), whole-warp
    rows (4 a warp): one chunk a lane and pass streams FP8 rows fastest, two INT4 rows of more than 64 chunks (hidden
    7168: 224 chunks), and rows of at most 64 (INT4 width 2048) stream equally fast with either. Groups of 8 lanes
    a row (4 rows at once per 3-step reduction) were slower for those short rows (29 % of the copy rate against
    41 %), so every form reads a row with the whole warp."""
    return ExpertPass(32, 4, 2 if fmt == "int4" and K // CHUNK_WEIGHTS[fmt] > 64 else 1)


def tensor_core_gemv(fmt: str, dtype: np.dtype) -> bool:
    """Whether decode-sized passes of these experts run on the tensor cores (quant_mma.cu) rather than quant.cu's GEMV
    kernels: INT4 on bf16 activations. The GEMV kernels are bound by the ~3 instructions an INT4 weight costs them
    and re-read an expert's rows every 4 pairs; on an H100 at Kimi-K2's shapes the tensor-core kernels, over the
    tiled stacks with one-column passes handing x between lanes, stream the whole expert call at 72 / 90 / 92 / 87 %
    of the copy rate at 1 / 8 / 32 / 128 tokens (docs/benchmarks/kimi-k2.md). The choice does not follow the token
    count: a pair's sums are then the same whatever it is batched with, so batching does not move greedy tokens.
    FP8 rows (one weight a byte, 69-89 % on CUDA cores) and float32 activations keep quant.cu's kernels."""
    return fmt == "int4" and np.dtype(dtype) == BF16


def mma_stage_bytes_down(I: int, pairs: int) -> int:
    """quant_mma.cu's down stage: `pairs` rows of h, each I / 32 chunks of 4 lanes x 8 words (bf16 hi and lo parts:
    a word a value) and MMA_STAGE_PAD words."""
    return pairs * (I + MMA_STAGE_PAD) * 4


def stage_pairs(tokens: int) -> int:
    """The pairs a pass of quant.cu's down kernel stages: as many as an expert's pairs usually are (a router picks
    an expert once a token), at most EXPERT_PAIRS; more pairs (repeated ids) take more passes."""
    return min(EXPERT_PAIRS, tokens)


def stage_bytes(fmt: str, K: int, itemsize: int, pairs: int) -> int:
    """The down kernel's dynamic shared memory: `pairs` activation rows of K values, each chunk of CHUNK_WEIGHTS
    values followed by 16 bytes of padding."""
    chunk = CHUNK_WEIGHTS[fmt]
    return pairs * (K // chunk) * (chunk * itemsize + 16)


def moe_chunk_gemv(fmt: str, x: cp.ndarray, gate_up: Any, down: Any, ids: cp.ndarray, weights: cp.ndarray,
                   expert_offset: int, addend: Any, y: cp.ndarray) -> None:
    """The four launches of the decode expert path for tokens x [T, D] (contiguous rows) and ids [T, k], into y (the
    plan, gate_up and down on quant.cu's GEMV kernels or quant_mma.cu's, the combine); `addend` packed [T, D] rows or
    NULL."""
    T, D = x.shape
    E_local, I2, _ = gate_up.shape
    I = I2 // 2
    k = ids.shape[1]
    n = T * k
    slots = min(E_local, n)
    slot_expert = cp.empty(slots, cp.int32)
    slot_start = cp.empty(slots + 1, cp.int32)
    pair_list = cp.empty(n, cp.int32)
    launch("quant", "moe_plan", (1,), _PLAN_THREADS,
           (ids, np.int32(n), np.int32(E_local), np.int32(expert_offset), np.int32(slots), slot_expert, slot_start,
            pair_list), smem=4 * E_local)
    h = cp.empty((n, I), dtype=cp.float32)
    yk = cp.empty((n, D), dtype=cp.float32)
    plan = (slot_expert, slot_start, pair_list)
    if tensor_core_gemv(fmt, x.dtype):
        staged = min(MMA_PAIRS, T)
        q, s = _arrays(gate_up)
        launch("quant_mma", "moe_q_mma_gate_up_int4", (-(-I // (8 * MMA_WARPS)), slots), 32 * MMA_WARPS,
               (x, q, s, *plan, np.int32(k), np.int32(D), np.int32(I), h))
        q, s = _arrays(down)
        launch("quant_mma", "moe_q_mma_down_int4", (-(-D // (16 * MMA_WARPS)), slots), 32 * MMA_WARPS,
               (h, q, s, *plan, weights, np.int32(D), np.int32(I), np.int32(staged), yk),
               smem=mma_stage_bytes_down(I, staged))
    else:
        staged = stage_pairs(T)
        q, s = _arrays(gate_up)
        p = expert_pass(fmt, D)
        launch("quant", f"moe_q_gate_up_{fmt}_{suffix(x.dtype)}_{p.name}", (-(-I // (WARPS * p.warp_rows // 2)), slots),
               32 * WARPS, (x, q, s, *plan, np.int32(k), np.int32(D), np.int32(I), h))
        q, s = _arrays(down)
        p = expert_pass(fmt, I)
        launch("quant", f"moe_q_down_{fmt}_{suffix(x.dtype)}_{p.name}", (-(-D // (WARPS * p.warp_rows)), slots),
               32 * WARPS, (h, q, s, *plan, weights, np.int32(D), np.int32(I), np.int32(staged), yk),
               smem=stage_bytes(fmt, I, 4, staged))
    _combine(yk, ids, E_local, expert_offset, addend, y)


def moe_chunk_mma(fmt: str, mt: int, x: cp.ndarray, gate_up: Any, down: Any, ids: cp.ndarray, weights: cp.ndarray,
                  expert_offset: int, addend: Any, y: cp.ndarray) -> None:
    """The tensor-core expert path for tokens x [T, D] (bf16, contiguous rows) and ids [T, k], in row tiles of 16 * mt
    rows (quant.cu's moe_gate_up_<fmt>_m<mt> / moe_down_<fmt>_m<mt>, moe.cu's moe_align), into y; `addend` packed
    [T, D] rows or NULL. h is bf16 (the mma's input), in the pairs' sorted order."""
    T, D = x.shape
    E_local, I2, _ = gate_up.shape
    I = I2 // 2
    g = align_tiles(ids, E_local, expert_offset, mt)
    tiles, grouping = g.tiles, (g.sorted, np.int32(ids.shape[1]))
    smem = gemm_smem(mt, mma_stage_bytes(fmt), BF16_TILE_BYTES)
    h = cp.empty((ids.size, I), dtype=BF16)
    q, s = _arrays(gate_up)
    launch("quant", f"moe_gate_up_{fmt}_m{mt}", (-(-I // (GEMM_BN // 2)), tiles), GEMM_THREADS,
           (x, np.int64(D), *grouping, q, s, np.int32(I), np.int32(D), *g.tile_args, h, np.int64(I)), smem)
    yk = cp.empty((ids.size, D), dtype=cp.float32)
    q, s = _arrays(down)
    launch("quant", f"moe_down_{fmt}_m{mt}", (-(-D // GEMM_BN), tiles), GEMM_THREADS,
           (h, np.int64(I), *grouping, q, s, np.int32(D), np.int32(I), *g.tile_args, weights, yk, np.int64(D)), smem)
    _combine(yk, ids, E_local, expert_offset, addend, y)


def _combine(yk: cp.ndarray, ids: cp.ndarray, E_local: int, expert_offset: int, addend: Any, y: cp.ndarray) -> None:
    """y [T, D] = each token's per-pair rows of yk [T * k, D] (float32) summed in slot order, plus the addend."""
    (T, D), k = y.shape, ids.shape[1]
    addend = ready(addend)   # an addend computed beside: joined here
    launch("quant", f"moe_combine_{suffix(y.dtype)}", (T, -(-D // (4 * _COMBINE_THREADS))), _COMBINE_THREADS,
           (yk, ids, np.int32(k), np.int32(D), np.int32(E_local), np.int32(expert_offset), addend, y))
