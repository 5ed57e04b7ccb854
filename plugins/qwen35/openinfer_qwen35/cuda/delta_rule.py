"""Launchers of the gated delta rule: the chunked prefill (delta_rule_chunk.cu) and the one-token decode
step (delta_rule.cu), with the q/k L2 norm, the dk^-0.5 scale and the value-head -> key-head mapping fused in.

Device reads: `batch.state_slots`, `batch.query_start` and `batch.context_lens` (a sequence's
state row is live iff context_lens[i] > query_start[i+1] - query_start[i]). On the host the decode
step uses only `batch.num_seqs` (the grid, so it captures into a CUDA graph); the prefill (eager)
also sizes its chunk grid and scratch by `batch.max_query_len` and the token count, and each block
finds its run's bounds on the device.
"""
from __future__ import annotations

from pathlib import Path

import cupy as cp
import numpy as np

from openinfer.plugin_api import ForwardBatch
from openinfer.plugin_api.cuda import NULL, as_index, blas, heads3d, launch, rows2d, suffix

SOURCE = Path(__file__).with_name("delta_rule.cu")
CHUNK_SOURCE = Path(__file__).with_name("delta_rule_chunk.cu")
DK_MAX, BV, CHUNK, CHUNK_THREADS, DECODE_THREADS = 128, 32, 64, 256, 128   # must match gdn.cuh and the two .cu
STATE_THREADS = 32 * 16   # gdn_chunk_state's block: TC_WARPS warps
# gdn_chunk_state: W, Qg rows padded to 132 floats, Kt to 136, P to 68, S and V' to 40
STATE_SMEM = 4 * (2 * CHUNK * (DK_MAX + 4) + CHUNK * (DK_MAX + 8) + CHUNK * (CHUNK + 4) + (DK_MAX + CHUNK) * (BV + 8))
NORM_TILES_MAX = 8   # gdn_decode_gated_norm: a head's column tiles in one cluster (the portable size): dv <= 256


def prep_smem(dv: int, itemsize: int) -> int:
    """gdn_chunk_prep's shared memory: Q, K (rows padded to DK_MAX + 4 floats), A (CHUNK + 4), gamma, beta, tail,
    then the chunk's v rows as stored (CHUNK x dv of `itemsize` bytes)."""
    return 4 * (2 * CHUNK * (DK_MAX + 4) + CHUNK * (CHUNK + 4) + 3 * CHUNK) + CHUNK * dv * itemsize


def record_floats(dv: int) -> int:
    """Floats of one (chunk, value head) record of the prefill scratch (Rec in delta_rule_chunk.cu)."""
    return 3 * CHUNK * DK_MAX + CHUNK * CHUNK + CHUNK * dv + 4


def checkpoint_args(batch: ForwardBatch) -> tuple:
    """(checkpoint_lens, checkpoint_rows) for the prefill kernels: null pointers when no run saves
    its state part-way (kv/hybrid.py)."""
    if batch.checkpoint_lens is None:
        return NULL, NULL
    return as_index(batch.checkpoint_lens, np.int32), as_index(batch.checkpoint_rows, np.int32)


def _gates(g, beta) -> tuple:
    return cp.ascontiguousarray(g, dtype=cp.float32), cp.ascontiguousarray(beta, dtype=cp.float32)


