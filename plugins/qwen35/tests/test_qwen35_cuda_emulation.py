"""CPU emulation of the blocking the Qwen3.5 CUDA kernels use (no GPU): delta_rule.cu's chunked
prefill (64-token chunks with zero rows past a run's end, 32-column state tiles, gamma as an
in-chunk cumsum, row-by-row forward substitution for [W | U], the state carried across chunks)
and conv.cu's token blocks and state save, each in float32, against the sequential numpy
reference, on varlen batches mixing fresh and continuing runs; then gdn_chunk once more at the
thread level (its thread maps and shared-memory offsets, NaN-filled shared memory). Mirrors the
kernels: change both together."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.batch import ForwardBatch
from openinfer_qwen35 import ops

L, BV, DK_MAX, CONV_K, CONV_TOK = 64, 32, 128, 4, 16   # delta_rule.cu, conv.cu
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


THREADS, WARPS = 256, 8   # gdn_chunk's block
TID = np.arange(THREADS)
LANE, WARP = TID & 31, TID >> 5


class Smem:
    """gdn_chunk's dynamic shared memory (ChunkSmem offsets), NaN until written: a read of a word
    no thread wrote poisons the output. `write` asserts no two threads store the same word."""

    def __init__(self, dk: int) -> None:
        self.kq = dk + 1
        sizes = dict(K=L * self.kq, Q=L * self.kq, W=L * self.kq, S=dk * (BV + 1), U=L * (BV + 1),
                     A=L * (L + 1), P=L * (L + 1), gam=L, bet=L, tail=L)
        self.off, at = {}, 0
        for name, n in sizes.items():
            self.off[name], at = at, at + n
        self.mem = np.full(at, np.nan, F32)

    def idx(self, name: str, i) -> np.ndarray:
        return self.off[name] + np.asarray(i)

    def read(self, name: str, i) -> np.ndarray:
        return self.mem[self.idx(name, i)]

    def write(self, name: str, i, values, mask=True) -> None:
        i, mask = np.broadcast_arrays(np.asarray(i), np.asarray(mask))
        sel = self.idx(name, i[mask])
        assert len(np.unique(sel)) == len(sel), f"two threads store the same word of {name}"
        self.mem[sel] = np.broadcast_to(np.asarray(values, F32), i.shape)[mask]


def chunk_block_threads(q, k, v, g, beta, state, out, b: ForwardBatch, seq: int, h: int, j0: int) -> None:
    """One gdn_chunk block, phase by phase, vectorised over its 256 threads with the kernel's own
    thread maps and shared-memory indexing."""
    nk, dk = q.shape[1:]
    nv, dv = v.shape[1:]
    kh, s0 = h // (nv // nk), int(b.query_start[seq])
    n = int(b.query_start[seq + 1]) - s0
    if n == 0:
        return
    sm, live, col = Smem(dk), _live(b, seq), j0 + LANE < dv
    kq, S1 = sm.kq, BV + 1
    slot = b.state_slots[seq]
    for r in range(-(-dk // WARPS)):
        d = WARP + WARPS * r
        m = d < dk
        init = np.where(live & col & m, state[slot, h, np.minimum(d, dk - 1), np.minimum(j0 + LANE, dv - 1)], 0)
        sm.write("S", d * S1 + LANE, init, m)
    for c0 in range(0, n, L):
        nc = min(L, n - c0)
        for r in range(L // WARPS):                              # 1. a warp per token
            t = WARP + WARPS * r
            tok = np.minimum(s0 + c0 + t, s0 + n - 1)            # (only read where t < nc)
            qq, kk = np.zeros(THREADS, F32), np.zeros(THREADS, F32)
            for u in range(-(-dk // 32)):
                i = LANE + 32 * u
                m = i < dk
                qi = np.where((t < nc) & m, q[tok, kh, np.minimum(i, dk - 1)], 0).astype(F32)
                ki = np.where((t < nc) & m, k[tok, kh, np.minimum(i, dk - 1)], 0).astype(F32)
                sm.write("Q", t * kq + i, qi, m)
                sm.write("K", t * kq + i, ki, m)
                qq, kk = qq + np.where(m, qi * qi, 0), kk + np.where(m, ki * ki, 0)
            qq, kk = (np.repeat(x.reshape(WARPS, 32).sum(1), 32) for x in (qq, kk))   # warp_sum
            qs, ks = F32(dk ** -0.5) / np.sqrt(qq + F32(1e-6)), 1 / np.sqrt(kk + F32(1e-6))
            for u in range(-(-dk // 32)):
                i = LANE + 32 * u
                m = i < dk
                sm.mem[sm.idx("Q", (t * kq + i)[m])] *= qs[m]
                sm.mem[sm.idx("K", (t * kq + i)[m])] *= ks[m]
            bt = np.where(t < nc, beta[tok, h], 0).astype(F32)
            vv = v[tok, h, np.minimum(j0 + LANE, dv - 1)]
            sm.write("U", t * S1 + LANE, np.where((t < nc) & col, bt * vv, 0))
            sm.write("bet", t, bt, LANE == 0)
        gl = np.where(np.arange(L) < nc, g[np.minimum(s0 + c0 + np.arange(L), s0 + n - 1), h], 0).astype(F32)
        gam = np.cumsum(gl, dtype=F32)                           # warp 0's scan
        sm.write("gam", np.arange(L), gam)
        sm.write("tail", np.arange(L), np.exp(gam[-1] - gam))
        i, jj = TID >> 2, (TID & 3)[:, None] + 4 * np.arange(L // 4)[None]   # 2. [thread, m]
        d = np.arange(dk)
        ak = np.einsum("td,tmd->tm", sm.read("K", i[:, None] * kq + d), sm.read("K", jj[..., None] * kq + d))
        aq = np.einsum("td,tmd->tm", sm.read("Q", i[:, None] * kq + d), sm.read("K", jj[..., None] * kq + d))
        low = jj <= i[:, None]
        D = np.where(low, np.exp(np.where(low, sm.read("gam", i)[:, None] - sm.read("gam", jj), 0)), 0)
        sm.write("A", i[:, None] * (L + 1) + jj, np.where(jj < i[:, None], sm.read("bet", i)[:, None] * ak * D, 0))
        sm.write("P", i[:, None] * (L + 1) + jj, aq * D)
        e = np.arange(L * dk)                                    # every e, each by thread e % 256
        t, dd = e // dk, e % dk
        sm.write("W", t * kq + dd, sm.read("bet", t) * np.exp(sm.read("gam", t)) * sm.read("K", t * kq + dd))
        cols = TID[TID < dk + BV]                                # 3. a thread per column of [W | U]
        base = np.where(cols < dk, sm.off["W"] + cols, sm.off["U"] + cols - dk)
        stride = np.where(cols < dk, kq, S1)
        for r in range(1, nc):
            a = sm.read("A", r * (L + 1) + np.arange(r))
            sm.mem[base + r * stride] -= sm.mem[base[:, None] + np.arange(r)[None] * stride[:, None]] @ a
        t = WARP[:, None] + WARPS * np.arange(L // WARPS)[None]  # 4. [thread, m]
        sd = sm.read("S", d[None] * S1 + LANE[:, None])          # [thread, d]
        ws = np.einsum("tmd,td->tm", sm.read("W", t[..., None] * kq + d), sd)
        o = np.einsum("tmd,td->tm", sm.read("Q", t[..., None] * kq + d), sd)
        uidx = t * S1 + LANE[:, None]
        sm.write("U", uidx, sm.read("U", uidx) - ws)
        o = o * np.exp(sm.read("gam", t))
        for m in range(L // WARPS):                              # 5.
            tm = t[:, m]
            for j in range(int(tm.max()) + 1):
                o[:, m] += np.where(j <= tm, sm.read("P", tm * (L + 1) + np.minimum(j, tm))
                                    * sm.read("U", np.minimum(j, tm) * S1 + LANE), 0)
            keep = (tm < nc) & col
            out[s0 + c0 + tm[keep], h, j0 + LANE[keep]] = o[keep, m]
        dm = WARP[:, None] + WARPS * np.arange(DK_MAX // WARPS)[None]   # 6. [thread, m]
        mk = dm < dk
        dsafe = np.minimum(dm, dk - 1)
        u = np.stack([sm.read("U", tt * S1 + LANE) * sm.read("tail", tt) for tt in range(nc)])   # [t, thread]
        kk = np.stack([sm.read("K", tt * kq + dsafe) for tt in range(nc)])                      # [t, thread, m]
        acc = np.einsum("ptm,pt->tm", kk, u)
        sidx = dsafe * S1 + LANE[:, None]
        sm.write("S", sidx, np.exp(sm.read("gam", L - 1)) * sm.read("S", sidx) + acc, mk)
    for r in range(-(-dk // WARPS)):
        d = WARP + WARPS * r
        m = (d < dk) & col
        state[slot, h, d[m], j0 + LANE[m]] = sm.read("S", d[m] * S1 + LANE[m])



@pytest.mark.parametrize("dims", [(2, 4, 16, 48), (1, 2, 128, 32)], ids=["tiny_partial_tile", "dk128"])
def test_chunk_kernel_thread_maps(dims):
    """The thread-level emulation (every smem word read was written, no two threads store one word)
    equals the sequential reference on runs around the chunk size, fresh and continuing."""
    nk, nv, dk, dv = dims
    rng = np.random.default_rng(11)
    b = batch([(0, 70), (4, 1), (9, 0), (30, 64)], [2, 0, 4, 1])
    q, k, v, g, beta = gdn_inputs(rng, int(b.query_start[-1]), nk, nv, dk, dv)
    state = rng.standard_normal((5, nv, dk, dv), F32)
    want_state = state.copy()
    want = ops.qwen35_gated_delta_rule(q, k, v, g, beta, want_state, b)
    got = np.full(v.shape, np.nan, F32)
    for seq in range(len(b.state_slots)):
        for h in range(nv):
            for j0 in range(0, dv, BV):
                chunk_block_threads(q, k, v, g, beta, state, got, b, seq, h, j0)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(state, want_state, rtol=2e-4, atol=2e-4)
