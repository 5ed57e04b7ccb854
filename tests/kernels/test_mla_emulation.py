"""CPU emulation of mla.cu's mla_attention_bf16 (no GPU): the kernel's own address arithmetic run lane by lane over
numpy "shared memory", with ldmatrix / mma.sync m16n8k16 / cp.async zero-fill modelled from the PTX ISA fragment
layouts (test_attention_mma_emulation's models), the split partials merged as decode_merge.cuh does, compared with
the op's definition. Shared memory starts as NaN, so a read of a row pad or of a never-written word poisons the
output. Mirrors the kernel line by line: change both together."""
from __future__ import annotations

import math

import numpy as np
import pytest

from test_attention_mma_emulation import LANE, bf, ldmatrix_x4, mma, shuffled_tables

R, P = 512, 64
D = R + P
NW, BN, ROWS = 4, 32, 16           # MLA_WARPS, MLA_BN, MLA_ROWS
LD, PLD, CH, VCOLS = D + 8, BN + 8, D // 8, R // NW
GID, TQ = LANE >> 2, LANE & 3


def emulate_block(ql, ql_stride, qp, qp_stride, cache, block_stride, bs, table, q0, n, L, nh, scale, split, ty,
                  num_splits, min_split):
    """One block (split, row tile ty) of one sequence: None if it leaves early, else (row0, gc, used, o [16, 512]
    unnormalised, m [16] in log2 units, l [16])."""
    rows, row0 = n * nh, ty * ROWS
    if row0 >= rows:
        return None
    gc = min(ROWS, rows - row0)
    kall = L - n + (row0 + gc - 1) // nh + 1
    split_len = max(min_split, ((kall + num_splits - 1) // num_splits + BN - 1) // BN * BN)
    used = (kall + split_len - 1) // split_len
    if split >= used:
        return None
    kbeg = split * split_len
    kend = min(kall, kbeg + split_len)
    ntiles = (kend - kbeg + BN - 1) // BN
    qs = np.full(ROWS * LD, np.nan, np.float32)
    kvs = np.full(2 * BN * LD, np.nan, np.float32)
    ps = np.full(ROWS * PLD, np.nan, np.float32)
    red = np.full(NW * ROWS, np.nan, np.float32)
    for i in range(ROWS * CH):
        r, c = divmod(i, CH)
        row = row0 + r
        dst = qs[r * LD + c * 8: r * LD + c * 8 + 8]
        if r < gc:
            tok, head = q0 + row // nh, row % nh
            dst[:] = (ql[tok * ql_stride + head * R + c * 8:][:8] if c < R // 8
                      else qp[tok * qp_stride + head * P + (c - R // 8) * 8:][:8])
        else:
            dst[:] = 0

    def load_tile(stage, k0):
        for i in range(BN * CH):
            r, c = divmod(i, CH)
            key = k0 + r
            dst = kvs[stage * BN * LD + r * LD + c * 8:][:8]
            if key < kend:
                off = int(table[key // bs]) * block_stride + (key % bs) * D
                dst[:] = cache[off + c * 8: off + c * 8 + 8]
            else:
                dst[:] = 0

    load_tile(0, kbeg)
    qpos = np.stack([np.where(GID + 8 * h < gc, L - n + (row0 + GID + 8 * h) // nh, -1) for h in range(2)], 1)
    o = np.zeros((NW, 32, VCOLS // 8, 4))
    m = np.full((NW, 32, 2), -np.inf)
    lsum = np.zeros((NW, 32, 2))
    aoff = ((LANE & 7) + ((LANE >> 3) & 1) * 8) * LD + (LANE >> 4) * 8
    poff = ((LANE & 7) + ((LANE >> 3) & 1) * 8) * PLD + (LANE >> 4) * 8
    for t in range(ntiles):
        if t + 1 < ntiles:
            load_tile((t + 1) & 1, kbeg + (t + 1) * BN)
        kt, k0 = (t & 1) * BN * LD, kbeg + t * BN
        s = np.zeros((NW, 32, 4))
        for w in range(NW):
            koff = (8 * w + (LANE & 7)) * LD + (LANE >> 3) * 8
            for kk in range(D // 32):
                bk = ldmatrix_x4(kvs, kt + koff + kk * 32)
                mma(s[w], ldmatrix_x4(qs, aoff + kk * 32), bk[:, 0], bk[:, 1])
                mma(s[w], ldmatrix_x4(qs, aoff + kk * 32 + 16), bk[:, 2], bk[:, 3])
            for e in range(4):
                key = k0 + 8 * w + 2 * TQ + (e & 1)
                s[w][:, e] = np.where((key >= kend) | (key > qpos[:, e >> 1]), -np.inf, s[w][:, e])
            for h in range(2):
                mx = np.maximum(s[w][:, 2 * h], s[w][:, 2 * h + 1])
                mx = np.maximum(mx, mx[LANE ^ 1])
                mx = np.maximum(mx, mx[LANE ^ 2])
                for ln in np.flatnonzero(TQ == 0):
                    red[w * ROWS + GID[ln] + 8 * h] = mx[ln]
        for w in range(NW):
            alpha, base = np.empty((32, 2)), np.empty((32, 2))
            for h in range(2):
                mt = m[w][:, h].copy()
                for w2 in range(NW):
                    mt = np.maximum(mt, red[w2 * ROWS + GID + 8 * h])
                base[:, h] = np.where(mt == -np.inf, 0.0, mt * scale)
                with np.errstate(invalid="ignore"):
                    alpha[:, h] = np.exp2(m[w][:, h] * scale - base[:, h])
                m[w][:, h] = mt
                lsum[w][:, h] *= alpha[:, h]
            for e in range(4):
                s[w][:, e] = np.exp2(s[w][:, e] * scale - base[:, e >> 1])
                lsum[w][:, e >> 1] += s[w][:, e]
            for ln in range(32):
                for h in range(2):
                    at = (GID[ln] + 8 * h) * PLD + 8 * w + 2 * TQ[ln]
                    ps[at: at + 2] = bf(s[w][ln, 2 * h: 2 * h + 2])
            o[w] *= np.repeat(alpha, 2, axis=1)[:, None, :]
        for w in range(NW):
            voff = ((LANE & 7) + ((LANE >> 3) & 1) * 8) * LD + (LANE >> 4) * 8 + w * VCOLS
            for kk in range(BN // 16):
                a = ldmatrix_x4(ps, poff + kk * 16)
                for dp in range(VCOLS // 16):
                    bv = ldmatrix_x4(kvs, kt + voff + kk * 16 * LD + dp * 16, trans=True)
                    mma(o[w][:, 2 * dp], a, bv[:, 0], bv[:, 1])
                    mma(o[w][:, 2 * dp + 1], a, bv[:, 2], bv[:, 3])
    mo = np.full((ROWS, R), np.nan)
    wl = np.full((NW, ROWS), np.nan)
    mm = np.full(ROWS, np.nan)
    for w in range(NW):
        lw = lsum[w] + lsum[w][LANE ^ 1]
        lw = lw + lw[LANE ^ 2]
        for ln in range(32):
            for h in range(2):
                r = GID[ln] + 8 * h
                for j in range(VCOLS // 8):
                    col = w * VCOLS + 8 * j + 2 * TQ[ln]
                    mo[r, col: col + 2] = o[w][ln, j, 2 * h: 2 * h + 2]
                if TQ[ln] == 0:
                    wl[w, r] = lw[ln, h]
                    if w == 0:
                        mm[r] = -np.inf if m[w][ln, h] == -np.inf else m[w][ln, h] * scale
    return row0, gc, used, mo[:gc], mm[:gc], wl.sum(0)[:gc]


def emulate(ql, qp, cache, block_stride, bs, tables, qstart, ctx, nh, scale, num_splits, min_split):
    """The grid (split, row tile, sequence), then the partials merged (decode_merge.cuh's weights)."""
    T = int(qstart[-1])
    out = np.full((T, nh, R), np.nan)
    max_q = int(np.diff(qstart).max())
    for b in range(len(ctx)):
        q0, n, L = int(qstart[b]), int(qstart[b + 1] - qstart[b]), int(ctx[b])
        for ty in range(math.ceil(max_q * nh / ROWS)):
            parts = [emulate_block(ql, nh * R, qp, nh * P, cache, block_stride, bs, tables[b], q0, n, L, nh, scale,
                                   s, ty, num_splits, min_split) for s in range(num_splits)]
            parts = [p for p in parts if p is not None]
            if not parts:
                continue
            row0, gc, used = parts[0][:3]
            assert len(parts) == used and all(p[2] == used for p in parts)
            M = np.max([p[4] for p in parts], axis=0)
            wts = [np.exp2(p[4] - M) * p[5] for p in parts]
            o = sum(wt[:, None] * p[3] / p[5][:, None] for wt, p in zip(wts, parts)) / sum(wts)[:, None]
            flat = out.reshape(-1, R)
            flat[q0 * nh + row0: q0 * nh + row0 + gc] = o
    return out


def reference(ql, qp, rows_of, qstart, ctx, nh, scale):
    out = np.zeros((int(qstart[-1]), nh, R))
    for b, L in enumerate(ctx):
        s, e = int(qstart[b]), int(qstart[b + 1])
        n = e - s
        if not n:
            continue
        kv = rows_of(b, L)
        q = np.concatenate([ql[s:e], qp[s:e]], -1).astype(np.float64)
        sc = np.einsum("nhd,ld->nhl", q, kv) * scale
        sc = np.where((np.arange(L)[None, :] > (L - n + np.arange(n))[:, None])[:, None], -np.inf, sc)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        out[s:e] = np.einsum("nhl,ld->nhd", p / p.sum(-1, keepdims=True), kv[:, :R])
    return out


CASES = {
    # runs (context, query run), heads, grid splits, fewest keys a split: decode splits (uneven last tiles, a split
    # past a short context), runs of several tokens whose row tiles span tokens (4 and 6 heads), an empty run
    "decode_split": ([(70, 1), (5, 1), (33, 1)], 16, 3, 32),
    "decode_32_heads": ([(40, 1)], 32, 1, 64),
    "prefill_4_heads": ([(20, 20), (37, 5), (3, 0)], 4, 1, 64),
    "prefill_6_heads": ([(9, 9), (35, 2)], 6, 1, 64),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mla_kernel_emulation(case):
    runs, nh, num_splits, min_split = CASES[case]
    rng = np.random.default_rng(len(case))
    bs, layers = 16, 2
    num_blocks = sum(-(-L // bs) for L, _ in runs) + 2
    tables = shuffled_tables([-(-L // bs) for L, _ in runs], num_blocks, rng)
    qstart = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int64)
    ctx = [L for L, _ in runs]
    T = int(qstart[-1])
    pool = bf(rng.standard_normal((num_blocks, layers, bs, D)).astype(np.float32))
    ql = bf(rng.standard_normal((T, nh, R)).astype(np.float32))
    qp = bf(rng.standard_normal((T, nh, P)).astype(np.float32))
    scale = 192 ** -0.5 * math.log2(math.e)   # the kernel's scale is in log2 units
    layer = 1
    got = emulate(ql.ravel(), qp.ravel(), pool.ravel()[layer * bs * D:], layers * bs * D, bs, tables, qstart, ctx,
                  nh, scale, num_splits, min_split)

    def rows_of(b, L):
        return pool[tables[b, : -(-L // bs)], layer].reshape(-1, D)[:L].astype(np.float64)
    want = reference(ql, qp, rows_of, qstart, ctx, nh, 192 ** -0.5)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, atol=1e-2, rtol=1e-2)