def _args(q, k, v, gates: tuple, state, batch: ForwardBatch) -> tuple[tuple, tuple[int, int, int], cp.ndarray]:
    """The kernels' shared argument list (`gates`: the arguments that give each token's g and beta), the grid for
    the batch's B sequences, and the output."""
    nk, dk = q.shape[1:]
    nv, dv = v.shape[1:]
    if dk > DK_MAX or nv % nk or k.shape != q.shape or q.dtype != v.dtype or k.dtype != v.dtype:
        raise ValueError(f"gated delta rule: q {q.shape} {q.dtype}, k {k.shape} {k.dtype}, v {v.shape} {v.dtype} "
                         f"(need dk <= {DK_MAX}, nv a multiple of nk, one dtype)")
    if state.dtype != np.float32 or state.shape[1:] != (nv, dk, dv) or \
            state.strides[1:] != (dk * dv * 4, dv * 4, 4):
        raise ValueError(f"gated delta rule: state must be float32 [R, {nv}, {dk}, {dv}], packed inside a row "
                         f"(got {state.dtype} {state.shape}, strides {state.strides})")
    q3, qs = heads3d(q)
    k3, ks = heads3d(k)
    v3, vs = heads3d(v)
    out = cp.empty(v.shape, dtype=v.dtype)
    args = (q3, np.int64(qs), k3, np.int64(ks), v3, np.int64(vs), *gates, state, np.int64(state.strides[0] // 4),
            as_index(batch.state_slots, np.int32),
            as_index(batch.query_start, np.int32), as_index(batch.context_lens, np.int32), out,
            np.int32(nk), np.int32(nv), np.int32(dk), np.int32(dv))
    return args, ((dv + BV - 1) // BV, nv, batch.num_seqs), out


def qwen35_gated_delta_rule(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, g: cp.ndarray, beta: cp.ndarray,
                            state: cp.ndarray, batch: ForwardBatch) -> cp.ndarray:
    """Every sequence's run (any length) in chunks of 64 tokens (restarted at a checkpoint, whose
    state also goes to its row: delta_rule_chunk.cu). gdn_chunk_prep does every chunk's
    state-free part at once (grid: the longest run's chunks x value heads x sequences) into a
    scratch record per (chunk, head); then one gdn_chunk_state block per (32 state columns, value
    head, sequence) carries the state tile through its run's chunks. Eager only: the grid and the
    scratch size come from the batch's host fields.

    q, k [T, nk, dk], v [T, nv, dv] (bf16 or f32, heads packed, any token stride); g, beta [T, nv]
    float32; state [R, nv, dk, dv] float32 (any row stride), read where live and written for every
    sequence with tokens. Returns o [T, nv, dv] in v's dtype."""
    args, grid, out = _args(q, k, v, _gates(g, beta), state, batch)
    T, B = v.shape[0], batch.num_seqs
    if T:
        (q3, qs, k3, ks, v3, vs, g32, b32, state, state_stride, slots, query_start, ctx, out, nk, nv, dk, dv) = args
        ck_lens, ck_rows = checkpoint_args(batch)
        m = 1 if batch.checkpoint_lens is None else 2   # a checkpoint splits a run: one more chunk at most
        # a record per (chunk, head); run b's chunk c is record m b + s_b // 64 + c: T // 64 + m B cover all
        scratch = cp.empty((T // CHUNK + m * B) * int(nv) * record_floats(int(dv)), dtype=cp.float32)
        sfx = suffix(v.dtype)
        launch(CHUNK_SOURCE, f"gdn_chunk_prep_{sfx}", (-(-batch.max_query_len // CHUNK) + m - 1, int(nv), B),
               CHUNK_THREADS, (q3, qs, k3, ks, v3, vs, g32, b32, query_start, ck_lens, scratch, nk, nv, dk, dv),
               prep_smem(int(dv), v.dtype.itemsize))
        launch(CHUNK_SOURCE, f"gdn_chunk_state_{sfx}", grid, STATE_THREADS,
               (scratch, state, state_stride, slots, query_start, ctx, ck_lens, ck_rows, out, nv, dk, dv), STATE_SMEM)
    return out


def qwen35_gated_delta_rule_update(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, g: cp.ndarray, beta: cp.ndarray,
                                   state: cp.ndarray, batch: ForwardBatch) -> cp.ndarray:
    """The decode step (every run one token: row i of q, k, v, g, beta is sequence i's token).
    The grid depends only on the batch size and nothing is allocated but the output, so it
    captures into a CUDA graph. Same arrays and returns as `qwen35_gated_delta_rule`."""
    args, grid, out = _args(q, k, v, _gates(g, beta), state, batch)
    if v.shape[0]:
        launch(SOURCE, f"gdn_decode_{suffix(v.dtype)}", grid, DECODE_THREADS, args)
    return out


def qwen35_gdn_decode(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, a: cp.ndarray, b: cp.ndarray, A_log: cp.ndarray,
                      dt_bias: cp.ndarray, state: cp.ndarray, batch: ForwardBatch) -> cp.ndarray:
    """`qwen35_gated_delta_rule_update` computing its own gating from a, b [B, nv] (any row strides, v's dtype) and
    A_log, dt_bias [nv] float32, bit for bit as qwen35_gdn_gating does (gdn.cuh's gdn_gate): one launch a layer."""
    args, grid, out = _args(q, k, v, _ab_gates(v, a, b, A_log, dt_bias), state, batch)
    if v.shape[0]:
        launch(SOURCE, f"gdn_decode_gated_{suffix(v.dtype)}", grid, DECODE_THREADS, args)
    return out


def _ab_gates(v: cp.ndarray, a: cp.ndarray, b: cp.ndarray, A_log: cp.ndarray, dt_bias: cp.ndarray) -> tuple:
    """The arguments of gdn_decode_gated* that give each sequence's g and beta (GatesFromAB in delta_rule.cu)."""
    a2, a_stride = rows2d(a)
    b2, b_stride = rows2d(b)
    if a.dtype != v.dtype or b.dtype != v.dtype or a.shape != b.shape or a.shape != (v.shape[0], v.shape[1]):
        raise ValueError(f"gdn decode: a {a.shape} {a.dtype} and b {b.shape} {b.dtype} must be [B, nv] of v's dtype "
                         f"(v {v.shape} {v.dtype})")
    return (a2, np.int64(a_stride), b2, np.int64(b_stride), cp.ascontiguousarray(A_log, dtype=cp.float32),
            cp.ascontiguousarray(dt_bias, dtype=cp.float32))


def norm_fold_applies(dv: int) -> bool:
    """gdn_decode_gated_norm runs a head's ceil(dv / 32) column tiles as one thread-block cluster: sm_90+ and
    dv <= 256 (a single tile, dv <= 32, launches without one, but the kernel uses cluster instructions all the same)."""
    return -(-dv // BV) <= NORM_TILES_MAX and blas.clusters_supported()


def gdn_decode_norm(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, a: cp.ndarray, b: cp.ndarray, A_log: cp.ndarray,
                    dt_bias: cp.ndarray, state: cp.ndarray, batch: ForwardBatch, z: cp.ndarray, w: cp.ndarray,
                    eps: float) -> cp.ndarray | None:
    """`qwen35_gdn_decode` with the GDN output norm folded in: rms_norm(o) * w * silu(z) over each head's dv values,
    bit for bit what qwen35_gated_rms_norm makes of qwen35_gdn_decode's output, in one launch (gdn_decode_gated_norm:
    the grid of gdn_decode_gated in clusters of a head's ceil(dv / 32) column tiles, each of which reads the head's
    dv values over distributed shared memory for the sum of squares). z [B, nv, dv] (heads packed, any token
    stride) and w [dv] in v's dtype. None where `norm_fold_applies` does not (ops.py then runs the two launches).
    The grid depends only on the batch size and nothing is allocated but the output, so it captures into a CUDA
    graph."""
    dv = v.shape[2]
    if z.dtype != v.dtype or w.dtype != v.dtype:
        raise TypeError(f"gdn decode norm: z {z.dtype} and w {w.dtype} must be v's dtype {v.dtype}")
    if z.shape != v.shape or w.shape != (dv,):
        raise ValueError(f"gdn decode norm: z {z.shape} must be v's shape {v.shape}, w {w.shape} [{dv}]")
    if not norm_fold_applies(dv):
        return None
    args, grid, out = _args(q, k, v, _ab_gates(v, a, b, A_log, dt_bias), state, batch)
    head, tail = args[:-5], args[-5:]   # tail: the output, nk, nv, dk, dv; z and w go before it, eps after
    z3, zs = heads3d(z)
    args = (*head, z3, np.int64(zs), cp.ascontiguousarray(w), *tail, np.float32(eps))
    if v.shape[0]:
        launch(SOURCE, f"gdn_decode_gated_norm_{suffix(v.dtype)}", grid, DECODE_THREADS, args,
               cluster=(grid[0], 1, 1) if grid[0] > 1 else None)
    return out
