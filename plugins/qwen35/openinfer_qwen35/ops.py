"""numpy reference ops of the Qwen3.5 line: Gated DeltaNet (causal conv, gating, gated delta rule,
gated norm) and the attention output gate. Registered as `qwen35_*` through `register_kernels`.

They are the CPU implementation and the specification a CUDA kernel is tested against, so they
favour clarity. All work on the flat varlen batch (ForwardBatch): T tokens of B sequences,
sequence i owns rows query_start[i]:query_start[i+1] and state row state_slots[i]. A sequence
whose run starts at position 0 (context_len == run length) starts from a zero state: its row
may still hold an earlier request's state, so nothing has to clear it. A prefill run may also save
its state part-way (batch.checkpoint_lens/_rows, kv/hybrid.py): the state after its first
checkpoint_lens[i] tokens goes to row checkpoint_rows[i] as well.
Shapes: C conv channels (2·nk·dk + nv·dv), K conv width, nk/nv key/value heads, dk/dv head dims,
R state rows. States are float32 on every backend; compute here is float32.
"""
from __future__ import annotations

import numpy as np

from openinfer.plugin_api import ForwardBatch


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _has_state(batch: ForwardBatch) -> np.ndarray:
    """[B] bool: the sequence has tokens before this run, so its state row is live."""
    return batch.context_lens_host > np.diff(batch.query_start_host)


def _has_state_decode(batch: ForwardBatch) -> np.ndarray:
    """`_has_state` of a one-token-per-run batch from the device fields alone: a decode batch may
    be a CUDA graph's, whose host fields are placeholders (openinfer.engine.batch)."""
    return np.asarray(batch.context_lens) > 1


def _checkpoints(batch: ForwardBatch) -> dict[int, tuple[int, int]]:
    """{sequence: (tokens of its run before the save, state row)} of the runs that save their state part-way."""
    if batch.checkpoint_lens is None:
        return {}
    return {i: (int(n), int(row)) for i, (n, row) in
            enumerate(zip(np.asarray(batch.checkpoint_lens), np.asarray(batch.checkpoint_rows))) if n > 0}


def qwen35_causal_conv1d(x: np.ndarray, weight: np.ndarray, conv_state: np.ndarray, batch: ForwardBatch) -> np.ndarray:
    """silu(causal depthwise conv1d) over each sequence's run of any length.

    x [T, C] conv inputs; weight [C, K]; conv_state [R, K-1, C], the last K-1 inputs before the
    run (time-major), replaced in place by the last K-1 inputs up to the run's end (and a
    checkpoint row by those up to its save point).
    out[t, c] = silu(sum_j weight[c, j] * input[t - K + 1 + j, c]), inputs before position 0 = 0.
    Returns [T, C] float32.
    """
    K = weight.shape[1]
    out = np.empty(x.shape, dtype=np.float32)
    qs, live, saves = batch.query_start_host, _has_state(batch), _checkpoints(batch)
    for i, slot in enumerate(np.asarray(batch.state_slots)):
        s, e = int(qs[i]), int(qs[i + 1])
        n = e - s
        if n == 0:
            continue
        prev = conv_state[slot] if live[i] else np.zeros((K - 1, x.shape[1]), dtype=np.float32)
        window = np.concatenate([prev, x[s:e]], axis=0)          # [K - 1 + n, C]
        out[s:e] = sum(window[j:j + n] * weight[:, j] for j in range(K))
        if i in saves:
            at, row = saves[i]
            conv_state[row] = window[at:at + K - 1]
        conv_state[slot] = window[n:]
    return _silu(out)


def qwen35_causal_conv1d_update(x: np.ndarray, weight: np.ndarray, conv_state: np.ndarray,
                                batch: ForwardBatch) -> np.ndarray:
    """The one-token step of `qwen35_causal_conv1d` for a batch where every run is one token:
    x [B, C] -> [B, C]; conv_state [R, K-1, C] shifted in place."""
    slots = np.asarray(batch.state_slots)
    prev = np.where(_has_state_decode(batch)[:, None, None], conv_state[slots], np.float32(0))
    window = np.concatenate([prev, x[:, None, :]], axis=1)      # [B, K, C]
    conv_state[slots] = window[:, 1:]
    return _silu(np.einsum("bkc,ck->bc", window, weight))


def qwen35_gdn_gating(a: np.ndarray, b: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """a, b [T, nv] (in_proj_a / in_proj_b outputs); A_log, dt_bias [nv] float32.
    Returns (g, beta) [T, nv] float32: g = -exp(A_log) * softplus(a + dt_bias) (log-decay <= 0),
    beta = sigmoid(b)."""
    g = -np.exp(A_log.astype(np.float32)) * np.logaddexp(np.float32(0), a.astype(np.float32) + dt_bias)
    beta = 1.0 / (1.0 + np.exp(-b.astype(np.float32)))
    return g.astype(np.float32), beta.astype(np.float32)


def _prepare_qk(q: np.ndarray, k: np.ndarray, nv: int) -> tuple[np.ndarray, np.ndarray]:
    """L2-normalise q and k per head (eps 1e-6), scale q by dk^-0.5, and give value head j its
    key head j // (nv / nk) (repeat_interleave, not tiling): [.., nk, dk] -> [.., nv, dk]."""
    def l2(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float32)
        return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(1e-6))
    rep = nv // q.shape[-2]
    q = l2(q) * np.float32(q.shape[-1] ** -0.5)
    return np.repeat(q, rep, axis=-2), np.repeat(l2(k), rep, axis=-2)


