"""Launchers of the gated delta rule (delta_rule.cu): the chunked prefill and the one-token decode
step, with the q/k L2 norm, the dk^-0.5 scale and the value-head -> key-head mapping fused in.

Device reads: `batch.state_slots`, `batch.query_start` and `batch.context_lens` (a sequence's
state row is live iff context_lens[i] > query_start[i+1] - query_start[i]). On the host only
`batch.num_seqs` (the grid): each prefill block finds its run's length on the device.
"""
from __future__ import annotations

from pathlib import Path

import cupy as cp
import numpy as np

from openinfer.batch import ForwardBatch
from openinfer.kernels.cuda.module import as_index, heads3d, launch, suffix

SOURCE = Path(__file__).with_name("delta_rule.cu")
DK_MAX, BV, CHUNK, CHUNK_THREADS, DECODE_THREADS = 128, 32, 64, 256, 128   # must match delta_rule.cu


def chunk_smem(dk: int) -> int:
    """Bytes of dynamic shared memory of gdn_chunk (ChunkSmem in delta_rule.cu)."""
    L = CHUNK
    return 4 * (3 * L * (dk + 1) + dk * (BV + 1) + L * (BV + 1) + 2 * L * (L + 1) + 3 * L)


def _args(q, k, v, g, beta, state, batch: ForwardBatch) -> tuple[tuple, tuple[int, int, int], cp.ndarray]:
    """The kernels' shared argument list, the grid for the batch's B sequences, and the output."""
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
    args = (q3, np.int64(qs), k3, np.int64(ks), v3, np.int64(vs),
            cp.ascontiguousarray(g, dtype=cp.float32), cp.ascontiguousarray(beta, dtype=cp.float32),
            state, np.int64(state.strides[0] // 4), as_index(batch.state_slots, np.int32),
            as_index(batch.query_start, np.int32), as_index(batch.context_lens, np.int32), out,
            np.int32(nk), np.int32(nv), np.int32(dk), np.int32(dv))
    return args, ((dv + BV - 1) // BV, nv, batch.num_seqs), out


def qwen35_gated_delta_rule(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, g: cp.ndarray, beta: cp.ndarray,
                            state: cp.ndarray, batch: ForwardBatch) -> cp.ndarray:
    """Every sequence's run (any length) in chunks of 64 tokens; one block per (32 state columns,
    value head, sequence) carries the state tile through its run's chunks.

    q, k [T, nk, dk], v [T, nv, dv] (bf16 or f32, heads packed, any token stride); g, beta [T, nv]
    float32; state [R, nv, dk, dv] float32 (any row stride), read where live and written for every
    sequence with tokens. Returns o [T, nv, dv] in v's dtype."""
    args, grid, out = _args(q, k, v, g, beta, state, batch)
    if v.shape[0]:
        dk = q.shape[2]
        launch(SOURCE, f"gdn_chunk_{suffix(v.dtype)}", grid, CHUNK_THREADS, args, chunk_smem(dk))
    return out


def qwen35_gated_delta_rule_update(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, g: cp.ndarray, beta: cp.ndarray,
                                   state: cp.ndarray, batch: ForwardBatch) -> cp.ndarray:
    """The decode step (every run one token: row i of q, k, v, g, beta is sequence i's token).
    The grid depends only on the batch size and nothing is allocated but the output, so it
    captures into a CUDA graph. Same arrays and returns as `qwen35_gated_delta_rule`."""
    args, grid, out = _args(q, k, v, g, beta, state, batch)
    if v.shape[0]:
        launch(SOURCE, f"gdn_decode_{suffix(v.dtype)}", grid, DECODE_THREADS, args)
    return out
