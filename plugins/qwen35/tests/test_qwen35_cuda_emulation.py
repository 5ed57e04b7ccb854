"""CPU emulation of the blocking the Qwen3.5 CUDA kernels use (no GPU): delta_rule.cu's chunked
prefill (64-token chunks with zero rows past a run's end, 32-column state tiles, gamma as an
in-chunk cumsum, row-by-row forward substitution for [W | U], the state carried across chunks)
and conv.cu's token blocks and state save, each in float32, against the sequential numpy
reference, on varlen batches mixing fresh and continuing runs. Mirrors the kernels: change both
together."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.batch import ForwardBatch
from openinfer_qwen35 import ops

L, BV, CONV_K, CONV_TOK = 64, 32, 4, 16   # delta_rule.cu, conv.cu
F32 = np.float32


def batch(runs: list[tuple[int, int]], slots: list[int]) -> ForwardBatch:
    """runs: (tokens before the run, run length) per sequence."""
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.asarray([p + n for p, n in runs], dtype=np.int32)
    z = np.zeros(1, dtype=np.int32)
    return ForwardBatch(z, z, z, z, qs, lens, z, qs, lens, 16, max(n for _, n in runs), int(lens.max()),
                        state_slots=np.asarray(slots, dtype=np.int32))


def _live(b: ForwardBatch, i: int) -> bool:
    return bool(b.context_lens[i] > b.query_start[i + 1] - b.query_start[i])   # gdn.cuh has_state


def _l2(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    return (x * (F32(scale) / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + F32(1e-6)))).astype(F32)


def chunk_block(q, k, v, g, beta, S: np.ndarray, s0: int, n: int, h: int, kh: int, cols: slice, out) -> np.ndarray:
    """One gdn_chunk block: value head h, state columns `cols`, the run s0:s0+n; returns the new S tile."""
    dk = q.shape[2]
    for c0 in range(0, n, L):
        nc = min(L, n - c0)
        rows = slice(s0 + c0, s0 + c0 + nc)
        Q, K = np.zeros((L, dk), F32), np.zeros((L, dk), F32)
        Q[:nc], K[:nc] = _l2(q[rows, kh], dk ** -0.5), _l2(k[rows, kh])
        bet, gg = np.zeros(L, F32), np.zeros(L, F32)
        bet[:nc], gg[:nc] = beta[rows, h], g[rows, h]
        U = np.zeros((L, cols.stop - cols.start), F32)
        U[:nc] = bet[:nc, None] * v[rows, h, cols]
        gam = np.cumsum(gg, dtype=F32)
        tail = np.exp(gam[-1] - gam)
        lower = np.tril(np.ones((L, L), bool))
        D = np.where(lower, np.exp(np.where(lower, gam[:, None] - gam[None, :], 0)), F32(0))
        A = np.tril(bet[:, None] * (K @ K.T) * D, -1)
        P = (Q @ K.T) * D
        W = bet[:, None] * np.exp(gam)[:, None] * K
        for i in range(1, nc):
            W[i] -= A[i, :i] @ W[:i]
            U[i] -= A[i, :i] @ U[:i]
        U -= W @ S
        out[rows, h, cols] = (np.exp(gam)[:, None] * (Q @ S) + P @ U)[:nc]
        S = np.exp(gam[-1]) * S + (K[:nc] * tail[:nc, None]).T @ U[:nc]
    return S


def chunk_kernel(q, k, v, g, beta, state: np.ndarray, b: ForwardBatch) -> np.ndarray:
    nk, nv, dv = q.shape[1], v.shape[1], v.shape[2]
    out = np.full(v.shape, np.nan, F32)
    qs = b.query_start
    for i, slot in enumerate(b.state_slots):
        s0, n = int(qs[i]), int(qs[i + 1] - qs[i])
        if n == 0:
            continue
        for h in range(nv):
            for j0 in range(0, dv, BV):
                cols = slice(j0, min(j0 + BV, dv))
                S = state[slot, h, :, cols].copy() if _live(b, i) else np.zeros((q.shape[2], cols.stop - j0), F32)
                state[slot, h, :, cols] = chunk_block(q, k, v, g, beta, S, s0, n, h, h // (nv // nk), cols, out)
    return out


def gdn_inputs(rng, T, nk, nv, dk, dv):
    g, beta = ops.qwen35_gdn_gating(rng.standard_normal((T, nv), F32), rng.standard_normal((T, nv), F32),
                                    np.log(rng.uniform(0.02, 0.1, nv)).astype(F32), rng.standard_normal(nv, F32))
    return (rng.standard_normal((T, nk, dk), F32), rng.standard_normal((T, nk, dk), F32),
            rng.standard_normal((T, nv, dv), F32), g, beta)


# (tokens before, run length) per sequence: lengths around the chunk size, fresh and continuing
RUNS = {"one_63_64_65": [(0, 1), (5, 63), (0, 64), (100, 65)],
        "long_300_with_state": [(40, 300), (0, 2)],
        "long_300_fresh_and_empty": [(0, 300), (9, 0), (3, 129)]}


@pytest.mark.parametrize("dims", [(2, 4, 128, 128), (2, 4, 16, 48)], ids=["4b_heads", "tiny_partial_tile"])
@pytest.mark.parametrize("runs", list(RUNS))
def test_chunked_blocking_equals_the_recurrence(runs, dims):
    nk, nv, dk, dv = dims
    rng = np.random.default_rng(len(runs) + dk)
    seqs = RUNS[runs]
    b = batch(seqs, [3, 0, 5, 1][:len(seqs)])
    q, k, v, g, beta = gdn_inputs(rng, int(b.query_start[-1]), nk, nv, dk, dv)
    state = rng.standard_normal((6, nv, dk, dv), F32)   # stale rows too: fresh runs must ignore them
    want_state = state.copy()
    want = ops.qwen35_gated_delta_rule(q, k, v, g, beta, want_state, b)
    got = chunk_kernel(q, k, v, g, beta, state, b)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(state, want_state, rtol=2e-4, atol=2e-4)


def conv_kernel(x: np.ndarray, w: np.ndarray, conv_state: np.ndarray, b: ForwardBatch) -> np.ndarray:
    """conv_prefill's token blocks (each reads the K-1 inputs before it, from x or the old state
    row), then conv_state_save, vectorised over channels."""
    out = np.full(x.shape, np.nan, F32)
    qs, slots = b.query_start, b.state_slots

    def before(i: int, s: int, p: int) -> np.ndarray:   # the input at run position p (p may be < 0)
        if p >= 0:
            return x[s + p]
        return conv_state[slots[i], CONV_K - 1 + p] if _live(b, i) else np.zeros(x.shape[1], F32)

    for i in range(len(slots)):
        s, n = int(qs[i]), int(qs[i + 1] - qs[i])
        for t0 in range(0, b.max_query_len, CONV_TOK):
            if t0 >= n:
                continue
            win = [before(i, s, t0 - (CONV_K - 1) + j) for j in range(CONV_K - 1)]
            for t in range(t0, min(t0 + CONV_TOK, n)):
                win.append(x[s + t])
                acc = sum(w[:, j] * win[j] for j in range(CONV_K))
                out[s + t] = acc / (1 + np.exp(-acc))
                win.pop(0)
    saved = {i: [before(i, int(qs[i]), int(qs[i + 1] - qs[i]) - (CONV_K - 1) + j) for j in range(CONV_K - 1)]
             for i in range(len(slots)) if qs[i + 1] > qs[i]}
    for i, keep in saved.items():
        conv_state[slots[i]] = np.stack(keep)
    return out


def test_conv_blocking_equals_the_reference():
    rng = np.random.default_rng(7)
    C = 40
    b = batch([(0, 1), (7, 2), (3, 17), (0, 40), (2, 0), (30, 33)], [4, 0, 2, 5, 1, 3])
    x, w = rng.standard_normal((int(b.query_start[-1]), C), F32), rng.standard_normal((C, CONV_K), F32)
    state = rng.standard_normal((7, CONV_K - 1, C), F32)
    want_state = state.copy()
    want = ops.qwen35_causal_conv1d(x, w, want_state, b)
    np.testing.assert_allclose(conv_kernel(x, w, state, b), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, want_state)
