"""CPU emulation of the split-KV decode kernels (no GPU), driven by attention_decode.py's recorded launches
(fake_device.py): attention_decode.cu's address arithmetic run lane by lane over NaN-filled numpy "shared memory"
(ldmatrix / mma.sync / cp.async modelled as in test_attention_mma_emulation), each warp's ring in program order, the
warp merge; attention.cu's fp32 paged_decode warp by warp in float32; for both the split rule (decode_merge.cuh
decode_split_len), the grid's blocks taking a sequence's splits in turn, and the merge of decode_merge.cuh (blocks
finishing in a random order at their (sequence, head chunk) counter, the last one merging in split order); compared
with the numpy reference; the fp8-cache form's fragment reads as decode_kv8_emulation.py models them. Also: a
sequence's split layout and its output bits are the same in any batch and under any max_context_len (a CUDA graph's).
Mirrors the kernels line by line: change both together."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from fake_device import flat, run
from openinfer.engine.batch import ForwardBatch
from openinfer.kernels import numpy_ops as ref
from openinfer.kernels.cuda import attention, attention_decode as ad, module
from openinfer.kernels.cuda.module import BF16
from openinfer.quant.fp8 import E4M3, e4m3_to_f32, to_e4m3
from openinfer.testing.launch_check import fake, record_launches
from decode_kv8_emulation import BN_KV8, STAGES_KV8, dec_cols, f16, kv8_chunk, kv8_pv, kv8_scores, q_fragment_kv8
from test_attention_mma_emulation import LANE, ldmatrix_x4, mma, pack, shuffled_tables

DEC_WARPS, DEC_BN, DEC_ROWS = 4, 16, 16
NWARPS, BN, GMAX = 4, 32, 8   # attention.cu's fp32 decode kernel
STAGES = {64: 3, 128: 3, 256: 2}
GID, TQ = LANE >> 2, LANE & 3


def split_rule(L, split_keys, near, cap, slots, pass_len):
    """decode_split_len: (splits holding keys, keys a split) of a sequence of L keys."""
    short = min(near, -(-L // split_keys))
    n = max(1, min(slots, max(short, min(cap, -(-L // (near * split_keys))))))
    length = max(pass_len, -(-(-(-L // n)) // pass_len) * pass_len)
    return -(-L // length), length


def tile_keys(D, kv8):
    """DecTile::BN: keys a tile."""
    return BN_KV8[D] if kv8 else DEC_BN


def warp_load_kv(smem, stage, kflat, vflat, offset, k0, kend, D, kv8=False):
    LD, CH, BN = (D, 16, BN_KV8[D]) if kv8 else (D + 8, 8, DEC_BN)
    VW = D // CH
    key = k0 + (LANE & (BN - 1))
    off = np.array([offset(k) if k < kend else -1 for k in key])
    for it in range(BN * VW // 32):
        idx = it * 32 + LANE
        r, c = idx // VW, idx % VW
        o = off[r]  # __shfl_sync(off, r)
        for ln in range(32):
            at = (kv8_chunk(r[ln], c[ln], D) if kv8 else c[ln]) * CH
            for base, src in ((stage + r[ln] * LD, kflat), (stage + (BN + r[ln]) * LD, vflat)):
                smem[base + at: base + at + CH] = src[o[ln] + c[ln] * CH: o[ln] + (c[ln] + 1) * CH] if o[ln] >= 0 else 0


def q_fragment(q, lo, hi, kk):
    """[32, 4, 2]: rows gid / gid + 8 (None: zeros), elements 16 kk + 2 tq (+ 8) and the next."""
    a = np.zeros((32, 4, 2), np.float32)
    for ln in range(32):
        for i, (row, col) in enumerate(((lo[ln], 0), (hi[ln], 0), (lo[ln], 8), (hi[ln], 8))):
            if row is not None:
                e = row + kk * 16 + 2 * TQ[ln] + col
                a[ln, i] = q[e: e + 2]
    return a


def emulate_split(q, q_stride, kflat, vflat, offset, q0, L, kvh, g0, gc, G, kbeg, kend, first, scale, D, kv8=False):
    """One split (keys kbeg .. kend - 1) of a block, its first one (`first`: copied partly before
    griddepcontrol.wait) or a later one: returns its warps' states merged (merge_warps): o [gc, D]
    unnormalised, M [gc], lsum [gc]. `kv8`: the fp8-cache form (kflat, vflat: the bytes' values)."""
    LD, KC, DT, S = (D if kv8 else D + 8), D // 16, D // 8, (STAGES_KV8 if kv8 else STAGES)[D]
    BN = tile_keys(D, kv8)
    NJ = BN // 8
    STAGE, RING = 2 * BN * LD, S * 2 * BN * LD
    nall = (kend - kbeg + BN - 1) // BN if kend > kbeg else 0
    smem = np.full(DEC_WARPS * RING, np.nan, np.float32)
    koff = ((LANE & 7) + ((LANE >> 4) & 1) * 8) * LD + ((LANE >> 3) & 1) * 8
    voff = ((LANE & 7) + ((LANE >> 3) & 1) * 8) * LD + (LANE >> 4) * 8
    qrow = q0 * q_stride + (kvh * G + g0) * D
    lo = [qrow + g * D if g < gc else None for g in GID]
    hi = [qrow + (g + 8) * D if g + 8 < gc else None for g in GID]
    merged = []
    # The first split's prologue copies go out before griddepcontrol.wait, while rope_write_kv still writes key
    # L - 1: they see that row as garbage (NaN here). After the wait the warp holding it in its prologue copies it
    # again. A later split's copies all go out after the wait.
    new = offset(L - 1)
    written = kflat[new: new + D].copy(), vflat[new: new + D].copy()
    if first:
        kflat[new: new + D] = vflat[new: new + D] = np.nan
    ntiles = [(nall - warp + DEC_WARPS - 1) // DEC_WARPS if nall > warp else 0 for warp in range(DEC_WARPS)]
    for warp in range(DEC_WARPS):
        for s in range(S - 1):
            if s < ntiles[warp]:
                warp_load_kv(smem, warp * RING + s * STAGE, kflat, vflat, offset,
                             kbeg + (warp + s * DEC_WARPS) * BN, kend, D, kv8)
    kflat[new: new + D], vflat[new: new + D] = written   # griddepcontrol.wait: the kernel before has finished
    if first and kend == L:   # warp_reload_key
        tile = (L - 1 - kbeg) // BN
        warp, s, r = tile % DEC_WARPS, tile // DEC_WARPS, (L - 1 - kbeg) % BN
        if s < S - 1:
            stage = warp * RING + s * STAGE
            CH = 16 if kv8 else 8
            for c in range(D // CH):
                at = (kv8_chunk(r, c, D) if kv8 else c) * CH
                for base, src in ((stage + r * LD, kflat), (stage + (BN + r) * LD, vflat)):
                    smem[base + at: base + at + CH] = src[new + c * CH: new + (c + 1) * CH]
    for warp in range(DEC_WARPS):
        ring = warp * RING
        qf = [(q_fragment_kv8 if kv8 else q_fragment)(q, lo, hi, kk) for kk in range(KC)]
        o, m, l = np.zeros((32, DT, 4)), np.full((32, 2), -np.inf), np.zeros((32, 2))
        for t in range(ntiles[warp]):
            pre = t + S - 1
            if pre < ntiles[warp]:
                warp_load_kv(smem, ring + (pre % S) * STAGE, kflat, vflat, offset,
                             kbeg + (warp + pre * DEC_WARPS) * BN, kend, D, kv8)
            kt = ring + (t % S) * STAGE
            vt = kt + BN * LD
            k0 = kbeg + (warp + t * DEC_WARPS) * BN
            if kv8:
                s_ = kv8_scores(smem, kt, qf, D, NJ)
            else:
                s_ = np.zeros((32, 2, 4))
                for kk in range(KC):
                    bk = ldmatrix_x4(smem, kt + koff + kk * 16)
                    mma(s_[:, 0], qf[kk], bk[:, 0], bk[:, 1])
                    mma(s_[:, 1], qf[kk], bk[:, 2], bk[:, 3])
            if k0 + BN > kend:
                for j in range(NJ):
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
            pk = (lambda lo, hi: np.stack([f16(lo), f16(hi)], axis=-1)) if kv8 else pack
            a = [np.stack([pk(p[:, j, 0], p[:, j, 1]), pk(p[:, j, 2], p[:, j, 3]),
                           pk(p[:, j + 1, 0], p[:, j + 1, 1]), pk(p[:, j + 1, 2], p[:, j + 1, 3])], 1)
                 for j in range(0, NJ, 2)]   # keys 16 ks .. 16 ks + 15: n-tiles j = 2 ks, 2 ks + 1
            if kv8:   # keys 16 ks .. 16 ks + 15: V rows from 16 ks on
                for ks in range(BN // 16):
                    kv8_pv(smem, vt + 16 * ks * D, o, a[ks], D)
                continue
            a = a[0]
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
    cols = dec_cols(np.arange(D), D, kv8)
    assert sorted(cols) == list(range(D))
    rows = [w * DEC_ROWS + np.arange(gc) for w in range(DEC_WARPS)]
    return merge_states([(mo[r[:, None] * D + cols], mm[r], ml[r]) for r in rows])


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


def fp32_split(q, q_stride, kflat, vflat, offset, q0, L, kvh, g0, gc, G, kbeg, kend, first, scale, D):
    """One split (keys kbeg .. kend - 1) of a block of attention.cu's paged_decode, in float32: Q scaled, each
    warp's 32-key tiles (every NWARPS-th from kbeg + 32 warp; lane = key) scored, the online softmax a tile,
    P V in key order; returns the warps' states merged (merge_warps). (`first` is moot: this kernel waits for
    its predecessor before anything.)"""
    qs = np.stack([q[q0 * q_stride + (kvh * G + g0 + g) * D:][:D] for g in range(gc)]) * np.float32(scale)
    states = []
    for warp in range(NWARPS):
        m, l, acc = np.full(gc, -np.inf, np.float32), np.zeros(gc, np.float32), np.zeros((gc, D), np.float32)
        for k0 in range(kbeg + warp * BN, kend, NWARPS * BN):
            offs = [offset(t) for t in range(k0, min(k0 + BN, kend))]
            k = np.stack([kflat[o: o + D] for o in offs])
            s = np.zeros((gc, len(offs)), np.float32)
            for i in range(D):
                s += qs[:, i, None] * k[None, :, i]
            mn = np.maximum(m, s.max(1))
            p = np.exp2(s - mn[:, None])
            alpha = np.exp2(m - mn)
            l, acc, m = l * alpha + p.sum(1), acc * alpha[:, None], mn
            for jj, o in enumerate(offs):
                acc += p[:, jj, None] * vflat[o: o + D]
        states.append((acc, m, l))
    return merge_states(states)


def emulate_grid(call, rows, pass_len, split_state, seed=0, exact=None):
    """A decode kernel's grid on its recorded arguments: the blocks (group, head chunk of `rows` query heads,
    sequence) run in a random order (`seed`); each takes its sequence's splits group, group + groups, ...
    (split_rule, whole passes of `pass_len` keys; split_state computes one), stores the output (one split) or each
    split's partial at the kernel's addresses, and counts the splits it took at its counter (left zero); the last
    to arrive merges the partials in split order: weights exp2(m - M) l, fmaf sums (the product and sum in
    float64, then float32). Rows are stored in out's dtype; `exact` (a dict) also gets each (token, head)'s float32
    row before that rounding."""
    (q, q_stride, kc, vc, block_stride, token_stride, bs, tables, table_stride, qstart, ctx, out, part_o, part_m,
     part_l, counters, nh, nkv, scale, split_keys, near, cap, slots) = call.args
    groups, grid_y, B = call.grid
    D = int(call.name.rsplit("_d", 1)[1])
    assert call.cluster is None and int(split_keys) % pass_len == 0
    nh, nkv, slots, bs = int(nh), int(nkv), int(slots), int(bs)
    G = nh // nkv
    chunks = -(-G // rows)
    assert grid_y == nkv * chunks and groups <= slots
    qf = flat(q).astype(np.float32)
    kf, vf = (e4m3_to_f32(flat(a)) if a.dtype == E4M3 else flat(a).astype(np.float32) for a in (kc, vc))
    tab, qs, cx, outf = flat(tables), flat(qstart), flat(ctx), flat(out)
    if slots > 1:
        po, pm, pl, cnt = flat(part_o), flat(part_m), flat(part_l), flat(counters)

    def store(q0, head, row):
        outf[(q0 * nh + head) * D: (q0 * nh + head + 1) * D] = row   # from_f32: bf16 rounds to nearest even
        if exact is not None:
            exact[q0, head] = row.copy()

    for i in np.random.default_rng(seed).permutation(groups * grid_y * B):
        group, by, b = i % groups, i // groups % grid_y, i // (groups * grid_y)
        q0, L = int(qs[b]), int(cx[b])
        if qs[b + 1] == q0:   # no query: every block of it leaves before counting
            continue
        used, split_len = split_rule(L, int(split_keys), int(near), int(cap), slots, pass_len)
        if group >= used:   # no split left for this block
            continue
        kvh, g0 = by // chunks, (by % chunks) * rows
        gc = min(rows, G - g0)
        table = tab[b * int(table_stride):]

        def offset(t):
            return int(table[t // bs]) * int(block_stride) + (t % bs) * int(token_stride) + kvh * D

        head0 = kvh * G + g0
        taken = range(group, used, groups)
        for split in taken:
            kbeg = split * split_len
            o, M, lsum = split_state(qf, int(q_stride), kf, vf, offset, q0, L, kvh, g0, gc, G, kbeg,
                                     min(L, kbeg + split_len), split == group, np.float32(scale), D)
            for g in range(gc):
                row = (o[g] / lsum[g]).astype(np.float32)
                if used == 1:
                    store(q0, head0 + g, row)
                    continue
                p = (b * nh + head0 + g) * slots + split
                po[p * D: (p + 1) * D] = row if lsum[g] > 0 else 0
                pm[p], pl[p] = M[g], lsum[g]
        if used == 1:
            continue
        slot = b * grid_y + by
        cnt[slot] += len(taken)
        if cnt[slot] < used:
            continue
        cnt[slot] = 0   # the last to arrive merges every split's partials, in split order
        for g in range(gc):
            ps = (b * nh + head0 + g) * slots + np.arange(used)
            m, ls = pm[ps], pl[ps]
            w = (np.exp2(m - m.max()) * ls).astype(np.float32)
            acc, lsum = np.zeros(D, np.float32), np.float32(0)
            for s, p in enumerate(ps):
                lsum = np.float32(lsum + w[s])
                acc = (acc.astype(np.float64) + np.float64(w[s]) * po[p * D: (p + 1) * D]).astype(np.float32)
            store(q0, head0 + g, acc / lsum)


def emulate_mma_decode(call, seed=0, exact=None):
    """paged_decode_mma_bf16_d* and its fp8-cache form _kv8_d*: 16 query heads a block, passes of 64 keys."""
    D, kv8 = int(call.name.rsplit("_d", 1)[1]), "_kv8_" in call.name
    assert call.block == 32 * DEC_WARPS and call.smem == ad.mma_decode_smem(D, kv8)
    emulate_grid(call, DEC_ROWS, DEC_WARPS * tile_keys(D, kv8), functools.partial(emulate_split, kv8=kv8), seed,
                 exact)


def emulate_fp32_decode(call, seed=0, exact=None):
    """paged_decode_{bf16,f32}_d*: 8 query heads a block, passes of 128 keys."""
    D = int(call.name.rsplit("_d", 1)[1])
    words = D * flat(call.args[0]).itemsize // 4   # a K row's 32-bit words
    assert call.block == 32 * NWARPS and call.smem == (GMAX * D + NWARPS * BN * (words + 1)) * 4
    emulate_grid(call, GMAX, NWARPS * BN, fp32_split, seed, exact)


def decode_kernels(seed=0, exact=None):
    """run()'s emulations of both decode kernels (longest name prefix first)."""
    return {"paged_decode_mma_bf16": functools.partial(emulate_mma_decode, seed=seed, exact=exact),
            "paged_decode_": functools.partial(emulate_fp32_decode, seed=seed, exact=exact)}


@pytest.fixture
def device(monkeypatch):
    """attention.paged_attention's launchers on host arrays; `device(at_once)` sets the blocks the stand-in GPU
    holds at once (the grid's groups). The arrival counters must be left zero."""
    recorded = record_launches(monkeypatch, (attention, ad))
    counters = fake(np.zeros(module.COUNTER_SLOTS, np.int32))
    monkeypatch.setattr(ad, "arrival_counters", lambda purpose: counters)
    monkeypatch.setattr(ad, "blocks_per_sm", lambda *a: 1)

    def at_once(blocks: int) -> list:
        monkeypatch.setattr(ad, "sm_count", lambda: blocks)
        recorded.clear()
        return recorded
    yield at_once
    assert not counters.any()


def _inputs(ctx, nh, nkv, D, rng, q_lens=None, dtype=BF16, layers=2, layer=1, bs=16):
    """q (a strided view of a fused qkv row), a layer's K and V views of the pool, and the batch (block tables
    shuffled over the pool)."""
    need = [-(-L // bs) for L in ctx]
    nb = sum(need) + 2
    tables = shuffled_tables(need, nb, rng)
    qs = np.concatenate([[0], np.cumsum(q_lens or [1] * len(ctx))]).astype(np.int32)
    lens, T = np.array(ctx, np.int32), int(qs[-1])
    pool = fake(rng.standard_normal((2, nb, layers, bs, nkv, D)), dtype)
    qkv = fake(rng.standard_normal((T, (nh + 2 * nkv) * D)), dtype)
    q = qkv[:, : nh * D].reshape(T, nh, D)
    batch = ForwardBatch(fake(np.zeros(T, np.int32)), fake(np.zeros(T, np.int32)), fake(np.zeros(T, np.int64)),
                         fake(tables), fake(qs), fake(lens), fake(np.zeros(0, np.int32)), qs, lens, bs, 1,
                         int(lens.max()))
    return q, pool[0][:, layer], pool[1][:, layer], batch


def _first(batch, seqs, max_context_len=None):
    """The batch's first `seqs` sequences, under `max_context_len` (None: their longest context)."""
    lens = batch.context_lens_host[:seqs]
    return dataclasses.replace(batch, block_tables=batch.block_tables[:seqs],
                               query_start=batch.query_start[: seqs + 1], context_lens=batch.context_lens[:seqs],
                               query_start_host=batch.query_start_host[: seqs + 1], context_lens_host=lens,
                               max_context_len=max_context_len or int(lens.max()))


CASES = {
    # contexts, nh, nkv, d, the grid's context (None: the longest; else a CUDA graph's), query lens, blocks the
    # device holds at once
    "g4_d128_ragged_split": ([1000, 17, 1, 130, 64, 65], 8, 2, 128, 20480, None, 528),
    "g1_d64_splits_in_turn": ([300, 5, 33], 4, 4, 64, None, None, 4),   # one block a head takes all 5 splits
    "g8_d256_split": ([200, 16, 3], 16, 2, 256, None, None, 528),
    "g32_two_chunks_d64": ([90, 40], 32, 1, 64, None, None, 528),
    "no_query_sequence": ([500, 300, 70], 8, 2, 64, 4096, [1, 0, 1], 528),   # its blocks never count
    "one_long_context": ([2000, 1024, 63], 8, 1, 128, None, None, 12),   # 4 groups take 16 splits in turn
}


# paged_attention's decode kernels: the tensor-core one ("mma": bf16) and the fp32 one ("cuda_cores": bf16, float32)
IMPLS = {"mma": attention.paged_attention, "cuda_cores": attention.paged_attention_cuda_cores}


@pytest.mark.parametrize("impl,dtype,split_keys", [("mma", BF16, 64), ("mma", BF16, 128), ("cuda_cores", BF16, 64),
                                                   ("cuda_cores", np.float32, 256)])
@pytest.mark.parametrize("case", list(CASES))
def test_decode_emulation_matches_reference(case, impl, dtype, split_keys, device, monkeypatch):
    """paged_attention's decode launch emulated: every split of a context merged through the partials, the
    groups past a context's splits leaving at once, a group taking several splits in turn."""
    ctx, nh, nkv, D, graph_context, q_lens, at_once = CASES[case]
    monkeypatch.setattr(ad, "DECODE_SPLIT_KEYS", split_keys)
    launches = device(at_once)
    q, k, v, batch = _inputs(ctx, nh, nkv, D, np.random.default_rng(3), q_lens, dtype)
    if graph_context:
        batch = dataclasses.replace(batch, max_context_len=graph_context)
    out = IMPLS[impl](q, k, v, batch, D ** -0.5)
    (call,) = launches
    kind = "mma_bf16" if impl == "mma" else module.suffix(dtype)
    assert call.name == f"paged_decode_{kind}_d{D}"
    run(launches, decode_kernels())
    want = ref.paged_attention(*(np.asarray(a, np.float32) for a in (q, k, v)), batch, D ** -0.5)
    tol = 2e-2 if dtype == BF16 else 1e-5
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("case", list(CASES))
def test_fp8_cache_decode_emulation_matches_reference(case, device, monkeypatch):
    """The fp8-cache form (paged_decode_mma_bf16_kv8_d*) emulated over e4m3 caches: its swizzled rings, whole-word
    fragment reads without bank conflicts, byte-permuted value pairs and permuted head dims give attention over the
    cache's values (Q and P rounded to f16)."""
    ctx, nh, nkv, D, graph_context, q_lens, at_once = CASES[case]
    launches = device(at_once)
    q, k, v, batch = _inputs(ctx, nh, nkv, D, np.random.default_rng(4), q_lens)
    k8, v8 = (fake(to_e4m3(np.asarray(a, np.float32) * 4)) for a in (k, v))   # spread over the e4m3 range
    if graph_context:
        batch = dataclasses.replace(batch, max_context_len=graph_context)
    out = attention.paged_attention(q, k8, v8, batch, D ** -0.5)
    (call,) = launches
    assert call.name == f"paged_decode_mma_bf16_kv8_d{D}"
    run(launches, decode_kernels())
    kv = [e4m3_to_f32(np.asarray(a)) for a in (k8, v8)]
    want = ref.paged_attention(np.asarray(q, np.float32), *kv, batch, D ** -0.5)
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=2e-2, rtol=2e-2)


def _layout(keys, kernel, groups, slots):
    """Every split of a sequence of `keys` keys in a decode grid of `groups` blocks a (sequence, head chunk) and
    `slots` partials a row, as the kernels run it: {split: (kbeg, kend)} (a warp's tiles follow from these), and
    the splits the final merge reads, in its order."""
    assert ad.decode_split(keys, kernel)[0] <= slots   # the rule is monotonic: no split past the partials
    used, split_len = split_rule(keys, ad.split_keys(kernel), ad.DECODE_NEAR, ad.DECODE_CAP, slots, kernel.pass_len)
    splits = {}
    for group in range(min(groups, used)):
        for s in range(group, used, groups):
            assert s not in splits
            splits[s] = (s * split_len, min(keys, (s + 1) * split_len))
    assert sorted(splits) == list(range(used)) and splits[used - 1][0] < keys == splits[used - 1][1]
    return tuple(sorted(splits.items())), tuple(range(used) if used > 1 else ())


@pytest.mark.parametrize("mma,d", [(True, 64), (True, 128), (True, 256), (False, 128)])
def test_decode_split_depends_on_the_keys_alone(monkeypatch, mma, d):
    """A sequence's splits, their keys and its merge order are the same in the decode grid of any batch size and
    any max_context_len (a CUDA graph's model length): batching and graphs never change its bits. decode_split
    (the host's copy of the rule) agrees; on the tensor-core kernel a 1k context takes 4 splits of 256 keys."""
    monkeypatch.setattr(ad, "sm_count", lambda: 132)
    monkeypatch.setattr(ad, "blocks_per_sm", lambda *a: 4)
    kernel = ad.decode_kernel("bf16", d, 2, mma)
    kv_blocks = 8 * -(-4 // kernel.rows)   # Qwen3-4B: 8 KV heads, 4 query heads each
    for keys in (1, 31, 63, 64, 65, 127, 1000, 1024, 1025, 4096, 5000, 16384, 20000, 40960, 70000):
        layouts, widths = set(), set()
        for batch in (1, 2, 7, 32, 128, 300):
            for max_context in {keys, 4096, 20480, 131072}:
                if max_context < keys:
                    continue
                groups, slots = ad.decode_grid(batch, kv_blocks, max_context, kernel)
                layouts.add(_layout(keys, kernel, groups, slots))
                widths.add(groups)
        ((splits, merge),) = layouts
        n, length, held = ad.decode_split(keys, kernel)
        assert held == len(splits) and splits[0][1] == (0, min(keys, length))
        assert merge == tuple(range(held)) if held > 1 else merge == ()
        if keys >= 1024:
            assert len(widths) > 1   # the grids differed; the layout did not
        if mma and keys == 1024:
            assert (n, length) == (4, 256)


@pytest.mark.parametrize("impl", list(IMPLS))
def test_decode_output_bits_depend_on_the_keys_alone(impl, device, monkeypatch):
    """One sequence (1100 keys: 5 splits of 256 keys on the tensor-core kernel, 3 of 384 on the fp32 one, merged
    through partials) computed alone, in a batch, under a graph's max_context_len (up to 131072 keys: 16 partial
    slots), with its splits taken in
    turn by fewer blocks, and with the blocks finishing in other orders: the same float32 bits. The same sequence
    under another split rule gives other bits, so the check can fail."""
    q, k, v, batch = _inputs([1100, 1, 2, 90], 8, 2, 64, np.random.default_rng(5))

    def first_row(seqs, max_context_len, at_once, seed):
        launches = device(at_once)
        IMPLS[impl](q[:seqs], k, v, _first(batch, seqs, max_context_len), 0.125)
        rows = {}
        run(launches, decode_kernels(seed, rows))
        (call,) = launches
        split_keys, near, cap, slots = (int(a) for a in call.args[-4:])
        used = split_rule(1100, split_keys, near, cap, slots, 64 if impl == "mma" else 128)[0]
        return call.grid[0], used, np.stack([rows[0, h] for h in range(8)])

    groups, used, alone = first_row(1, None, 528, 0)
    assert groups >= used == {"mma": 5, "cuda_cores": 3}[impl]
    in_turn = 0
    for seqs, max_context_len, at_once, seed in ((4, None, 528, 1), (1, 20480, 528, 2), (4, 4096, 528, 3),
                                                 (1, 131072, 528, 4), (4, 20480, 8, 5), (1, None, 6, 6)):
        groups, used, row = first_row(seqs, max_context_len, at_once, seed)
        np.testing.assert_array_equal(row, alone)
        in_turn += groups < used
    assert in_turn   # blocks took several of its splits in turn
    monkeypatch.setattr(ad, "DECODE_NEAR", 16)   # 9 shorter splits
    assert not np.array_equal(first_row(1, None, 528, 0)[2], alone)
