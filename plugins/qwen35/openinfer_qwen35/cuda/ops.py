"""CUDA implementations of the qwen35_* ops: the numpy reference signatures (../ops.py) on CuPy
arrays, bf16 or f32 activations, float32 states. Outputs keep the activation dtype, except the
gating's g and beta (float32). The delta rule's launchers live in delta_rule.py.

ForwardBatch fields read on the device: state_slots, query_start, context_lens (a sequence's state
row is live iff context_lens[i] > query_start[i+1] - query_start[i]). On the host: num_seqs, and
max_query_len for the prefill conv's grid. The one-token ops use grids of the batch size only and
allocate only their outputs, so they capture into CUDA graphs.
"""
from __future__ import annotations

from pathlib import Path

import cupy as cp
import numpy as np

from openinfer.plugin_api import ForwardBatch
from openinfer.plugin_api.cuda import NULL, as_index, heads3d, launch, rows2d, suffix

from .delta_rule import (checkpoint_args, gdn_decode_norm, qwen35_gated_delta_rule, qwen35_gated_delta_rule_update,
                         qwen35_gdn_decode)

__all__ = ["qwen35_causal_conv1d", "qwen35_causal_conv1d_update", "qwen35_gdn_gating", "qwen35_gdn_decode",
           "qwen35_gdn_decode_norm", "qwen35_gated_delta_rule", "qwen35_gated_delta_rule_update",
           "qwen35_gated_rms_norm", "qwen35_sigmoid_gate"]

CONV, GATES = Path(__file__).with_name("conv.cu"), Path(__file__).with_name("gates.cu")
CONV_K, CONV_TOK, THREADS = 4, 16, 128   # CONV_K and CONV_TOK must match conv.cu
GATED_NORM_MAX_D = 32 * 8                 # gates.cu: 32 lanes x GN_PER_LANE


def _conv_args(x: cp.ndarray, weight: cp.ndarray, conv_state: cp.ndarray) -> tuple[cp.ndarray, int, cp.ndarray]:
    C = x.shape[1]
    if weight.shape != (C, CONV_K) or weight.dtype != x.dtype:
        raise ValueError(f"causal conv1d: weight {weight.shape} {weight.dtype} for x {x.shape} {x.dtype} "
                         f"(kernels are compiled for width {CONV_K})")
    if conv_state.dtype != np.float32 or conv_state.shape[1:] != (CONV_K - 1, C) or \
            conv_state.strides[1:] != (C * 4, 4):
        raise ValueError(f"causal conv1d: conv_state must be float32 [R, {CONV_K - 1}, {C}], packed inside a row "
                         f"(got {conv_state.dtype} {conv_state.shape}, strides {conv_state.strides})")
    x2, stride = rows2d(x)
    return x2, stride, cp.ascontiguousarray(weight)


def _seq_index(batch: ForwardBatch) -> tuple[cp.ndarray, cp.ndarray, cp.ndarray]:
    return (as_index(batch.state_slots, np.int32), as_index(batch.query_start, np.int32),
            as_index(batch.context_lens, np.int32))


