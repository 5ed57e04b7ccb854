"""CPU emulation of the blocking the Qwen3.5 CUDA kernels use (no GPU): delta_rule_chunk.cu's chunked
prefill (64-token chunks with zero rows past a run's end, 32-column state tiles, gamma as an
in-chunk cumsum, row-by-row forward substitution for [W | U], the state carried across chunks)
and conv.cu's token blocks and state save, each in float32, against the sequential numpy
reference, on varlen batches mixing fresh and continuing runs, with and without checkpoints
part-way through runs (the chunk grid restarted there, the state and conv window saved to another
row); then gdn_chunk_prep and
gdn_chunk_state at the thread level (their thread maps, shared-memory offsets and scratch records,
NaN-filled shared memory and scratch). Mirrors the kernels: change both together."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.plugin_api import ForwardBatch
from openinfer_qwen35 import ops

from test_qwen35_ops import batch

L, BV, DK_MAX, CONV_K, CONV_TOK = 64, 32, 128, 4, 16   # delta_rule_chunk.cu, conv.cu
F32 = np.float32


def _live(b: ForwardBatch, i: int) -> bool:
    return bool(b.context_lens[i] > b.query_start[i + 1] - b.query_start[i])   # gdn.cuh has_state


def _l2(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    return (x * (F32(scale) / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + F32(1e-6)))).astype(F32)


def checkpoint(b: ForwardBatch, i: int) -> tuple[int, int]:
    """(tokens of run i before its checkpoint, its row); (0, 0): none (delta_rule_chunk.cu's Chunks.split)."""
    if b.checkpoint_lens is None:
        return 0, 0
    n, t = int(b.query_start[i + 1] - b.query_start[i]), int(b.checkpoint_lens[i])
    return (t, int(b.checkpoint_rows[i])) if 0 < t < n else (0, 0)


def chunk_grid(b: ForwardBatch, i: int) -> list[tuple[int, int]]:
    """(start, size) of run i's chunks: Chunks in delta_rule_chunk.cu, restarted at a checkpoint."""
    n, split = int(b.query_start[i + 1] - b.query_start[i]), checkpoint(b, i)[0]
    return [(c0, min(L, end - c0)) for lo, end in ((0, split), (split, n)) for c0 in range(lo, end, L)]


def chunk_block(q, k, v, g, beta, S: np.ndarray, s0: int, grid: list[tuple[int, int]], h: int, kh: int, cols: slice,
                out, save=None) -> np.ndarray:
    """The chunked math for value head h, state columns `cols`, the run's chunks at s0; returns the new
    S tile, and hands `save` the tile at each chunk end (the kernel stores the one at the checkpoint)."""
    dk = q.shape[2]
    for c0, nc in grid:
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
        if save is not None:
            save(c0 + nc, S)
    return S


def chunk_kernel(q, k, v, g, beta, state: np.ndarray, b: ForwardBatch) -> np.ndarray:
    nk, nv, dv = q.shape[1], v.shape[1], v.shape[2]
    out = np.full(v.shape, np.nan, F32)
    qs = b.query_start
    for i, slot in enumerate(b.state_slots):
        s0, n = int(qs[i]), int(qs[i + 1] - qs[i])
        if n == 0:
            continue
        at, row = checkpoint(b, i)
        for h in range(nv):
            for j0 in range(0, dv, BV):
                cols = slice(j0, min(j0 + BV, dv))
                S = state[slot, h, :, cols].copy() if _live(b, i) else np.zeros((q.shape[2], cols.stop - j0), F32)

                def save(end: int, tile: np.ndarray, h=h, cols=cols) -> None:
                    if end == at:
                        state[row, h, :, cols] = tile
                state[slot, h, :, cols] = chunk_block(q, k, v, g, beta, S, s0, chunk_grid(b, i), h, h // (nv // nk),
                                                      cols, out, save)
    return out


def gdn_inputs(rng, T, nk, nv, dk, dv):
    g, beta = ops.qwen35_gdn_gating(rng.standard_normal((T, nv), F32), rng.standard_normal((T, nv), F32),
                                    np.log(rng.uniform(0.02, 0.1, nv)).astype(F32), rng.standard_normal(nv, F32))
    return (rng.standard_normal((T, nk, dk), F32), rng.standard_normal((T, nk, dk), F32),
            rng.standard_normal((T, nv, dv), F32), g, beta)


def with_checkpoints(b: ForwardBatch, lens: list[int], first_row: int) -> ForwardBatch:
    """`b` whose run i saves its state after lens[i] tokens (0: none) into row first_row + i."""
    b.checkpoint_lens = np.asarray(lens, np.int32)
    b.checkpoint_rows = np.arange(first_row, first_row + len(lens), dtype=np.int32)
    return b


# (tokens before, run length) per sequence: lengths around the chunk size, fresh and continuing;
# checkpoints (tokens of the run before them) inside, at and off the chunk grid
RUNS = {"one_63_64_65": ([(0, 1), (5, 63), (0, 64), (100, 65)], None),
        "long_300_with_state": ([(40, 300), (0, 2)], None),
        "long_300_fresh_and_empty": ([(0, 300), (9, 0), (3, 129)], None),
        "checkpoints_1008_of_1024": ([(0, 1024)], [1008]),
        "checkpoints_mixed": ([(0, 70), (16, 64), (5, 3), (40, 300), (0, 2)], [16, 64 - 16, 0, 128, 1])}


@pytest.mark.parametrize("dims", [(2, 4, 128, 128), (2, 4, 16, 48)], ids=["4b_heads", "tiny_partial_tile"])
@pytest.mark.parametrize("runs", list(RUNS))
def test_chunked_blocking_equals_the_recurrence(runs, dims):
    nk, nv, dk, dv = dims
    rng = np.random.default_rng(len(runs) + dk)
    seqs, saves = RUNS[runs]
    b = batch(seqs, [3, 0, 5, 1, 2][:len(seqs)])
    if saves is not None:
        with_checkpoints(b, saves, 6)
    q, k, v, g, beta = gdn_inputs(rng, int(b.query_start[-1]), nk, nv, dk, dv)
    state = rng.standard_normal((6 + len(seqs), nv, dk, dv), F32)   # stale rows too: fresh runs must ignore them
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
    def window(i: int, n: int) -> np.ndarray:   # conv_state_save: the K-1 inputs before run position n
        return np.stack([before(i, int(qs[i]), n - (CONV_K - 1) + j) for j in range(CONV_K - 1)])

    if b.checkpoint_lens is not None:             # the checkpoint launch first: it reads the old rows
        saves = {int(b.checkpoint_rows[i]): window(i, int(n)) for i, n in enumerate(b.checkpoint_lens) if n}
        for row, w in saves.items():
            conv_state[row] = w
    saved = {i: window(i, int(qs[i + 1] - qs[i])) for i in range(len(slots)) if qs[i + 1] > qs[i]}
    for i, keep in saved.items():
        conv_state[slots[i]] = keep
    return out


@pytest.mark.parametrize("saves", [None, [0, 1, 16, 2, 0, 32]], ids=["plain", "checkpoints"])
def test_conv_blocking_equals_the_reference(saves):
    """With checkpoints 1 and 2 tokens into a run, the saved window reaches into the old state row."""
    rng = np.random.default_rng(7)
    C = 40
    b = batch([(0, 1), (7, 2), (3, 17), (0, 40), (2, 0), (30, 33)], [4, 0, 2, 5, 1, 3])
    if saves is not None:
        with_checkpoints(b, saves, 7)
    x, w = rng.standard_normal((int(b.query_start[-1]), C), F32), rng.standard_normal((C, CONV_K), F32)
    state = rng.standard_normal((13, CONV_K - 1, C), F32)
    want_state = state.copy()
    want = ops.qwen35_causal_conv1d(x, w, want_state, b)
    np.testing.assert_allclose(conv_kernel(x, w, state, b), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, want_state)


THREADS, WARPS = 256, 8   # gdn_chunk_prep's block
TC_WARPS = 16             # gdn_chunk_state's warps
TID = np.arange(THREADS)
LANE, WARP = TID & 31, TID >> 5
KP, AP = DK_MAX + 4, L + 4   # delta_rule_chunk.cu: prep's q/k and A row strides


class Smem:
    """A kernel's dynamic shared memory (arrays in declaration order), NaN until written: a read of
    a word no thread wrote poisons the output. `write` asserts no two threads store the same word."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.off, at = {}, 0
        for name, n in sizes.items():
            assert at % 4 == 0, f"{name} is not 16-byte aligned (float4 reads)"
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


def record(dv: int) -> dict[str, int]:
    """Rec in delta_rule_chunk.cu: float offsets of one (chunk, head) record and its size."""
    W, Qg, Kt, P = 0, L * DK_MAX, 2 * L * DK_MAX, 3 * L * DK_MAX
    U = P + L * L
    return dict(W=W, Qg=Qg, Kt=Kt, P=P, U=U, dec=U + L * dv, total=U + L * dv + 4)


def per_seq(b: ForwardBatch) -> int:
    """m of delta_rule_chunk.cu's record index m b + s_b // L + c: 2 when the batch has checkpoints."""
    return 1 if b.checkpoint_lens is None else 2


def rec_base(b: ForwardBatch, seq: int, c: int, h: int, nv: int, dv: int) -> int:
    return ((per_seq(b) * seq + int(b.query_start[seq]) // L + c) * nv + h) * record(dv)["total"]


def scratch_for(b: ForwardBatch, nv: int, dv: int) -> np.ndarray:
    """The launcher's scratch (T // L + m B records per head), NaN until written."""
    records = int(b.query_start[-1]) // L + per_seq(b) * len(b.state_slots)
    return np.full(records * nv * record(dv)["total"], np.nan, F32)


def prep_block(q, k, v, g, beta, scratch, b: ForwardBatch, c: int, h: int, seq: int) -> None:
    """One gdn_chunk_prep block (chunk c of run `seq`, value head h) with its thread maps; each
    record word is stored once over the whole grid (asserted: it must still be NaN)."""
    nk, dk = q.shape[1:]
    nv, dv = v.shape[1:]
    kh, s0 = h // (nv // nk), int(b.query_start[seq])
    n, grid = int(b.query_start[seq + 1]) - s0, chunk_grid(b, seq)
    if c >= len(grid):
        return
    (c0, nc), rec = grid[c], record(dv)
    base = rec_base(b, seq, c, h, nv, dv)

    def store(field: str, i, values) -> None:
        at = base + rec[field] + np.asarray(i).ravel()
        assert np.isnan(scratch[at]).all() and len(np.unique(at)) == len(at), f"record {field} stored twice"
        scratch[at] = np.broadcast_to(np.asarray(values, F32), np.asarray(i).shape).ravel()

    sm = Smem(dict(Q=L * KP, K=L * KP, A=L * AP, gam=L, bet=L, tail=L))
    for r in range(L * DK_MAX // THREADS):                       # 0. the block stages q, k, v, beta
        e = TID + THREADS * r
        t, i = e // DK_MAX, e % DK_MAX
        tok, col = s0 + c0 + np.minimum(t, nc - 1), np.minimum(i, dk - 1)   # clamped: always read
        m = (t < nc) & (i < dk)
        sm.write("Q", t * KP + i, np.where(m, q[tok, kh, col], 0).astype(F32))
        sm.write("K", t * KP + i, np.where(m, k[tok, kh, col], 0).astype(F32))
    ev = np.arange(L * dv)                                       # v rows as stored: [row, column]
    vs = v[s0 + c0 + np.minimum(ev // dv, nc - 1), h, ev % dv].reshape(L, dv)
    tb = TID[TID < L]
    sm.write("bet", tb, np.where(tb < nc, beta[s0 + c0 + np.minimum(tb, nc - 1), h], 0))
    for r in range(L // WARPS):                                  # 1. a warp per token, normalised in place
        t = WARP + WARPS * r
        qq, kk = np.zeros(THREADS, F32), np.zeros(THREADS, F32)
        for u in range(DK_MAX // 32):
            i = LANE + 32 * u
            qi, ki = sm.read("Q", t * KP + i), sm.read("K", t * KP + i)
            qq, kk = qq + qi * qi, kk + ki * ki
        qq, kk = (np.repeat(x.reshape(WARPS, 32).sum(1), 32) for x in (qq, kk))   # warp_sum
        qs, ks = F32(dk ** -0.5) / np.sqrt(qq + F32(1e-6)), 1 / np.sqrt(kk + F32(1e-6))
        for u in range(DK_MAX // 32):
            i = LANE + 32 * u
            sm.mem[sm.idx("Q", t * KP + i)] *= qs
            sm.mem[sm.idx("K", t * KP + i)] *= ks
    gl = np.where(np.arange(L) < nc, g[np.minimum(s0 + c0 + np.arange(L), s0 + n - 1), h], 0).astype(F32)
    gam = np.cumsum(gl, dtype=F32)                               # warp 0's scan
    sm.write("gam", np.arange(L), gam)
    sm.write("tail", np.arange(L), np.exp(gam[-1] - gam))
    store("dec", 0, np.exp(gam[-1]))
    ti, tj = TID >> 4, TID & 15                                  # 2. rows ti + 16 a, columns tj + 16 e
    i, j = (ti[:, None] + 16 * np.arange(4))[:, :, None], (tj[:, None] + 16 * np.arange(4))[:, None, :]
    d = np.arange(DK_MAX)
    assert (np.asarray([sm.off["Q"], sm.off["K"], KP]) % 4 == 0).all()   # float4 rows
    ki, qi = sm.read("K", i[..., None] * KP + d), sm.read("Q", i[..., None] * KP + d)   # [thread, a, 1, d]
    kj = sm.read("K", j[..., None] * KP + d)                                            # [thread, 1, e, d]
    computed = np.arange(4)[None, :, None] >= np.arange(4)[None, None, :]   # tiles a >= e only
    ak, aq = np.where(computed, (ki * kj).sum(-1), 0), np.where(computed, (qi * kj).sum(-1), 0)
    low = j <= i
    D = np.where(low, np.exp(np.where(low, sm.read("gam", i) - sm.read("gam", j), 0)), 0)
    sm.write("A", i * AP + j, np.where(j < i, sm.read("bet", i) * ak * D, 0))
    store("P", i * L + j, aq * D)
    e = np.arange(L * DK_MAX)
    t, dd = e // DK_MAX, e % DK_MAX
    store("Qg", e, np.exp(sm.read("gam", t)) * sm.read("Q", t * KP + dd))
    store("Kt", e, sm.read("tail", t) * sm.read("K", t * KP + dd))
    cols = np.arange(DK_MAX + dv)                                # 3. a thread per column, X in registers
    isw, rows = cols < DK_MAX, np.arange(L)[:, None]
    vcol = np.minimum(np.maximum(cols - DK_MAX, 0), dv - 1)
    kw = sm.read("K", rows * KP + np.minimum(cols, DK_MAX - 1))
    X = np.where(isw, sm.read("bet", rows) * np.exp(sm.read("gam", rows)) * kw,
                 np.where(rows < nc, sm.read("bet", rows) * vs[rows, vcol], 0)).astype(F32)   # [row, column]
    assert AP % 4 == 0 and sm.off["A"] % 4 == 0
    for r in range(1, L):
        X[r] -= sm.read("A", r * AP + np.arange(r)) @ X[:r]
    store("W", rows * DK_MAX + cols[isw], X[:, isw])
    store("U", rows * dv + cols[~isw] - DK_MAX, X[:, ~isw])


TC_WQ, TC_KT, TC_P, TC_SV = DK_MAX + 4, DK_MAX + 8, L + 4, BV + 8   # gdn_chunk_state's padded row strides
LANES = np.arange(32)
G, T4 = LANES >> 2, LANES & 3


def tf32(x) -> np.ndarray:
    """split_tf32's rounding (cvt.rna.tf32.f32's for finite x): half an ulp added to the bits, the 13 low mantissa bits
    then dropped, as the tensor cores drop them."""
    u = np.asarray(x, F32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(F32)


def mma3(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One warp's mma3 (split_tf32, then hi*hi + hi*lo + lo*hi on m16n8k8): the registers a [4, lane], b [2, lane]
    placed by PTX's fragment layout of mma.m16n8k8 .tf32 (A: a_i at row g + 8 (i % 2), column t + 4 (i / 2); B: b_i
    at row t + 4 i, column g), the product, and c [4, lane] read back by the accumulator layout (c_i at row
    g + 8 (i / 2), column 2 t + i % 2). Summed in float64."""
    A, B = np.full((16, 8), np.nan), np.full((8, 8), np.nan)
    for i in range(4):
        A[G + 8 * (i % 2), T4 + 4 * (i // 2)] = a[i]
    for i in range(2):
        B[T4 + 4 * i, G] = b[i]
    assert not np.isnan(A).any() and not np.isnan(B).any()   # every element of both tiles has one owner
    ah, bh = tf32(A).astype(np.float64), tf32(B).astype(np.float64)
    al, bl = tf32(A - ah).astype(np.float64), tf32(B - bh).astype(np.float64)
    D = ah @ bh + (ah @ bl + al @ bh)
    return np.stack([D[G + 8 * (i // 2), 2 * T4 + i % 2] for i in range(4)])


def state_block(scratch, state, out, b: ForwardBatch, seq: int, h: int, j0: int, nv: int, dk: int,
                   dv: int) -> None:
    """One gdn_chunk_state block: every warp's fragment reads at the kernel's addresses, through mma3."""
    warps, s0 = TC_WARPS, int(b.query_start[seq])
    n = int(b.query_start[seq + 1]) - s0
    if n == 0:
        return
    rec, live, slot = record(dv), _live(b, seq), b.state_slots[seq]
    sm = Smem(dict(W=L * TC_WQ, Qg=L * TC_WQ, Kt=L * TC_KT, P=L * TC_P, S=DK_MAX * TC_SV, V=L * TC_SV))
    col = j0 + LANES < dv
    for warp in range(warps):
        for d in range(warp, DK_MAX, warps):
            init = state[slot, h, min(d, dk - 1), np.minimum(j0 + LANES, dv - 1)] if live and d < dk else 0
            sm.write("S", d * TC_SV + LANES, np.where(col, init, 0))

    def stage_rows(dst: str, stride: int, src: int, rows: int, cols: int) -> None:
        e = np.arange(rows * cols)
        staged = scratch[src + e]
        assert not np.isnan(staged).any(), "prep left record words unwritten"
        sm.mem[sm.off[dst] + (e // cols) * stride + e % cols] = staged

    def frag_a(name: str, base: int, ld: int, tr: bool) -> np.ndarray:
        r, k = [G + 8 * (i % 2) for i in range(4)], [T4 + 4 * (i // 2) for i in range(4)]
        return np.stack([sm.read(name, base + (k[i] * ld + r[i] if tr else r[i] * ld + k[i])) for i in range(4)])

    def frag_b(name: str, base: int, ld: int) -> np.ndarray:
        return np.stack([sm.read(name, base + (T4 + 4 * i) * ld + G) for i in range(2)])

    def stage_all(base: int, which: tuple[str, ...]) -> None:
        for name in which:
            stride, cols = dict(W=(TC_WQ, DK_MAX), Qg=(TC_WQ, DK_MAX), Kt=(TC_KT, DK_MAX), P=(TC_P, L))[name]
            stage_rows(name, stride, base + rec[name], L, cols)

    grid, (split, ckpt_row) = chunk_grid(b, seq), checkpoint(b, seq)
    stage_all(rec_base(b, seq, 0, h, nv, dv), ("W", "Qg", "Kt", "P"))
    for c, (cs, nc) in enumerate(grid):
        base = rec_base(b, seq, c, h, nv, dv)
        nxt = base + nv * rec["total"] if c + 1 < len(grid) else None
        o = {}
        for warp in range(warps):                                # a. V' = U - W S, O = Qg S
            r0, n0 = 16 * (warp // 4), 8 * (warp % 4)
            v, o[warp] = np.zeros((4, 32)), np.zeros((4, 32))
            for k0 in range(0, DK_MAX, 8):
                s_frag = frag_b("S", k0 * TC_SV + n0, TC_SV)
                v += mma3(frag_a("W", r0 * TC_WQ + k0, TC_WQ, False), s_frag)
                o[warp] += mma3(frag_a("Qg", r0 * TC_WQ + k0, TC_WQ, False), s_frag)
            for i in range(4):
                row, j = r0 + G + 8 * (i // 2), n0 + 2 * T4 + i % 2
                u = np.where(j0 + j < dv, scratch[base + rec["U"] + row * dv + np.minimum(j0 + j, dv - 1)], 0)
                assert not np.isnan(u).any()
                sm.write("V", row * TC_SV + j, u - v[i])
        if nxt is not None:
            assert nxt == rec_base(b, seq, c + 1, h, nv, dv)
            stage_all(nxt, ("W", "Qg"))
        decay = scratch[base + rec["dec"]]
        for warp in range(warps):                                # b. O += P V', out; c. S = decay S + Kt^T V'
            r0, n0 = 16 * (warp // 4), 8 * (warp % 4)
            for k0 in range(0, r0 + 16, 8):
                o[warp] += mma3(frag_a("P", r0 * TC_P + k0, TC_P, False), frag_b("V", k0 * TC_SV + n0, TC_SV))
            for i in range(4):
                row, j = r0 + G + 8 * (i // 2), j0 + n0 + 2 * T4 + i % 2
                keep = (row < nc) & (j < dv)
                out[s0 + cs + row[keep], h, j[keep]] = o[warp][i][keep]
        new_s = []
        for warp in range(warps):
            r0, n0 = 16 * (warp // 4), 8 * (warp % 4)
            for d0 in (r0, r0 + 64):
                acc = np.zeros((4, 32))
                for k0 in range(0, L, 8):
                    acc += mma3(frag_a("Kt", k0 * TC_KT + d0, TC_KT, True), frag_b("V", k0 * TC_SV + n0, TC_SV))
                for i in range(4):
                    d, j = d0 + G + 8 * (i // 2), n0 + 2 * T4 + i % 2
                    new_s.append((d, j, decay * sm.read("S", d * TC_SV + j) + acc[i]))
        for d, j, value in new_s:   # every thread reads its own entries before writing them: one pass is the same
            sm.mem[sm.idx("S", d * TC_SV + j)] = value
            if split and cs + nc == split:                       # the checkpoint: the entries just made
                m = (d < dk) & (j0 + j < dv)
                state[ckpt_row, h, d[m], j0 + j[m]] = value[m]
        if nxt is not None:
            stage_all(nxt, ("Kt", "P"))
    for warp in range(warps):
        for d in range(warp, dk, warps):
            state[slot, h, d, j0 + LANES[col]] = sm.read("S", d * TC_SV + LANES[col])


def check_chunk_kernels(dims: tuple[int, int, int, int], saves: list[int] | None, state_walk) -> None:
    """The thread-level emulation of gdn_chunk_prep's grid, then `state_walk`'s blocks (every smem and scratch word
    read was written, none stored twice), equals the sequential reference on runs around the chunk size, fresh and
    continuing, with checkpoints off and on the chunk grid (130 tokens split at 128: one more chunk than the run
    alone, which the grid and scratch must hold)."""
    nk, nv, dk, dv = dims
    rng = np.random.default_rng(11)
    b = batch([(0, 70), (4, 1), (9, 0), (30, 64), (0, 130)], [2, 0, 4, 1, 3])
    if saves is not None:
        with_checkpoints(b, saves, 5)
    q, k, v, g, beta = gdn_inputs(rng, int(b.query_start[-1]), nk, nv, dk, dv)
    state = rng.standard_normal((10, nv, dk, dv), F32)
    want_state = state.copy()
    want = ops.qwen35_gated_delta_rule(q, k, v, g, beta, want_state, b)
    got, scratch = np.full(v.shape, np.nan, F32), scratch_for(b, nv, dv)
    B = len(b.state_slots)
    for c in range(-(-b.max_query_len // L) + per_seq(b) - 1):  # the launcher's prep grid
        for h in range(nv):
            for seq in range(B):
                prep_block(q, k, v, g, beta, scratch, b, c, h, seq)
    for seq in range(B):
        for h in range(nv):
            for j0 in range(0, dv, BV):
                state_walk(scratch, state, got, b, seq, h, j0, nv, dk, dv)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(state, want_state, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("saves", [None, [16, 0, 0, 48, 128]], ids=["plain", "checkpoints"])
@pytest.mark.parametrize("dims", [(2, 4, 16, 48), (1, 2, 128, 32), (1, 1, 128, 128)],
                         ids=["tiny_partial_tile", "dk128", "4b_head"])
def test_chunk_kernels_thread_maps(dims, saves):
    """gdn_chunk_prep then gdn_chunk_state, whose emulation places its fragment addresses by PTX's m16n8k8 layout
    in 3xTF32 (check_chunk_kernels)."""
    check_chunk_kernels(dims, saves, state_block)


def test_launcher_sizes_match_the_emulated_layouts():
    pytest.importorskip("cupy")
    pytest.importorskip("ml_dtypes")
    from openinfer_qwen35.cuda import delta_rule as dr
    assert (dr.CHUNK, dr.BV, dr.DK_MAX, dr.CHUNK_THREADS, dr.STATE_THREADS) == (L, BV, DK_MAX, THREADS, 32 * TC_WARPS)
    floats = 4 * Smem(dict(Q=L * KP, K=L * KP, A=L * AP, gam=L, bet=L, tail=L)).mem.size   # then v rows as stored
    assert all(dr.prep_smem(dv, size) == floats + L * dv * size for dv in (16, 48, 128) for size in (2, 4))
    tc = dict(W=L * TC_WQ, Qg=L * TC_WQ, Kt=L * TC_KT, P=L * TC_P, S=DK_MAX * TC_SV, V=L * TC_SV)
    assert dr.STATE_SMEM == 4 * Smem(tc).mem.size
    assert all(dr.record_floats(dv) == record(dv)["total"] for dv in (16, 48, 128))
