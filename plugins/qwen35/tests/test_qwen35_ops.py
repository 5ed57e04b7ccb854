"""The qwen35_* numpy ops on their own (the reference a CUDA kernel will be tested against):
varlen runs over state rows equal one whole run, the one-token ops equal length-1 runs, fresh
sequences ignore stale rows, and the gated delta rule equals its chunked (WY) form."""
from __future__ import annotations

import numpy as np

from openinfer.plugin_api import ForwardBatch
from openinfer_qwen35 import ops

RNG = np.random.default_rng(0)
C, K, NK, NV, DK, DV, ROWS = 12, 4, 2, 4, 8, 8, 6


def batch(runs: list[tuple[int, int]], slots: list[int]) -> ForwardBatch:
    """runs: (tokens before the run, run length) per sequence."""
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.asarray([p + n for p, n in runs], dtype=np.int32)
    z = np.zeros(1, dtype=np.int32)
    return ForwardBatch(z, z, z, z, qs, lens, z, qs, lens, 16, max(n for _, n in runs), int(lens.max()),
                        state_slots=np.asarray(slots, dtype=np.int32))


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def gdn_inputs(T: int):
    g, beta = ops.qwen35_gdn_gating(rand(T, NV), rand(T, NV), np.log(RNG.uniform(0.02, 0.1, NV)).astype(np.float32),
                                    rand(NV))
    return rand(T, NK, DK), rand(T, NK, DK), rand(T, NV, DV), g, beta


def test_causal_conv1d_chunks_and_updates_equal_one_run():
    x, w = rand(11, C), rand(C, K)
    padded = np.concatenate([np.zeros((K - 1, C), np.float32), x])
    direct = sum(padded[j:j + 11] * w[:, j] for j in range(K))
    want = direct / (1 + np.exp(-direct))
    state = rand(ROWS, K - 1, C)                          # stale rows: a fresh sequence ignores them
    whole = ops.qwen35_causal_conv1d(x, w, state.copy(), batch([(0, 11)], [2]))
    np.testing.assert_allclose(whole, want, rtol=1e-5, atol=1e-6)
    got, done = [], 0
    for n in (2, 1, 5):                                   # chunk ends inside and across the window
        got.append(ops.qwen35_causal_conv1d(x[done:done + n], w, state, batch([(done, n)], [2])))
        done += n
    for t in range(done, 11):                             # then one-token steps
        got.append(ops.qwen35_causal_conv1d_update(x[t:t + 1], w, state, batch([(t, 1)], [2])))
    np.testing.assert_allclose(np.concatenate(got), want, rtol=1e-5, atol=1e-6)


def test_gated_delta_rule_varlen_batch_equals_each_sequence_alone():
    lens = [5, 1, 9]
    q, k, v, g, beta = gdn_inputs(sum(lens))
    state = rand(ROWS, NV, DK, DV)
    b = batch([(0, n) for n in lens], [3, 1, 4])
    out = ops.qwen35_gated_delta_rule(q, k, v, g, beta, state, b)
    start = 0
    for n, slot in zip(lens, [3, 1, 4]):
        alone = np.zeros((ROWS, NV, DK, DV), np.float32)
        s = slice(start, start + n)
        ref = ops.qwen35_gated_delta_rule(q[s], k[s], v[s], g[s], beta[s], alone, batch([(0, n)], [0]))
        np.testing.assert_allclose(out[s], ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state[slot], alone[0], rtol=1e-5, atol=1e-6)
        start += n


def test_gated_delta_rule_update_continues_a_prefill():
    q, k, v, g, beta = gdn_inputs(8)
    whole_state = np.zeros((ROWS, NV, DK, DV), np.float32)
    whole = ops.qwen35_gated_delta_rule(q, k, v, g, beta, whole_state, batch([(0, 8)], [1]))
    state = np.zeros_like(whole_state)
    ops.qwen35_gated_delta_rule(q[:6], k[:6], v[:6], g[:6], beta[:6], state, batch([(0, 6)], [1]))
    steps = [ops.qwen35_gated_delta_rule_update(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1],
                                                state, batch([(t, 1)], [1])) for t in (6, 7)]
    np.testing.assert_allclose(np.concatenate(steps), whole[6:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state[1], whole_state[1], rtol=1e-5, atol=1e-6)


def chunked_delta_rule(q, k, v, g, beta, chunk: int):
    """The chunked (WY) form transformers and fla use for prefill, per value head."""
    qn, kn = ops._prepare_qk(q, k, v.shape[1])
    T = q.shape[0]
    out = np.zeros(v.shape, np.float64)
    for h in range(v.shape[1]):
        S = np.zeros((DK, DV))
        for c0 in range(0, T, chunk):
            s = slice(c0, min(c0 + chunk, T))
            Q, Kh, V, b = qn[s, h].astype(np.float64), kn[s, h].astype(np.float64), v[s, h], beta[s, h]
            gam = np.cumsum(g[s, h].astype(np.float64))
            D = np.tril(np.exp(gam[:, None] - gam[None, :]))
            A = np.tril((b[:, None] * Kh @ Kh.T) * D, -1)
            Tinv = np.linalg.inv(np.eye(len(gam)) + A)
            U = Tinv @ (b[:, None] * V)
            W = Tinv @ (b[:, None] * np.exp(gam)[:, None] * Kh)
            Vp = U - W @ S
            out[s, h] = (Q * np.exp(gam)[:, None]) @ S + ((Q @ Kh.T) * D) @ Vp
            S = np.exp(gam[-1]) * S + (Kh * np.exp(gam[-1] - gam)[:, None]).T @ Vp
    return out


def test_gated_delta_rule_equals_the_chunked_form():
    q, k, v, g, beta = gdn_inputs(21)
    state = np.zeros((ROWS, NV, DK, DV), np.float32)
    out = ops.qwen35_gated_delta_rule(q, k, v, g, beta, state, batch([(0, 21)], [1]))
    np.testing.assert_allclose(out, chunked_delta_rule(q, k, v, g, beta, chunk=8), rtol=1e-4, atol=1e-5)