def qwen35_causal_conv1d(x: cp.ndarray, weight: cp.ndarray, conv_state: cp.ndarray, batch: ForwardBatch
                         ) -> cp.ndarray:
    """silu(causal depthwise conv1d) over each run. x [T, C] (any row stride), weight [C, 4];
    conv_state [R, 3, C] float32, replaced in place for every sequence with tokens. Two launches:
    the conv (reading the old rows), then the state save; a batch with checkpoints part-way through
    runs saves those first (from the old rows too)."""
    x2, stride, w = _conv_args(x, weight, conv_state)
    T, C = x.shape
    out = cp.empty((T, C), dtype=x.dtype)
    B = batch.num_seqs
    if T == 0 or B == 0:
        return out
    slots, qs, ctx = _seq_index(batch)
    sfx, cblocks, state_stride = suffix(x.dtype), (C + THREADS - 1) // THREADS, np.int64(conv_state.strides[0] // 4)
    launch(CONV, f"conv_prefill_{sfx}", (cblocks, (batch.max_query_len + CONV_TOK - 1) // CONV_TOK, B), THREADS,
           (x2, np.int64(stride), w, conv_state, state_stride, slots, qs, ctx, out, np.int32(C)))
    if batch.checkpoint_lens is not None:
        ck_lens, ck_rows = checkpoint_args(batch)
        launch(CONV, f"conv_state_save_{sfx}", (cblocks, B), THREADS,
               (x2, np.int64(stride), conv_state, state_stride, slots, qs, ctx, ck_lens, ck_rows, np.int32(C)))
    launch(CONV, f"conv_state_save_{sfx}", (cblocks, B), THREADS,
           (x2, np.int64(stride), conv_state, state_stride, slots, qs, ctx, NULL, NULL, np.int32(C)))
    return out


def qwen35_causal_conv1d_update(x: cp.ndarray, weight: cp.ndarray, conv_state: cp.ndarray,
                                batch: ForwardBatch) -> cp.ndarray:
    """The decode step: x [B, C] (row i is sequence i's one token) -> [B, C]; conv_state shifted in place."""
    x2, stride, w = _conv_args(x, weight, conv_state)
    B, C = x.shape
    out = cp.empty((B, C), dtype=x.dtype)
    if B:
        slots, qs, ctx = _seq_index(batch)
        launch(CONV, f"conv_update_{suffix(x.dtype)}", ((C + THREADS - 1) // THREADS, B), THREADS,
               (x2, np.int64(stride), w, conv_state, np.int64(conv_state.strides[0] // 4), slots, qs, ctx, out,
                np.int32(C)))
    return out


def qwen35_gdn_gating(a: cp.ndarray, b: cp.ndarray, A_log: cp.ndarray, dt_bias: cp.ndarray
                      ) -> tuple[cp.ndarray, cp.ndarray]:
    """a, b [T, nv] (any row strides, one dtype); A_log, dt_bias [nv] float32 -> g, beta [T, nv] float32."""
    a2, a_stride = rows2d(a)
    b2, b_stride = rows2d(b)
    if a.dtype != b.dtype:
        raise TypeError(f"gdn gating: a {a.dtype} and b {b.dtype} differ")
    T, nv = a.shape
    g, beta = cp.empty((T, nv), dtype=cp.float32), cp.empty((T, nv), dtype=cp.float32)
    if T * nv:
        launch(GATES, f"gdn_gating_{suffix(a.dtype)}", ((T * nv + 255) // 256,), 256,
               (a2, np.int64(a_stride), b2, np.int64(b_stride), cp.ascontiguousarray(A_log, dtype=cp.float32),
                cp.ascontiguousarray(dt_bias, dtype=cp.float32), g, beta, np.int32(T), np.int32(nv)))
    return g, beta


def _check_norm_head(d: int) -> None:
    if d > GATED_NORM_MAX_D:
        raise ValueError(f"gated rms norm: head dim {d} is over {GATED_NORM_MAX_D} (gates.cu's GN_PER_LANE)")


def qwen35_gated_rms_norm(x: cp.ndarray, z: cp.ndarray, w: cp.ndarray, eps: float) -> cp.ndarray:
    """rms_norm(x) * w * silu(z) per head: x, z [T, nv, dv] (heads packed, any token stride), w [dv]."""
    if not x.dtype == z.dtype == w.dtype:
        raise TypeError(f"gated rms norm: x {x.dtype}, z {z.dtype} and w {w.dtype} must share a dtype")
    x3, xs = heads3d(x)
    z3, zs = heads3d(z)
    T, nh, d = x.shape
    _check_norm_head(d)
    out = cp.empty(x.shape, dtype=x.dtype)
    if T * nh:
        launch(GATES, f"gated_rms_norm_{suffix(x.dtype)}", ((T * nh + 3) // 4,), THREADS,
               (x3, np.int64(xs), z3, np.int64(zs), cp.ascontiguousarray(w), out, np.int32(T * nh), np.int32(nh),
                np.int32(d), np.float32(eps)))
    return out


def qwen35_gdn_decode_norm(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, a: cp.ndarray, b: cp.ndarray,
                           A_log: cp.ndarray, dt_bias: cp.ndarray, state: cp.ndarray, batch: ForwardBatch,
                           z: cp.ndarray, w: cp.ndarray, eps: float) -> cp.ndarray:
    """qwen35_gated_rms_norm(qwen35_gdn_decode(q, k, v, a, b, A_log, dt_bias, state, batch), z, w, eps), the same
    bits: one launch where the device has thread-block clusters (sm_90+) and dv <= 256 (delta_rule.gdn_decode_norm),
    else those two launches."""
    _check_norm_head(v.shape[2])
    out = gdn_decode_norm(q, k, v, a, b, A_log, dt_bias, state, batch, z, w, eps)
    if out is None:
        out = qwen35_gated_rms_norm(qwen35_gdn_decode(q, k, v, a, b, A_log, dt_bias, state, batch), z, w, eps)
    return out


def qwen35_sigmoid_gate(x: cp.ndarray, gate: cp.ndarray) -> cp.ndarray:
    """x * sigmoid(gate), both [T, n] (any row strides, one dtype)."""
    if x.dtype != gate.dtype:
        raise TypeError(f"sigmoid gate: x {x.dtype} and gate {gate.dtype} differ")
    x2, xs = rows2d(x)
    g2, gs = rows2d(gate)
    T, n = x.shape
    out = cp.empty((T, n), dtype=x.dtype)
    if T and n:
        launch(GATES, f"sigmoid_gate_{suffix(x.dtype)}", (T, min((n + 255) // 256, 64)), 256,
               (x2, np.int64(xs), g2, np.int64(gs), out, np.int32(n)))
    return out
