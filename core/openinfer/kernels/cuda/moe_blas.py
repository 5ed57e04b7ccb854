"""`moe_experts` with each local expert's projections through cuBLAS, for prefill-sized eager steps; moe.py's grouped
GEMMs for every other call (their wide tiles on warpgroup MMA on sm_90). kernels/cuda/__init__.py registers this as
"cublas", ranked above "wgmma" and "grouped" (moe.py alone, for `--kernel moe_experts=...`).

The rule, call by call (`uses_cublas`): a step whose T tokens x top-k pairs give at least PREFILL_ROWS_PER_EXPERT rows
(PREFILL_ROWS_PER_EXPERT_SM90 on sm_90, where the grouped GEMMs' wide tiles run on warpgroup MMA) to each local expert
on average (T * k >= PREFILL_ROWS_PER_EXPERT * E_local, the form of moe.py's 128-row tile rule;
under expert parallelism every pair counts, so it fires at fewer tokens a rank, as that rule does) and that no CUDA
graph is capturing. Outside a capture it depends on the step's shape alone, so an eager engine and
a graph engine run the same implementation for the same step (their greedy tokens agree: decode batches, at most
max_num_seqs x k / E_local rows an expert, 24 for V2-Lite at 256 sequences, stay far below the threshold). A prefill
cut into smaller chunks may land below it, where the grouped kernel sums in another order and rounds elsewhere (it
keeps gate and up in fp32 for the SwiGLU): the two agree to bf16 rounding, not to the bit, as the dense layers'
cuBLAS GEMMs already differ with M.

The path: moe_align groups the pairs by expert in one tile an expert (and notes each pair's place), the tile list is
read to the host (the layer's one synchronisation: the cuBLAS calls need each expert's row count on the host), the x
rows are gathered in that order, one cublasGemmEx an expert for gate_up (bf16 out, as transformers computes it), the
SwiGLU over all rows at once (ops.silu_mul), one cublasGemmEx an expert for down (fp32 out), and moe.py's combine
weights and sums each token's rows (with the addend) and rounds once. The host read is why this path is eager only:
graphs capture decode steps alone (model_runner: a step replays a graph only if it is all decode and fits a bucket),
at a few rows an expert, far below the threshold; any call inside a capture takes the grouped GEMMs whatever its
shape. At the threshold each expert's two GEMMs keep the GPU busy for longer than the host takes to issue them.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from .beside import Beside
from .blas import grouped_gemm
from .module import BF16, hopper
from .moe import align, combine, expert_args, expert_shapes
from .moe import moe_experts as grouped_mma, moe_experts_wgmma as grouped_wgmma
from .ops import gather_rows, silu_mul

# Average rows a local expert from which cuBLAS runs the experts: beside the grouped GEMMs on mma.sync, and beside
# their warpgroup-MMA tiles on sm_90 (V2-Lite's widths, H100, two machines: wgmma ahead up to 576 rows an expert, at
# 768 ahead on one (2.79 against 3.82 ms) and behind on the other (2.65 against 2.49), behind at 1,536 (5.0 against
# 4.1); docs/benchmarks/deepseek-v2-lite.md).
PREFILL_ROWS_PER_EXPERT = 256
PREFILL_ROWS_PER_EXPERT_SM90 = 1024


def _capturing() -> bool:
    return cp.cuda.get_current_stream().is_capturing()


def uses_cublas(T: int, k: int, E: int) -> bool:
    """Whether moe_experts runs T tokens' top-k experts over E local experts through cuBLAS (the module's rule)."""
    rows = PREFILL_ROWS_PER_EXPERT_SM90 if hopper() else PREFILL_ROWS_PER_EXPERT
    return T * k >= rows * E and not _capturing()


def moe_experts(x: cp.ndarray, gate_up: cp.ndarray, down: cp.ndarray, ids: cp.ndarray, weights: cp.ndarray,
                expert_offset: int, addend: cp.ndarray | Beside | None = None) -> cp.ndarray:
    """moe.moe_experts' contract; cuBLAS per expert where `uses_cublas`, the grouped GEMMs otherwise (their 128-row
    tiles on warpgroup MMA on sm_90)."""
    T, _, E, _ = expert_shapes(x, gate_up, down)
    if T and uses_cublas(T, ids.shape[1], E):
        return moe_experts_cublas(x, gate_up, down, ids, weights, expert_offset, addend)
    return (grouped_wgmma if hopper() else grouped_mma)(x, gate_up, down, ids, weights, expert_offset, addend)


def moe_experts_cublas(x: cp.ndarray, gate_up: cp.ndarray, down: cp.ndarray, ids: cp.ndarray, weights: cp.ndarray,
                       expert_offset: int, addend: cp.ndarray | Beside | None = None) -> cp.ndarray:
    """moe.moe_experts' contract through cuBLAS, whatever the shape; reads the routing to the host (never inside a
    CUDA graph capture)."""
    a = expert_args(x, gate_up, down, ids, weights, addend)
    if a.T == 0:
        return a.y
    D, E, I, k, pairs = a.D, a.E, a.I, a.k, a.T * a.k
    row_of = cp.empty((pairs,), dtype=cp.int32)
    g = align(a.ids, E, expert_offset, pairs, min(E, pairs) + 1, row_of)   # tiles of `pairs` rows: one an expert
    meta = cp.asnumpy(g.meta)
    used, tiles = int(meta[-1]), g.tiles
    groups = list(zip(*(meta[i * tiles: i * tiles + used].tolist() for i in range(3))))   # (expert, start, end)
    n = groups[-1][2] if groups else 0   # the local pairs, grouped by expert in expert order
    xs = gather_rows(x, g.sorted[:n] // np.int32(k))
    gu = cp.empty((n, 2 * I), dtype=BF16)
    grouped_gemm(xs, gate_up, gu, groups)
    del xs   # each buffer goes back to the pool once its last reader is queued
    h = silu_mul(gu)
    del gu
    ys = cp.empty((n, D), dtype=cp.float32)
    grouped_gemm(h, down, ys, groups)
    return combine(ys, a.ids, E, expert_offset, a.addend, a.y, row_of, a.weights)
