"""MoE on CUDA: `router_logits`, `moe_route` (one launch each), `moe_router` (both in one launch) and `moe_experts`
(moe.cu: align, gate_up, down, combine).

Every launch's shape depends only on the token count, the top-k and the local expert count, and nothing is read
back to the host, so a decode step with its MoE layers captures into a CUDA graph. The grouped GEMMs are sized for
the most row tiles any routing of T tokens can give; the tiles a routing does not use leave at once. At decode
(few rows an expert) each selected expert's weights stream through once in 16-row tiles; prefill-sized batches
take 128-row tiles, so each weight tile serves eight times the rows: on warpgroup MMA (moe_wgmma.cu) where the
registry picks "wgmma" (sm_90), else on mma.sync like the 16-row ones. moe_blas.py is the other implementation of
`moe_experts` (cuBLAS per expert for prefill-sized eager steps); it shares the align and the combine defined here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cupy as cp
import numpy as np

from .beside import Beside, ready
from .module import BF16, COUNTER_SLOTS, NULL, arrival_counters, launch, rows2d

ROUTER_WARPS, ROUTER_TOKENS = 8, 4             # must match moe.cu: experts and tokens of a router_logits block
ROUTE_WARPS, ROUTE_MAX_EXPERTS = 4, 512        # moe.cu (ROUTE_WARPS, 32 * ROUTE_PER_LANE)
METHODS = {"greedy": 0, "group_limited_greedy": 1, "noaux_tc": 2}
ALIGN_THREADS, ALIGN_MAX_EXPERTS = 1024, 1024  # moe.cu
GEMM_BN, GEMM_BK, GEMM_STAGES, GEMM_THREADS = 64, 64, 3, 128
# The 16-row tiles up to DEEP_MAX_TOKENS tokens keep DEEP_STAGES cp.async stages in flight (moe.cu's _s6 kernels: the
# same arithmetic, so the same bits). In DeepSeek-V2-Lite's decode step on an H100: about 2 % faster at batch 1 and
# 32, 1.4 % slower at 128, where the deeper stages' shared memory halves the CTAs an SM.
DEEP_STAGES, DEEP_MAX_TOKENS = 6, 32
WIDE_ROWS_PER_EXPERT = 64                      # average rows an expert from which the 128-row tiles are used
MW_THREADS, MW_BM, MW_BN, MW_BK, MW_STAGES = 256, 128, 128, 64, 5   # moe_wgmma.cu: 128-row tiles on sm_90


BF16_TILE_BYTES = GEMM_BN * (GEMM_BK + 8) * 2   # moe_gemm.cuh: 64 W rows of 64 (+ 8 pad) bf16


def gemm_smem(mt: int, w_stage: int = BF16_TILE_BYTES, w_tile: int = 0, stages: int = GEMM_STAGES) -> int:
    """The grouped GEMM's dynamic shared memory: `stages` cp.async stages of 16 * mt A rows of 64 (+ 8 pad) bf16 and
    the W policy's `w_stage` bytes (bf16 experts: their rows), then its `w_tile` bytes of scratch (moe_gemm.cuh)."""
    return stages * (16 * mt * (GEMM_BK + 8) * 2 + w_stage) + w_tile


def gemm_stages(mt: int, tokens: int) -> int:
    """The bf16 grouped GEMM's cp.async stages for a call of `tokens` tokens in tiles of 16 * mt rows."""
    return DEEP_STAGES if mt == 1 and tokens <= DEEP_MAX_TOKENS else GEMM_STAGES


