"""CPU emulation of attention_decode.cu's indexing (no GPU): the kernel's address arithmetic run lane by
lane over NaN-filled numpy "shared memory" (ldmatrix / mma.sync / cp.async modelled as in
test_attention_mma_emulation), each warp's ring in program order, the warp merge, and the merge of the
splits of decode_merge.cuh (blocks arriving in a random order at their (sequence, head chunk) counter, the last one
merging in part order); compared with the numpy reference. Mirrors the kernel line by line: change both together."""
from __future__ import annotations

import math

import numpy as np
import pytest

from openinfer.engine.batch import ForwardBatch
from openinfer.kernels import numpy_ops as ref
from test_attention_mma_emulation import LANE, bf, ldmatrix_x4, mma, pack, shuffled_tables

DEC_WARPS, DEC_BN, DEC_ROWS = 4, 16, 16
STAGES = {64: 3, 128: 3, 256: 2}
GID, TQ = LANE >> 2, LANE & 3


def decode_splits(num_seqs, kv_blocks, max_context_len, sms=132, per_sm=2):
    """attention_decode.decode_splits with the H200's SM count and the d128 kernel's residency."""
    want = per_sm * sms // max(1, num_seqs * kv_blocks)
    return max(1, min(want, math.ceil(max_context_len / (DEC_WARPS * DEC_BN))))