def _delta_step(S: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray
                ) -> np.ndarray:
    """One token on states S [.., nv, dk, dv] (in place); q, k [.., nv, dk], v [.., nv, dv],
    g, beta [.., nv]. Returns o [.., nv, dv]."""
    S *= np.exp(g)[..., None, None]
    delta = beta[..., None] * (v - np.einsum("...hk,...hkv->...hv", k, S))   # reads the decayed state
    S += k[..., :, None] * delta[..., None, :]
    return np.einsum("...hk,...hkv->...hv", q, S)                            # includes this token


def qwen35_gated_delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                            state: np.ndarray, batch: ForwardBatch) -> np.ndarray:
    """The gated delta rule over each sequence's run (prefill chunks; any run length).

    q, k [T, nk, dk] (post-conv, not yet normalised); v [T, nv, dv]; g, beta [T, nv] float32
    (qwen35_gdn_gating); state [R, nv, dk, dv] float32, read (if the sequence has tokens
    before the run) and replaced in place (a checkpoint row: by the state at its save point). Per token, per value head:
        S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
    Returns o [T, nv, dv] float32.
    """
    nv = v.shape[1]
    qn, kn = _prepare_qk(q, k, nv)
    v = v.astype(np.float32)
    out = np.empty(v.shape, dtype=np.float32)
    qs, live, saves = batch.query_start_host, _has_state(batch), _checkpoints(batch)
    for i, slot in enumerate(np.asarray(batch.state_slots)):
        s, e = int(qs[i]), int(qs[i + 1])
        if e == s:
            continue
        S = state[slot].copy() if live[i] else np.zeros(state.shape[1:], dtype=np.float32)
        at, row = saves.get(i, (0, 0))
        for t in range(s, e):
            out[t] = _delta_step(S, qn[t], kn[t], v[t], g[t], beta[t])
            if t + 1 - s == at:
                state[row] = S
        state[slot] = S
    return out


def qwen35_gated_delta_rule_update(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                                   state: np.ndarray, batch: ForwardBatch) -> np.ndarray:
    """The one-token step of `qwen35_gated_delta_rule` for a batch where every run is one
    token (decode): q, k [B, nk, dk], v [B, nv, dv], g, beta [B, nv] -> o [B, nv, dv]."""
    slots = np.asarray(batch.state_slots)
    qn, kn = _prepare_qk(q, k, v.shape[1])
    S = np.where(_has_state_decode(batch)[:, None, None, None], state[slots], np.float32(0))
    out = _delta_step(S, qn, kn, v.astype(np.float32), g, beta)
    state[slots] = S
    return out


def qwen35_gdn_decode(q: np.ndarray, k: np.ndarray, v: np.ndarray, a: np.ndarray, b: np.ndarray, A_log: np.ndarray,
                      dt_bias: np.ndarray, state: np.ndarray, batch: ForwardBatch) -> np.ndarray:
    """The decode step with its own gating: `qwen35_gated_delta_rule_update` of `qwen35_gdn_gating(a, b, ...)`
    (one launch on GPUs). a, b [B, nv] (in_proj_a / in_proj_b outputs)."""
    g, beta = qwen35_gdn_gating(a, b, A_log, dt_bias)
    return qwen35_gated_delta_rule_update(q, k, v, g, beta, state, batch)


def qwen35_gated_rms_norm(x: np.ndarray, z: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The GDN output norm: rms_norm(x) * w * silu(z) over the last axis (plain w, not 1 + w).
    x, z [T, nv, dv]; w [dv]."""
    x = x.astype(np.float32)
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + np.float32(eps)) * w * _silu(z.astype(np.float32))


def qwen35_gdn_decode_norm(q: np.ndarray, k: np.ndarray, v: np.ndarray, a: np.ndarray, b: np.ndarray,
                           A_log: np.ndarray, dt_bias: np.ndarray, state: np.ndarray, batch: ForwardBatch,
                           z: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The decode step with the GDN output norm after it: `qwen35_gated_rms_norm(qwen35_gdn_decode(...), z, w, eps)`
    (one launch on GPUs with thread-block clusters). z [B, nv, dv]; w [dv]."""
    return qwen35_gated_rms_norm(qwen35_gdn_decode(q, k, v, a, b, A_log, dt_bias, state, batch), z, w, eps)


def qwen35_sigmoid_gate(x: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """The gated-attention output gate: x * sigmoid(gate), both [T, nh * d] (before o_proj)."""
    return x / (1.0 + np.exp(-gate))


OPS = ("qwen35_causal_conv1d", "qwen35_causal_conv1d_update", "qwen35_gdn_gating", "qwen35_gdn_decode",
       "qwen35_gdn_decode_norm", "qwen35_gated_delta_rule", "qwen35_gated_delta_rule_update", "qwen35_gated_rms_norm",
       "qwen35_sigmoid_gate")
