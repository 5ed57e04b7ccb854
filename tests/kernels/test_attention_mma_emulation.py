"""CPU emulation of attention_mma.cu's indexing (no GPU): the kernel's own address arithmetic run lane by
lane over numpy "shared memory", with ldmatrix / mma.sync m16n8k16 / cp.async zero-fill modelled from
the PTX ISA fragment layouts, compared with the numpy reference. Shared memory starts as NaN, so a
read of a row pad or of a never-written word poisons the output. Mirrors the kernel line by line:
change both together."""
from __future__ import annotations

from dataclasses import dataclass

import math

import numpy as np
import pytest

from openinfer.engine.batch import ForwardBatch
from openinfer.kernels import numpy_ops as ref
from openinfer.quant.fp8 import e4m3_to_f32, to_e4m3

NW = 4
LANE = np.arange(32)
G_ID, T_ID = LANE >> 2, LANE & 3


def bf(x):
    """Round float32 to bf16 (nearest even) and back, as cvt.rn.bf16x2.f32 does for finite values."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def shuffled_tables(need, num_blocks, rng):
    """Block tables [len(need), max(need)]: row i takes the next need[i] blocks of a shuffled pool of
    num_blocks (so rows interleave in the cache), zero past them."""
    perm = rng.permutation(num_blocks)
    tables = np.zeros((len(need), max(need)), np.int32)
    at = 0
    for i, k in enumerate(need):
        tables[i, :k] = perm[at: at + k]
        at += k
    return tables


def tile_cfg(D, MT):
    """MmaTile<D, MT>: MT m-tiles per warp, BM rows per block, BN keys per tile, Q_IN_REGS, LD."""
    return MT, 16 * MT * NW, (64 if D <= 128 else 32), D * MT <= 128, D + 8


def ldmatrix_x4(smem, addr, trans=False):
    """addr[32]: element index of the 8-element row each lane supplies; returns [32, 4, 2] (lo, hi) pairs."""
    assert (addr % 8 == 0).all(), "ldmatrix rows must be 16-byte aligned"
    for i in range(4):  # the 8 rows of each matrix on distinct 16-byte bank groups: no bank conflict
        assert len({(a * 2 // 16) % 8 for a in addr[8 * i: 8 * i + 8]}) == 8, "ldmatrix bank conflict"
    regs = np.empty((32, 4, 2), np.float32)
    for i in range(4):
        mat = np.stack([smem[a: a + 8] for a in addr[8 * i: 8 * i + 8]])  # [8 rows][8 cols]
        if trans:
            mat = mat.T
        regs[:, i, 0] = mat[G_ID, 2 * T_ID]
        regs[:, i, 1] = mat[G_ID, 2 * T_ID + 1]
    return regs


def mma(c, a, b0, b1):
    """c[32, 4] += A (16x16 from a[32, 4, 2]) @ B (16x8 from b0, b1 [32, 2]), PTX m16n8k16 layouts."""
    A = np.zeros((16, 16), np.float64)
    B = np.zeros((16, 8), np.float64)
    for h in range(2):
        A[G_ID, 2 * T_ID + h] = a[:, 0, h]
        A[G_ID + 8, 2 * T_ID + h] = a[:, 1, h]
        A[G_ID, 2 * T_ID + 8 + h] = a[:, 2, h]
        A[G_ID + 8, 2 * T_ID + 8 + h] = a[:, 3, h]
        B[2 * T_ID + h, G_ID] = b0[:, h]
        B[2 * T_ID + 8 + h, G_ID] = b1[:, h]
    Dm = A @ B
    for h in range(2):
        c[:, h] += Dm[G_ID, 2 * T_ID + h]
        c[:, 2 + h] += Dm[G_ID + 8, 2 * T_ID + h]


def pack(lo, hi):
    return np.stack([bf(lo), bf(hi)], axis=-1)


def emulate(q, q_stride, kflat, vflat, cache_base, block_stride, token_stride, bs, tables, qstart, ctx, nh, nkv,
            scale, D, T_out, MT):
    """q: flat bf16 values; caches: flat arrays with a layer's view starting at cache_base."""
    MT, BM, BN, QREGS, LD = tile_cfg(D, MT)
    WR = 16 * MT
    VW, NT, DT, KC, RPW = D // 8, BN // 8, D // 8, D // 16, BN // NW
    out = np.full((T_out, nh, D), np.nan, np.float32)
    G = nh // nkv
    B = len(ctx)
    max_q = int(np.diff(qstart).max())
    gx = math.ceil(max_q * G / BM)

    def offset(table, t, kvh):
        return cache_base + int(table[t // bs]) * block_stride + (t % bs) * token_stride + kvh * D

    for b in range(B):
        for kvh in range(nkv):
            for bx in range(gx):
                q0, n, L = int(qstart[b]), int(qstart[b + 1] - qstart[b]), int(ctx[b])
                rows, row0 = n * G, (gx - 1 - bx) * BM
                if row0 >= rows:
                    continue
                table = tables[b]
                kend = L - n + (min(row0 + BM, rows) - 1) // G + 1
                ntiles = (kend + BN - 1) // BN
                qs = np.full(BM * LD, np.nan, np.float32)
                ks = np.full(2 * BN * LD, np.nan, np.float32)
                vs = np.full(2 * BN * LD, np.nan, np.float32)
                for i in range(BM * VW):  # every thread's chunks of the Q loop
                    r, c, row = i // VW, i % VW, row0 + i // VW
                    if row < rows:
                        src = (q0 + row // G) * q_stride + (kvh * G + row % G) * D + c * 8
                        qs[r * LD + c * 8: r * LD + c * 8 + 8] = q[src: src + 8]
                    else:
                        qs[r * LD + c * 8: r * LD + c * 8 + 8] = 0

                def load_kv_tile(st, k0):
                    for warp in range(NW):
                        key = k0 + warp * RPW + LANE % RPW
                        off = np.array([offset(table, k, kvh) if k < kend else -1 for k in key])
                        for it in range(RPW * VW // 32):
                            idx = it * 32 + LANE
                            r, c = idx // VW, idx % VW
                            o = off[r]  # __shfl_sync(off, r)
                            for ln in range(32):
                                dst = st * BN * LD + (warp * RPW + r[ln]) * LD + c[ln] * 8
                                if o[ln] >= 0:
                                    ks[dst: dst + 8] = kflat[o[ln] + c[ln] * 8: o[ln] + c[ln] * 8 + 8]
                                    vs[dst: dst + 8] = vflat[o[ln] + c[ln] * 8: o[ln] + c[ln] * 8 + 8]
                                else:
                                    ks[dst: dst + 8] = 0
                                    vs[dst: dst + 8] = 0

                load_kv_tile(0, 0)
                koff = ((LANE & 7) + ((LANE >> 4) & 1) * 8) * LD + ((LANE >> 3) & 1) * 8
                voff = ((LANE & 7) + ((LANE >> 3) & 1) * 8) * LD + (LANE >> 4) * 8
                kcol = 2 * (LANE & 3)
                warps = []
                for warp in range(NW):
                    wrow = warp * WR
                    qpos = np.empty((MT, 2, 32), np.int64)
                    for mt in range(MT):
                        for h in range(2):
                            r = row0 + wrow + mt * 16 + (LANE >> 2) + 8 * h
                            qpos[mt, h] = np.where(r < rows, L - n + r // G, -1)
                    warps.append(dict(
                        wrow=wrow, qpos=qpos, qmin=L - n + (row0 + wrow) // G, tail=row0 + wrow + WR > rows,
                        o=np.zeros((MT, 32, DT, 4)), m=np.full((MT, 32, 2), -np.inf), l=np.zeros((MT, 32, 2)),
                        qa=(wrow + (LANE & 7) + ((LANE >> 3) & 1) * 8) * LD + (LANE >> 4) * 8, qf=None))
                for t in range(ntiles):
                    k0, st = t * BN, t & 1
                    if t + 1 < ntiles:
                        load_kv_tile(st ^ 1, k0 + BN)
                    for w in warps:
                        if QREGS and t == 0:
                            w["qf"] = [[ldmatrix_x4(qs, w["qa"] + mt * 16 * LD + kk * 16) for kk in range(KC)]
                                       for mt in range(MT)]
                        s = np.zeros((MT, 32, NT, 4))
                        for kk in range(KC):
                            a = [w["qf"][mt][kk] if QREGS else ldmatrix_x4(qs, w["qa"] + mt * 16 * LD + kk * 16)
                                 for mt in range(MT)]
                            for jp in range(NT // 2):
                                bk = ldmatrix_x4(ks, st * BN * LD + jp * 16 * LD + koff + kk * 16)
                                for mt in range(MT):
                                    mma(s[mt][:, 2 * jp], a[mt], bk[:, 0], bk[:, 1])
                                    mma(s[mt][:, 2 * jp + 1], a[mt], bk[:, 2], bk[:, 3])
                        if w["tail"] or k0 + BN - 1 > w["qmin"]:
                            for mt in range(MT):
                                for j in range(NT):
                                    for e in range(4):
                                        qp = w["qpos"][mt, e >> 1]
                                        s[mt][:, j, e] = np.where(k0 + 8 * j + kcol + (e & 1) > qp, -np.inf,
                                                                  s[mt][:, j, e])
                        p = np.empty_like(s)
                        for mt in range(MT):
                            sm, m = s[mt], w["m"][mt]
                            mx = np.stack([np.maximum(m[:, 0], sm[:, :, :2].max(axis=(1, 2))),
                                           np.maximum(m[:, 1], sm[:, :, 2:].max(axis=(1, 2)))], 1)
                            mx = np.maximum(mx, mx[LANE ^ 1])
                            mx = np.maximum(mx, mx[LANE ^ 2])
                            base = np.where(mx == -np.inf, 0.0, mx * scale)
                            with np.errstate(invalid="ignore"):
                                alpha = np.exp2(m * scale - base)
                            w["m"][mt] = mx
                            w["l"][mt] *= alpha
                            p[mt] = np.exp2(sm * scale - np.repeat(base, 2, axis=1)[:, None, :])
                            w["l"][mt] += np.stack([p[mt][:, :, :2].sum((1, 2)), p[mt][:, :, 2:].sum((1, 2))], 1)
                            w["o"][mt] *= np.repeat(alpha, 2, axis=1)[:, None, :]
                        for kk in range(BN // 16):
                            a = [np.stack([pack(pm[:, 2 * kk, 0], pm[:, 2 * kk, 1]), pack(pm[:, 2 * kk, 2], pm[:, 2 * kk, 3]),
                                           pack(pm[:, 2 * kk + 1, 0], pm[:, 2 * kk + 1, 1]),
                                           pack(pm[:, 2 * kk + 1, 2], pm[:, 2 * kk + 1, 3])], 1) for pm in p]
                            for dp in range(D // 16):
                                bv = ldmatrix_x4(vs, st * BN * LD + kk * 16 * LD + voff + dp * 16, trans=True)
                                for mt in range(MT):
                                    mma(w["o"][mt][:, 2 * dp], a[mt], bv[:, 0], bv[:, 1])
                                    mma(w["o"][mt][:, 2 * dp + 1], a[mt], bv[:, 2], bv[:, 3])
                for w in warps:
                    for mt in range(MT):
                        for h in range(2):
                            lh = w["l"][mt][:, h]
                            lh = lh + lh[LANE ^ 1]
                            lh = lh + lh[LANE ^ 2]
                            inv = np.where(lh > 0, 1 / np.where(lh > 0, lh, 1), 0)
                            srow = (w["wrow"] + mt * 16 + (LANE >> 2) + 8 * h) * LD  # elements (word index * 2)
                            for j in range(DT):
                                for ln in range(32):
                                    wd = srow[ln] + 2 * (4 * j + (ln & 3))
                                    qs[wd: wd + 2] = bf(w["o"][mt][ln, j, 2 * h: 2 * h + 2] * inv[ln])
                    for idx in range(WR * VW):
                        r, c = idx // VW, idx % VW
                        row = row0 + w["wrow"] + r
                        if row < rows:
                            src = (w["wrow"] + r) * LD + c * 8
                            out[q0 + row // G, kvh * G + row % G, c * 8: c * 8 + 8] = qs[src: src + 8]
    return out


CASES = {
    # runs (context_len, query_len), nh, nkv, d
    "varlen_prefix_g4_d64": ([(37, 37), (100, 30), (5, 1), (70, 64), (0, 0), (16, 16)], 8, 2, 64),
    "mha_partial_d128": ([(90, 41), (65, 65)], 2, 2, 128),
    "g8_d128": ([(33, 20), (3, 3)], 8, 1, 128),
    "g16_d256": ([(40, 21), (9, 9)], 16, 1, 256),
}


@dataclass
class PrefillCase:
    """A prefill batch over shuffled pages (layer `layer` of a `layers`-layer pool), q a strided view of
    wider rows (`qbuf`, row length `q_row`, as of a fused qkv projection), and numpy's attention of it."""
    tables: np.ndarray
    qs: np.ndarray
    lens: np.ndarray
    pool: np.ndarray
    qbuf: np.ndarray
    q_row: int
    scale: float
    want: np.ndarray
    bs: int = 16
    layers: int = 2
    layer: int = 1


def prefill_case(runs, nh: int, nkv: int, D: int, rng: np.random.Generator, kv8: bool = False) -> PrefillCase:
    """`kv8`: the caches hold e4m3 values (an fp8 cache's bytes as the kernels convert them)."""
    bs, layers, layer = 16, 2, 1
    need = [max(1, -(-L // bs)) for L, _ in runs]
    nb = sum(need) + 2
    tables = shuffled_tables(need, nb, rng)
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.array([L for L, _ in runs], np.int32)
    T = int(qs[-1])
    pool = bf(rng.standard_normal((2, nb, layers, bs, nkv, D)))
    if kv8:
        pool = e4m3_to_f32(to_e4m3(2 * pool))
    q_row = nh * D + 3 * D
    qbuf = bf(rng.standard_normal((T, q_row)))
    q = qbuf[:, : nh * D].reshape(T, nh, D)
    scale = D ** -0.5
    batch = ForwardBatch(np.zeros(T, np.int32), np.zeros(T, np.int32), np.zeros(T, np.int64), tables, qs, lens,
                         np.zeros(0, np.int32), qs, lens, bs, int(np.diff(qs).max()), int(lens.max()))
    want = ref.paged_attention(q, pool[0][:, layer], pool[1][:, layer], batch, scale)
    return PrefillCase(tables, qs, lens, pool, qbuf, q_row, scale, want, bs, layers, layer)


@pytest.mark.parametrize("variant", ["", "_m1"])
@pytest.mark.parametrize("case", list(CASES))
def test_mma_prefill_emulation_matches_reference(case, variant):
    runs, nh, nkv, D = CASES[case]
    c = prefill_case(runs, nh, nkv, D, np.random.default_rng(7))
    live = [i for i, (L, n) in enumerate(runs) if n > 0]
    got = emulate(c.qbuf.reshape(-1), c.q_row, c.pool[0].reshape(-1), c.pool[1].reshape(-1),
                  c.layer * c.bs * nkv * D, c.layers * c.bs * nkv * D, nkv * D, c.bs, c.tables, c.qs, c.lens, nh, nkv,
                  c.scale * 1.4426950408889634, D, int(c.qs[-1]), 1 if variant == "_m1" or D > 128 else 2)
    assert live and not np.isnan(got).any()
    np.testing.assert_allclose(got, c.want, atol=2e-2, rtol=2e-2)