def warp_load_kv(smem, stage, kflat, vflat, offset, k0, kend, D):
    LD, VW = D + 8, D // 8
    key = k0 + (LANE & (DEC_BN - 1))
    off = np.array([offset(k) if k < kend else -1 for k in key])
    for it in range(DEC_BN * VW // 32):
        idx = it * 32 + LANE
        r, c = idx // VW, idx % VW
        o = off[r]  # __shfl_sync(off, r)
        for ln in range(32):
            for base, src in ((stage + r[ln] * LD, kflat), (stage + (DEC_BN + r[ln]) * LD, vflat)):
                dst = base + c[ln] * 8
                smem[dst: dst + 8] = src[o[ln] + c[ln] * 8: o[ln] + c[ln] * 8 + 8] if o[ln] >= 0 else 0


def q_fragment(q, lo, hi, kk):
    """[32, 4, 2]: rows gid / gid + 8 (None: zeros), elements 16 kk + 2 tq (+ 8) and the next."""
    a = np.zeros((32, 4, 2), np.float32)
    for ln in range(32):
        for i, (row, col) in enumerate(((lo[ln], 0), (hi[ln], 0), (lo[ln], 8), (hi[ln], 8))):
            if row is not None:
                e = row + kk * 16 + 2 * TQ[ln] + col
                a[ln, i] = q[e: e + 2]
    return a


def split_length(L, num_splits, min_split):
    PASS = DEC_WARPS * DEC_BN
    return max(min_split, ((L + num_splits - 1) // num_splits + PASS - 1) // PASS * PASS)


def emulate_block(q, q_stride, kflat, vflat, offset, q0, L, kvh, g0, gc, G, split, num_splits, min_split, scale, D):
    """One block: returns its warps' states merged (merge_warps): o [gc, D] unnormalised, M [gc], lsum [gc]."""
    LD, KC, DT, S = D + 8, D // 16, D // 8, STAGES[D]
    STAGE, RING = 2 * DEC_BN * LD, S * 2 * DEC_BN * LD
    split_len = split_length(L, num_splits, min_split)
    kbeg, kend = split * split_len, min(L, split * split_len + split_len)
    nall = (kend - kbeg + DEC_BN - 1) // DEC_BN if kend > kbeg else 0
    smem = np.full(DEC_WARPS * RING, np.nan, np.float32)
    koff = ((LANE & 7) + ((LANE >> 4) & 1) * 8) * LD + ((LANE >> 3) & 1) * 8
    voff = ((LANE & 7) + ((LANE >> 3) & 1) * 8) * LD + (LANE >> 4) * 8
    qrow = q0 * q_stride + (kvh * G + g0) * D
    lo = [qrow + g * D if g < gc else None for g in GID]
    hi = [qrow + (g + 8) * D if g + 8 < gc else None for g in GID]
    merged = []
    # Every warp's prologue copies go out before griddepcontrol.wait, while rope_write_kv still writes key L - 1:
    # they see that row as garbage (NaN here). After the wait the warp holding it in its prologue copies it again.
    new = offset(L - 1)
    written = kflat[new: new + D].copy(), vflat[new: new + D].copy()
    kflat[new: new + D] = vflat[new: new + D] = np.nan
    ntiles = [(nall - warp + DEC_WARPS - 1) // DEC_WARPS if nall > warp else 0 for warp in range(DEC_WARPS)]
    for warp in range(DEC_WARPS):
        for s in range(S - 1):
            if s < ntiles[warp]:
                warp_load_kv(smem, warp * RING + s * STAGE, kflat, vflat, offset,
                             kbeg + (warp + s * DEC_WARPS) * DEC_BN, kend, D)
    kflat[new: new + D], vflat[new: new + D] = written   # griddepcontrol.wait: the kernel before has finished
    if kbeg < kend and kend == L:   # warp_reload_key
        tile = (L - 1 - kbeg) // DEC_BN
        warp, s, r = tile % DEC_WARPS, tile // DEC_WARPS, (L - 1 - kbeg) % DEC_BN
        if s < S - 1:
            stage = warp * RING + s * STAGE
            smem[stage + r * LD: stage + r * LD + D] = kflat[new: new + D]
            smem[stage + (DEC_BN + r) * LD: stage + (DEC_BN + r) * LD + D] = vflat[new: new + D]
    for warp in range(DEC_WARPS):
        ring = warp * RING
        qf = [q_fragment(q, lo, hi, kk) for kk in range(KC)]
        o, m, l = np.zeros((32, DT, 4)), np.full((32, 2), -np.inf), np.zeros((32, 2))
        for t in range(ntiles[warp]):
            pre = t + S - 1
            if pre < ntiles[warp]:
                warp_load_kv(smem, ring + (pre % S) * STAGE, kflat, vflat, offset,
                             kbeg + (warp + pre * DEC_WARPS) * DEC_BN, kend, D)
            kt = ring + (t % S) * STAGE
            vt = kt + DEC_BN * LD
            k0 = kbeg + (warp + t * DEC_WARPS) * DEC_BN
            s_ = np.zeros((32, 2, 4))
            for kk in range(KC):
                bk = ldmatrix_x4(smem, kt + koff + kk * 16)
                mma(s_[:, 0], qf[kk], bk[:, 0], bk[:, 1])
                mma(s_[:, 1], qf[kk], bk[:, 2], bk[:, 3])
            if k0 + DEC_BN > kend:
                for j in range(2):
                    for e in range(4):
                        s_[:, j, e] = np.where(k0 + 8 * j + 2 * TQ + (e & 1) >= kend, -np.inf, s_[:, j, e])
            mx = np.stack([np.maximum(m[:, 0], s_[:, :, :2].max(axis=(1, 2))),
                           np.maximum(m[:, 1], s_[:, :, 2:].max(axis=(1, 2)))], 1)
            mx = np.maximum(mx, mx[LANE ^ 1])
            mx = np.maximum(mx, mx[LANE ^ 2])
            assert np.isfinite(mx).all()
            base = mx * scale
            alpha = np.exp2(m * scale - base)
            m, l = mx, l * alpha
            p = np.exp2(s_ * scale - np.repeat(base, 2, axis=1)[:, None, :])
            l += np.stack([p[:, :, :2].sum((1, 2)), p[:, :, 2:].sum((1, 2))], 1)
            o *= np.repeat(alpha, 2, axis=1)[:, None, :]
            a = np.stack([pack(p[:, 0, 0], p[:, 0, 1]), pack(p[:, 0, 2], p[:, 0, 3]),
                          pack(p[:, 1, 0], p[:, 1, 1]), pack(p[:, 1, 2], p[:, 1, 3])], 1)
            for dp in range(D // 16):
                bv = ldmatrix_x4(smem, vt + voff + dp * 16, trans=True)
                mma(o[:, 2 * dp], a, bv[:, 0], bv[:, 1])
                mma(o[:, 2 * dp + 1], a, bv[:, 2], bv[:, 3])
        l = l + l[LANE ^ 1]
        l = l + l[LANE ^ 2]
        merged.append((o, m, l))
    # the merge area: O [warp][row][D], mm, ml [warp][row]
    mo = np.full(DEC_WARPS * DEC_ROWS * D, np.nan, np.float32)
    mm = np.full(DEC_WARPS * DEC_ROWS, np.nan, np.float32)
    ml = np.full(DEC_WARPS * DEC_ROWS, np.nan, np.float32)
    for warp, (o, m, l) in enumerate(merged):
        for h in range(2):
            r = warp * DEC_ROWS + GID + 8 * h
            for j in range(DT):
                for ln in range(32):
                    at = r[ln] * D + 8 * j + 2 * TQ[ln]
                    mo[at: at + 2] = o[ln, j, 2 * h: 2 * h + 2]
            first = TQ == 0
            mm[r[first]] = np.where(m[first, h] == -np.inf, -np.inf, m[first, h] * scale)
            ml[r[first]] = l[first, h]
    return merge_states([(mo[(w * DEC_ROWS + np.arange(gc)[:, None]) * D + np.arange(D)],
                          mm[w * DEC_ROWS + np.arange(gc)], ml[w * DEC_ROWS + np.arange(gc)]) for w in range(DEC_WARPS)])


def merge_states(states):
    """merge_warps in float32: states (o [gc, D] unnormalised, M [gc], lsum [gc]) combined in
    order, each weighted exp2(M_i - M); M = -inf, lsum = o = 0 where none saw a key."""
    o = np.array([s[0] for s in states], np.float32)
    m = np.array([s[1] for s in states], np.float32)
    l = np.array([s[2] for s in states], np.float32)
    M = m.max(0)
    f = np.where(M == -np.inf, np.float32(0), np.exp2(m - np.where(M == -np.inf, 0, M))).astype(np.float32)
    acc, lsum = np.zeros(o.shape[1:], np.float32), np.zeros(len(M), np.float32)
    for i in range(len(states)):
        lsum += f[i] * l[i]
        acc += f[i][:, None] * o[i]
    assert not np.isnan(acc).any()
    return acc, M, lsum


def merge_splits(parts, gc, D):
    """merge_splits_if_last in float32: weights exp2(m - M) l (l = 0 parts skipped), o and l summed in
    part order, whichever block arrived last."""
    m = np.array([p[1] for p in parts], np.float32)   # [split, head], as stored (log2 units)
    l = np.array([p[2] for p in parts], np.float32)
    M = m.max(0)
    assert np.isfinite(M).all()
    w = np.where(l == 0, np.float32(0), np.exp2(m - M) * l).astype(np.float32)
    out = np.zeros((gc, D), np.float32)
    for g in range(gc):
        acc, lsum = np.zeros(D, np.float32), np.float32(0)
        for s, p in enumerate(parts):
            if w[s, g] == 0:   # an empty split: its o was never written (NaN here)
                continue
            lsum += w[s, g]
            acc += w[s, g] * p[0][g].astype(np.float32)
        out[g] = acc / lsum
    return out


def emulate(q, q_stride, kflat, vflat, cache_base, block_stride, token_stride, bs, tables, qstart, ctx, nh, nkv,
            scale, D, num_splits, min_split, rng):
    G, B = nh // nkv, len(ctx)
    chunks = (G + DEC_ROWS - 1) // DEC_ROWS
    grid_y = nkv * chunks
    counters = np.zeros(4096, np.int32)   # arrival_counters: zero on entry
    out = np.full((int(qstart[-1]), nh, D), np.nan)
    merges = 0
    # the grid's blocks (split, y, sequence) finish in any order; each stores or counts
    for i in rng.permutation(num_splits * grid_y * B):
        split, by, b = i % num_splits, i // num_splits % grid_y, i // (num_splits * grid_y)
        q0, L = int(qstart[b]), int(ctx[b])
        if qstart[b + 1] == q0:   # no query: every block of it leaves before counting
            continue
        used = -(-L // split_length(L, num_splits, min_split))
        if split >= used:   # past the context
            continue
        kvh, g0 = by // chunks, (by % chunks) * DEC_ROWS
        gc = min(DEC_ROWS, G - g0)

        def offset(t):
            return cache_base + int(tables[b][t // bs]) * block_stride + (t % bs) * token_stride + kvh * D

        def stored(p):   # split p's block: its state as store_merged_warps writes it, o / lsum
            o, M, lsum = emulate_block(q, q_stride, kflat, vflat, offset, q0, L, kvh, g0, gc, G, p, num_splits,
                                       min_split, scale, D)
            return o / lsum[:, None], M, lsum

        heads = slice(kvh * G + g0, kvh * G + g0 + gc)
        if used == 1:   # the one split stores o / lsum itself
            out[q0, heads] = stored(split)[0]
            continue
        slot = b * grid_y + by
        counters[slot] += 1
        if counters[slot] == used:   # the last to arrive: merges every used split's partials
            counters[slot] = 0
            out[q0, heads] = merge_splits([stored(p) for p in range(used)], gc, D)
            merges += 1
    assert not counters.any()   # left zero for the next launch
    return out


CASES = {
    # contexts, nh, nkv, d, splits (None: decode_splits for a graph sized for 20480 tokens), query lens
    "g4_d128_ragged_split": ([1000, 17, 1, 130, 64, 65], 8, 2, 128, None, None),
    "g1_d64_one_split": ([300, 5, 33], 4, 4, 64, 1, None),
    "g8_d256_split": ([200, 16, 3], 16, 2, 256, 3, None),
    "g32_two_chunks_d64": ([90, 40], 32, 1, 64, 2, None),
    "no_query_sequence": ([500, 300, 70], 8, 2, 64, 5, [1, 0, 1]),   # its blocks never count
    "one_long_context": ([2000, 1024, 63], 8, 1, 128, 32, None),
}


@pytest.mark.parametrize("min_split", [64, 128])
@pytest.mark.parametrize("case", list(CASES))
def test_mma_decode_emulation_matches_reference(case, min_split):
    """Every split of a context is merged through the partials; the splits past a context leave at once."""
    ctx, nh, nkv, D, splits, q_lens = CASES[case]
    rng = np.random.default_rng(3)
    bs, layers, layer = 16, 2, 1
    need = [-(-L // bs) for L in ctx]
    nb = sum(need) + 2
    tables = shuffled_tables(need, nb, rng)
    B = len(ctx)
    qs = np.concatenate([[0], np.cumsum(q_lens or [1] * B)]).astype(np.int32)
    lens, T = np.array(ctx, np.int32), int(qs[-1])
    pool = bf(rng.standard_normal((2, nb, layers, bs, nkv, D)))
    q_extra = 2 * nkv * D  # q is a strided view of a fused qkv row
    qbuf = bf(rng.standard_normal((T, nh * D + q_extra)))
    q = qbuf[:, : nh * D].reshape(T, nh, D)
    scale = D ** -0.5
    batch = ForwardBatch(np.zeros(T, np.int32), np.zeros(T, np.int32), np.zeros(T, np.int64), tables, qs, lens,
                         np.zeros(0, np.int32), qs, lens, bs, 1, int(lens.max()))
    num_splits = splits or decode_splits(B, nkv * -(-(nh // nkv) // DEC_ROWS), 20480)
    want = ref.paged_attention(q, pool[0][:, layer], pool[1][:, layer], batch, scale)
    got = emulate(qbuf.reshape(-1), nh * D + q_extra, pool[0].reshape(-1), pool[1].reshape(-1), layer * bs * nkv * D,
                  layers * bs * nkv * D, nkv * D, bs, tables, qs, lens, nh, nkv, scale * 1.4426950408889634, D,
                  num_splits, min_split, rng)
    np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)