def row_tiles(pairs: int, experts: int, mt: int) -> int:
    """The most tiles of 16 * mt rows that `pairs` (token, expert) pairs cut into per-expert runs can give."""
    return -(-pairs // (16 * mt)) + min(experts, pairs)


def _gate_args(x: cp.ndarray, w: cp.ndarray) -> tuple:
    """router_logits' arguments before its output: x's rows, their stride, the gate, T, E, D (checked)."""
    if x.dtype != BF16 or w.dtype != np.float32:
        raise TypeError("router_logits on CUDA takes bf16 activations and a float32 gate")
    x2, stride = rows2d(x)
    (T, D), E = x2.shape, w.shape[0]
    if w.shape[1] != D:
        raise ValueError(f"router_logits: x has {D} features, the gate expects {w.shape[1]}")
    return x2, np.int64(stride), cp.ascontiguousarray(w), np.int32(T), np.int32(E), np.int32(D)


def _router_grid(T: int, E: int) -> tuple[int, int]:
    return -(-E // ROUTER_WARPS), -(-T // ROUTER_TOKENS)


def router_logits(x: cp.ndarray, w: cp.ndarray) -> cp.ndarray:
    """The MoE gate in float32 whatever the activations: x [T, D] bf16, w [E, D] float32 -> [T, E] float32."""
    args = _gate_args(x, w)
    T, E = int(args[3]), int(args[4])
    out = cp.empty((T, E), dtype=cp.float32)
    if T and E:
        launch("moe", "router_logits_bf16", _router_grid(T, E), 32 * ROUTER_WARPS, (*args, out))
    return out


def _route_config(cfg: Any, E: int) -> tuple[int, int, int, int, int]:
    """(top_k, sigmoid, method, n_group, topk_group) of a RouterConfig, checked against what moe.cu computes."""
    k, method = int(cfg.top_k), METHODS.get(cfg.method)
    if method is None:
        raise ValueError(f"moe_route: method {cfg.method!r} is not one of {sorted(METHODS)}")
    if cfg.scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"moe_route: scoring {cfg.scoring!r} is not softmax or sigmoid")
    if not 0 < E <= ROUTE_MAX_EXPERTS or not 0 < k <= min(E, 32):
        raise ValueError(f"moe_route: {E} experts, top {k}: the CUDA router takes up to {ROUTE_MAX_EXPERTS} "
                         "experts and a top-k of up to 32")
    n_group, topk_group = int(cfg.n_group or 1), int(cfg.topk_group or 1)
    if method and n_group > 1 and (n_group > 32 or E % n_group or not 0 < topk_group <= n_group):
        raise ValueError(f"moe_route: {n_group} groups (top {topk_group}) of {E} experts: need up to 32 groups "
                         "that divide the experts")
    return k, int(cfg.scoring == "sigmoid"), method, n_group, topk_group


def _route_outputs(T: int, E: int, bias: cp.ndarray | None, cfg: Any) -> tuple:
    """(ids, weights) to fill, the bias argument and the routing's scalars (from k to the scale), checked."""
    if bias is not None and bias.dtype != np.float32:
        raise TypeError("moe_route takes float32 router logits and correction bias")
    k, sigmoid, method, n_group, topk_group = _route_config(cfg, E)
    ids = cp.empty((T, k), dtype=cp.int32)
    weights = cp.empty((T, k), dtype=cp.float32)
    b = NULL if bias is None else cp.ascontiguousarray(bias)
    return ids, weights, b, (np.int32(k), np.int32(sigmoid), np.int32(method), np.int32(n_group),
                             np.int32(topk_group), np.int32(bool(cfg.norm_topk_prob)),
                             np.float32(cfg.routed_scaling_factor))


def moe_route(logits: cp.ndarray, bias: cp.ndarray | None, cfg: Any) -> tuple[cp.ndarray, cp.ndarray]:
    """Router logits [T, E] float32 -> (expert ids [T, k] int32, weights [T, k] float32) as numpy_mla_moe.moe_route
    gives them: best first, ties to the lower expert."""
    if logits.dtype != np.float32:
        raise TypeError("moe_route takes float32 router logits and correction bias")
    x, stride = rows2d(logits)
    T, E = x.shape
    ids, weights, b, scalars = _route_outputs(T, E, bias, cfg)
    if T:
        launch("moe", "moe_route_f32", (-(-T // ROUTE_WARPS),), 32 * ROUTE_WARPS,
               (x, np.int64(stride), b, np.int32(T), np.int32(E), *scalars, ids, weights))
    return ids, weights


def moe_router(x: cp.ndarray, w: cp.ndarray, bias: cp.ndarray | None, cfg: Any) -> tuple[cp.ndarray, cp.ndarray]:
    """moe_route(router_logits(x, w), bias, cfg) in one launch (moe_router_bf16), the same ids and weights; the two
    launches where the arrival counters are not set up (a first call inside a graph capture) or T exceeds them."""
    args = _gate_args(x, w)
    T, E = int(args[3]), int(args[4])
    counters = arrival_counters("moe_router")
    if counters is None or -(-T // ROUTER_TOKENS) > COUNTER_SLOTS:
        return moe_route(router_logits(x, w), bias, cfg)
    ids, weights, b, scalars = _route_outputs(T, E, bias, cfg)
    if T:
        logits = cp.empty((T, E), dtype=cp.float32)
        launch("moe", "moe_router_bf16", _router_grid(T, E), 32 * ROUTER_WARPS,
               (*args, logits, counters, b, *scalars, ids, weights))
    return ids, weights


def _aligned_rows(x: cp.ndarray) -> tuple[cp.ndarray, int]:
    """x as [rows, n] whose rows start on 16-byte boundaries (the GEMM copies 16-byte words)."""
    x2, stride = rows2d(x)
    if (x2.data.ptr | stride * x2.itemsize) % 16:
        x2 = cp.ascontiguousarray(x2)
        stride = x2.shape[1]
    return x2, stride


def expert_shapes(x: cp.ndarray, gate_up: cp.ndarray, down: cp.ndarray) -> tuple[int, int, int, int]:
    """(T, D, E_local, I) of moe_experts' operands, checked: bf16, weights packed and 16-byte aligned."""
    T, D = x.shape
    E, two_i, d2 = gate_up.shape
    I = two_i // 2
    if (x.dtype, gate_up.dtype, down.dtype) != (BF16, BF16, BF16):
        raise TypeError("moe_experts on CUDA takes bf16 activations and expert weights")
    if d2 != D or two_i != 2 * I or down.shape != (E, D, I):
        raise ValueError(f"moe_experts: gate_up {gate_up.shape} and down {down.shape} do not fit x {x.shape}")
    if D % 8 or I % 8 or not (gate_up.flags.c_contiguous and down.flags.c_contiguous) \
            or (gate_up.data.ptr | down.data.ptr) % 16:
        raise ValueError("moe_experts: expert weights must be packed, 16-byte aligned, with D and I multiples of 8")
    if E > ALIGN_MAX_EXPERTS:
        raise ValueError(f"moe_experts: {E} local experts; the CUDA path takes up to {ALIGN_MAX_EXPERTS}")
    return T, D, E, I


@dataclass
class ExpertArgs:
    """moe_experts' operands checked and packed (ids int32, weights float32, the addend as y's rows), its sizes and
    its output y [T, D] bf16 to fill."""
    T: int
    D: int
    E: int
    I: int
    k: int
    ids: cp.ndarray
    weights: cp.ndarray
    addend: cp.ndarray | Beside | None
    y: cp.ndarray


def expert_args(x: cp.ndarray, gate_up: cp.ndarray, down: cp.ndarray, ids: cp.ndarray, weights: cp.ndarray,
                addend: cp.ndarray | Beside | None) -> ExpertArgs:
    """moe_experts' arguments checked (expert_shapes, the addend's shape and dtype) and packed for its kernels."""
    T, D, E, I = expert_shapes(x, gate_up, down)
    y = cp.empty((T, D), dtype=BF16)
    return ExpertArgs(T, D, E, I, ids.shape[1], cp.ascontiguousarray(ids, dtype=cp.int32),
                      cp.ascontiguousarray(weights, dtype=cp.float32),
                      None if addend is None else packed_addend(addend, y), y)


@dataclass
class Grouping:
    """moe_align's output: the local pairs grouped by expert (`sorted`: pair ids), cut into tiles of `bm` rows,
    `tiles` their most; `meta` holds tile_expert, tile_start, tile_end (`tiles` each) and the tile count, one
    array so that a host copy is one read."""
    sorted: cp.ndarray
    meta: cp.ndarray
    tiles: int

    def tile(self, i: int) -> cp.ndarray:
        return self.meta[i * self.tiles: (i + 1) * self.tiles]

    @property
    def tile_args(self) -> tuple:
        return self.tile(0), self.tile(1), self.tile(2), self.meta[3 * self.tiles:]


def align(ids: cp.ndarray, E: int, expert_offset: int, bm: int, tiles: int, row_of: Any = NULL) -> Grouping:
    """moe_align over ids [T, k] (int32, packed): pairs of experts [offset, offset + E) by expert in tiles of bm
    rows; `row_of` [T * k] int32, if given, gets each local pair's place in that order."""
    pairs = ids.size
    grouping = Grouping(cp.empty((pairs,), dtype=cp.int32), cp.empty((3 * tiles + 1,), dtype=cp.int32), tiles)
    launch("moe", "moe_align", (1,), ALIGN_THREADS,
           (ids, np.int32(pairs), np.int32(E), np.int32(expert_offset), np.int32(bm), grouping.sorted,
            *grouping.tile_args, row_of))
    return grouping


def combine(y: cp.ndarray, ids: cp.ndarray, E: int, expert_offset: int, addend: cp.ndarray | Beside | None,
            out: cp.ndarray, row_of: Any = NULL, route_w: Any = NULL) -> cp.ndarray:
    """out [T, D] = moe_combine_bf16 of y's rows: the pairs' weighted rows, or (row_of, route_w) sorted unweighted
    rows; the addend (packed rows of out's shape: expert_args; joined here if it runs beside) added in fp32."""
    T, D = out.shape
    addend = ready(addend)
    launch("moe", "moe_combine_bf16", (T, min(-(-D // 256), 8)), 256,
           (y, ids, np.int32(ids.shape[1]), np.int32(E), np.int32(expert_offset), np.int32(D),
            NULL if addend is None else addend, row_of, route_w, out))
    return out


def moe_experts(x: cp.ndarray, gate_up: cp.ndarray, down: cp.ndarray, ids: cp.ndarray, weights: cp.ndarray,
                expert_offset: int, addend: cp.ndarray | Beside | None = None) -> cp.ndarray:
    """y [T, D] = sum over each token's slots whose expert lies in [expert_offset, expert_offset + E_local) of
    weight * down_e(silu(gate_e x) * up_e x), plus `addend` [T, D] if given (added in fp32 by the combine);
    gate_up [E_local, 2I, D] (gate rows first), down [E_local, D, I]. The grouped GEMMs: any batch, graph-safe."""
    return _grouped(x, gate_up, down, ids, weights, expert_offset, addend, wgmma=False)


def moe_experts_wgmma(x: cp.ndarray, gate_up: cp.ndarray, down: cp.ndarray, ids: cp.ndarray, weights: cp.ndarray,
                      expert_offset: int, addend: cp.ndarray | Beside | None = None) -> cp.ndarray:
    """moe_experts with the 128-row tiles of prefill-sized batches on warpgroup MMA (moe_wgmma.cu, sm_90 only)."""
    return _grouped(x, gate_up, down, ids, weights, expert_offset, addend, wgmma=True)


def wgmma_smem() -> int:
    """moe_wgmma.cu's dynamic shared memory: MW_STAGES stages of 128 A and 128 W rows of 64 bf16, plus 1024 bytes
    to align the base to the swizzle's 1024-byte pattern."""
    return MW_STAGES * 2 * MW_BM * MW_BK * 2 + 1024


def _grouped(x: cp.ndarray, gate_up: cp.ndarray, down: cp.ndarray, ids: cp.ndarray, weights: cp.ndarray,
             expert_offset: int, addend: cp.ndarray | Beside | None, wgmma: bool) -> cp.ndarray:
    a = expert_args(x, gate_up, down, ids, weights, addend)
    if a.T == 0:
        return a.y
    T, D, E, I, k = a.T, a.D, a.E, a.I, a.k
    x2, xs = _aligned_rows(x)
    pairs = T * k
    mt = 8 if pairs >= WIDE_ROWS_PER_EXPERT * E else 1
    g = align_tiles(a.ids, E, expert_offset, mt)
    tiles, grouping = g.tiles, (g.sorted, np.int32(k))
    h = cp.empty((pairs, I), dtype=BF16)
    y_pairs = cp.empty((pairs, D), dtype=cp.float32)
    gate_up_args = (x2, np.int64(xs), *grouping, gate_up, np.int64(2 * I * D), np.int32(I), np.int32(D),
                    *g.tile_args, h, np.int64(I))
    down_args = (h, np.int64(I), *grouping, down, np.int64(D * I), np.int32(D), np.int32(I), *g.tile_args,
                 a.weights, y_pairs, np.int64(D))
    if mt == 8 and wgmma:
        launch("moe_wgmma", "moe_gate_up_bf16_wgmma", (-(-I // (MW_BN // 2)), tiles), MW_THREADS, gate_up_args,
               wgmma_smem())
        launch("moe_wgmma", "moe_down_bf16_wgmma", (-(-D // MW_BN), tiles), MW_THREADS, down_args, wgmma_smem())
    else:
        stages = gemm_stages(mt, T)
        gemm = f"m{mt}" if stages == GEMM_STAGES else f"m{mt}_s{stages}"   # moe.cu's kernel of these tiles and stages
        smem = gemm_smem(mt, stages=stages)
        launch("moe", f"moe_gate_up_bf16_{gemm}", (-(-I // (GEMM_BN // 2)), tiles), GEMM_THREADS, gate_up_args, smem)
        launch("moe", f"moe_down_bf16_{gemm}", (-(-D // GEMM_BN), tiles), GEMM_THREADS, down_args, smem)
    return combine(y_pairs, a.ids, E, expert_offset, a.addend, a.y)


def align_tiles(ids: cp.ndarray, E: int, expert_offset: int, mt: int) -> Grouping:
    """`align` for the grouped GEMMs' row tiles of 16 * mt rows, sized for the most tiles any routing gives."""
    return align(ids, E, expert_offset, 16 * mt, row_tiles(ids.size, E, mt))


def packed_addend(addend: cp.ndarray | Beside, y: cp.ndarray) -> cp.ndarray | Beside:
    """moe_experts' addend as packed rows of y's shape and dtype (the combine kernels read it at row stride D); one
    still computing beside (packed already) stays so, for the combine to join."""
    if addend.shape != y.shape or addend.dtype != y.dtype:
        raise ValueError(f"moe_experts: the addend must be {y.dtype} {y.shape} like the output (got {addend.dtype} "
                         f"{addend.shape})")
    if isinstance(addend, Beside) and addend.value.flags.c_contiguous:
        return addend
    return cp.ascontiguousarray(ready(addend))
