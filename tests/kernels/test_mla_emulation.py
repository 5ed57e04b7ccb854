"""CPU emulation of mla.cu (no GPU), driven by mla.py's recorded launches (fake_device.py): mla_attention_bf16's
own address arithmetic run lane by lane over numpy "shared memory", with ldmatrix / mma.sync m16n8k16 / cp.async
zero-fill modelled from the PTX ISA fragment layouts (test_attention_mma_emulation's models), the split partials
merged as decode_merge.cuh does, against the numpy reference ops (mla_latent.cu's kernels:
test_mla_latent_emulation.py). Shared memory
starts as NaN, so a read of a row pad or of a never-written word poisons the output. Mirrors the kernels line by
line: change both together."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fake_device import flat, run
from openinfer.engine.batch import ForwardBatch
from openinfer.kernels import numpy_mla_moe as ref
from openinfer.kernels.cuda import mla, module
from openinfer.kernels.cuda.module import BF16, NULL
from openinfer.testing.launch_check import fake, record_launches
from test_attention_mma_emulation import LANE, bf, ldmatrix_x4, mma, shuffled_tables

R, P = 512, 64
D = R + P
BN, KW = 32, 4                     # MLA_BN, MLA_KEY_WARPS
LD, PLD, CH = D + 8, BN + 8, D // 8
GID, TQ = LANE >> 2, LANE & 3


def split_rule(kall, cs, split_keys, near, cap, slots):
    """mla.cu's split of a sequence's kall keys: (clusters holding keys, keys a CTA)."""
    short = min(near, -(-kall // (cs * split_keys)))
    clusters = max(1, min(slots, max(short, min(cap, -(-kall // (cs * split_keys * near))))))
    split_len = -(-(-(-kall // (clusters * cs))) // BN) * BN
    return -(-kall // (cs * split_len)), split_len


def block_rows(mt_count, n, L, nh, ty):
    """Row tile ty of a run of n tokens at context L: (row0, gc, keys any of its rows sees), None past the run."""
    row0 = ty * 16 * mt_count
    if row0 >= n * nh:
        return None
    gc = min(16 * mt_count, n * nh - row0)
    return row0, gc, L - n + (row0 + gc - 1) // nh + 1


def emulate_block(mt_count, ql, ql_stride, qp, qp_stride, cache, block_stride, bs, table, q0, n, L, nh, scale,
                  ty, kbeg, kend, chains=1):
    """One CTA of mla_attention<MT, KS = chains> (row tile ty of one sequence) over keys kbeg .. kend - 1: (o [gc,
    512] unnormalised, m [gc] in log2 units, l [gc])."""
    MT = mt_count
    ROWS, SW = 16 * MT, KW * MT
    NW = SW * chains
    VCOLS = R // NW
    row0, gc, _ = block_rows(MT, n, L, nh, ty)
    ntiles = (kend - kbeg + BN - 1) // BN
    qs = np.full(ROWS * LD, np.nan, np.float32)
    kvs = np.full(2 * BN * LD, np.nan, np.float32)
    ps = np.full(ROWS * PLD, np.nan, np.float32)
    red = np.full(KW * ROWS, np.nan, np.float32)
    xch = np.full(SW * 32 * 4, np.nan)   # the second chains' sums (KS = 2), as wide as the emulated accumulators
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
    sw = [w % SW for w in range(NW)]
    chain = [w // SW for w in range(NW)]
    smt, skw = [sw[w] // KW for w in range(NW)], [sw[w] % KW for w in range(NW)]
    qpos = [np.stack([np.where(smt[w] * 16 + GID + 8 * h < gc, L - n + (row0 + smt[w] * 16 + GID + 8 * h) // nh, -1)
                      for h in range(2)], 1) for w in range(NW)]
    o = np.zeros((NW, MT, 32, VCOLS // 8, 4))
    m = np.full((NW, MT, 32, 2), -np.inf)
    lsum = np.zeros((NW, 32, 2))
    poff = ((LANE & 7) + ((LANE >> 3) & 1) * 8) * PLD + (LANE >> 4) * 8
    for t in range(ntiles):
        if t + 1 < ntiles:
            load_tile((t + 1) & 1, kbeg + (t + 1) * BN)
        kt, k0 = (t & 1) * BN * LD, kbeg + t * BN
        s, s2 = np.zeros((NW, 32, 4)), np.zeros((NW, 32, 4))
        for w in sorted(range(NW), key=lambda w: -chain[w]):   # the second chains first: they hand their sums over
            aoff = (smt[w] * 16 + (LANE & 7) + ((LANE >> 3) & 1) * 8) * LD + (LANE >> 4) * 8
            koff = (8 * skw[w] + (LANE & 7)) * LD + (LANE >> 3) * 8
            for kk in range(D // 32):
                bk = ldmatrix_x4(kvs, kt + koff + kk * 32)
                if chains == 1 or chain[w] == 0:
                    mma(s[w], ldmatrix_x4(qs, aoff + kk * 32), bk[:, 0], bk[:, 1])
                if chains == 1 or chain[w] == 1:
                    mma(s2[w], ldmatrix_x4(qs, aoff + kk * 32 + 16), bk[:, 2], bk[:, 3])
            if chains == 2 and chain[w] == 1:
                for ln in range(32):
                    xch[(sw[w] * 32 + ln) * 4: (sw[w] * 32 + ln) * 4 + 4] = s2[w][ln]
                continue
            if chains == 2:
                s2[w] = xch[(sw[w] * 32 + LANE[:, None]) * 4 + np.arange(4)]
            s[w] += s2[w]
            for e in range(4):
                key = k0 + 8 * skw[w] + 2 * TQ + (e & 1)
                s[w][:, e] = np.where((key >= kend) | (key > qpos[w][:, e >> 1]), -np.inf, s[w][:, e])
            for h in range(2):
                mx = np.maximum(s[w][:, 2 * h], s[w][:, 2 * h + 1])
                mx = np.maximum(mx, mx[LANE ^ 1])
                mx = np.maximum(mx, mx[LANE ^ 2])
                for ln in np.flatnonzero(TQ == 0):
                    red[skw[w] * ROWS + smt[w] * 16 + GID[ln] + 8 * h] = mx[ln]
        for w in range(NW):
            alpha, base = np.empty((MT, 32, 2)), np.empty((MT, 32, 2))
            for mt in range(MT):
                for h in range(2):
                    mn = m[w, mt][:, h].copy()
                    for w2 in range(KW):
                        mn = np.maximum(mn, red[w2 * ROWS + mt * 16 + GID + 8 * h])
                    base[mt][:, h] = np.where(mn == -np.inf, 0.0, mn * scale)
                    with np.errstate(invalid="ignore"):
                        alpha[mt][:, h] = np.exp2(m[w, mt][:, h] * scale - base[mt][:, h])
                    m[w, mt][:, h] = mn
            if chain[w] == 0:   # the softmax, l and P: the warps holding a whole S
                lsum[w] *= alpha[smt[w]]
                for e in range(4):
                    s[w][:, e] = np.exp2(s[w][:, e] * scale - base[smt[w]][:, e >> 1])
                    lsum[w][:, e >> 1] += s[w][:, e]
                for ln in range(32):
                    for h in range(2):
                        at = (smt[w] * 16 + GID[ln] + 8 * h) * PLD + 8 * skw[w] + 2 * TQ[ln]
                        ps[at: at + 2] = bf(s[w][ln, 2 * h: 2 * h + 2])
            for mt in range(MT):
                o[w, mt] *= np.repeat(alpha[mt], 2, axis=1)[:, None, :]
        for w in range(NW):
            voff = ((LANE & 7) + ((LANE >> 3) & 1) * 8) * LD + (LANE >> 4) * 8 + w * VCOLS
            for kk in range(BN // 16):
                a = [ldmatrix_x4(ps, poff + mt * 16 * PLD + kk * 16) for mt in range(MT)]
                for dp in range(VCOLS // 16):
                    bv = ldmatrix_x4(kvs, kt + voff + kk * 16 * LD + dp * 16, trans=True)
                    for mt in range(MT):
                        mma(o[w, mt][:, 2 * dp], a[mt], bv[:, 0], bv[:, 1])
                        mma(o[w, mt][:, 2 * dp + 1], a[mt], bv[:, 2], bv[:, 3])
    mo = np.full((ROWS, R), np.nan)
    wl = np.full((KW, ROWS), np.nan)
    mm = np.full(ROWS, np.nan)
    for w in range(NW):
        lw = lsum[w] + lsum[w][LANE ^ 1]
        lw = lw + lw[LANE ^ 2]
        for ln in range(32):
            for h in range(2):
                if TQ[ln] == 0 and chain[w] == 0:
                    wl[skw[w], smt[w] * 16 + GID[ln] + 8 * h] = lw[ln, h]
                for mt in range(MT):
                    r = mt * 16 + GID[ln] + 8 * h
                    for j in range(VCOLS // 8):
                        col = w * VCOLS + 8 * j + 2 * TQ[ln]
                        mo[r, col: col + 2] = o[w, mt][ln, j, 2 * h: 2 * h + 2]
                    if TQ[ln] == 0 and w == 0:
                        mm[r] = -np.inf if m[w, mt][ln, h] == -np.inf else m[w, mt][ln, h] * scale
    return mo[:gc], mm[:gc], wl.sum(0)[:gc]


def merge_cluster(states, rank, cs):
    """mla_merge_cluster: the cluster's CTA states (o, m, l), rank's columns merged in CTA order -> (o [gc, width]
    unnormalised, M, lsum) of the rows."""
    width = R // cs
    cols = slice(rank * width, (rank + 1) * width)
    m = np.stack([st[1] for st in states])                     # [cs, gc]
    M = m.max(0)
    with np.errstate(invalid="ignore"):
        w = np.where(M == -np.inf, 0.0, np.exp2(m - M))
    lsum = (w * np.stack([st[2] for st in states])).sum(0)
    o = sum(w[q][:, None] * st[0][:, cols] for q, st in enumerate(states))
    return o, M, lsum


def emulate_attention(call):
    """mla_attention_bf16's grid on its recorded arguments: each sequence's clusters (split_rule) taken in turn by
    the grid's clusters, each cluster's CTAs merged rank by rank (mla_merge_cluster), stored as the output (one
    cluster) or as partials at the kernel's addresses (slot = the cluster), which the last rank-r CTA to arrive
    (counted at its counter slot, each CTA adding the clusters it took; left zero) merges as decode_merge.cuh does
    (weights exp2(m - M) l in cluster order); rows stored as bf16. The grid's clusters run last one first, so a
    result depending on arrival order would show."""
    (ql, ql_stride, qp, qp_stride, cache, block_stride, bs, tables, table_stride, qstart, ctx, out, part_o, part_m,
     part_l, counters, nh, scale, split_keys, near, cap, slots, cs) = call.args
    grid_x, tiles, B = call.grid
    cs, slots = int(cs), int(slots)
    groups = grid_x // cs
    kernel = {k.name: k for k in (mla.DECODE, mla.DECODE_W8, mla.PREFILL)}[call.name]
    assert call.smem == kernel.smem and call.block == kernel.threads and (grid_x == 1 or kernel is not mla.PREFILL)
    assert call.cluster == ((cs, 1, 1) if cs > 1 else None) and cs <= mla.MAX_CLUSTER and grid_x % cs == 0
    qlf, qpf, cf = (flat(a).astype(np.float32) for a in (ql, qp, cache))
    tab, qs, cx, outf = flat(tables), flat(qstart), flat(ctx), flat(out)
    nh = int(nh)
    if part_o is not NULL:
        po, pm, pl, cnt = flat(part_o), flat(part_m), flat(part_l), flat(counters)
    for b in range(B):
        q0, n, L = int(qs[b]), int(qs[b + 1] - qs[b]), int(cx[b])
        for ty in range(tiles):
            at = block_rows(kernel.rows // 16, n, L, nh, ty)
            if at is None:
                continue
            row0, gc, kall = at
            used, split_len = split_rule(kall, cs, int(split_keys), int(near), int(cap), slots)
            heads = slice((q0 * nh + row0) * R, (q0 * nh + row0 + gc) * R)

            def cluster(c):
                return [emulate_block(kernel.rows // 16, qlf, int(ql_stride), qpf, int(qp_stride), cf,
                                      int(block_stride), int(bs), tab[b * int(table_stride):], q0, n, L, nh,
                                      float(scale), ty, min(kall, x * split_len), min(kall, (x + 1) * split_len),
                                      kernel.chains)
                        for x in range(c * cs, (c + 1) * cs)]
            if used == 1:
                merged = [merge_cluster(cluster(0), rank, cs) for rank in range(cs)]
                outf[heads] = np.concatenate([o / lsum[:, None] for o, _, lsum in merged], 1).ravel()
                continue
            assert part_o is not NULL and n == 1 and gc <= 16 and used <= slots
            width = R // cs
            for group in reversed(range(min(groups, used))):
                taken = range(group, used, groups)
                for c in taken:
                    states = cluster(c)
                    for rank in range(cs):
                        o, M, lsum = merge_cluster(states, rank, cs)
                        rank_off = rank * B * nh * slots
                        for g in range(gc):
                            p = (b * nh + row0 + g) * slots + c
                            pm[rank_off + p], pl[rank_off + p] = M[g], lsum[g]
                            po[p * R + rank * width: p * R + (rank + 1) * width] = o[g] / lsum[g] if lsum[g] > 0 else 0
                for rank in range(cs):
                    rank_off = rank * B * nh * slots
                    slot = rank * B * tiles + b * tiles + ty
                    cnt[slot] += len(taken)
                    if cnt[slot] < used:
                        continue
                    cnt[slot] = 0   # the last to arrive merges rank's columns of every cluster
                    for g in range(gc):
                        ps = (b * nh + row0 + g) * slots + np.arange(used)
                        m, ls = pm[rank_off + ps], pl[rank_off + ps]
                        wts = np.exp2(m - m.max()) * ls
                        cols = (ps[:, None] * R + rank * width + np.arange(width)).ravel()
                        o = (wts[:, None] * po[cols].reshape(used, width)).sum(0) / wts.sum()
                        at = (q0 * nh + row0 + g) * R + rank * width
                        outf[at: at + width] = o


KERNELS = {"mla_attention_bf16": emulate_attention, "mla_attention_w8_bf16": emulate_attention,
           "mla_prefill_bf16": emulate_attention}


def cluster_device(monkeypatch, mod, max_cluster: int = 8, at_once: int = 256) -> None:
    """A 132-SM device holding two blocks an SM, for `mod`'s decode grid: its GPCs hold at_once / cs clusters of
    cs CTAs at once, none larger than max_cluster (1: no clusters at all)."""
    monkeypatch.setattr(mod, "sm_count", lambda: 132)
    monkeypatch.setattr(mod, "blocks_per_sm", lambda *a: 2)
    monkeypatch.setattr(mod, "clusters_supported", lambda: max_cluster > 1)
    monkeypatch.setattr(mod, "clusters_at_once", lambda *a: at_once // a[-1] if a[-1] <= max_cluster else 0)


@pytest.fixture
def launches(monkeypatch):
    """mla.py's launchers on host arrays, on cluster_device; the arrival counters must be left zero."""
    recorded = record_launches(monkeypatch, (mla, module))
    cluster_device(monkeypatch, mla)
    counters = fake(np.zeros(module.COUNTER_SLOTS, np.int32))
    monkeypatch.setattr(mla, "arrival_counters", lambda purpose: counters)
    yield recorded
    assert not counters.any()


def _batch(runs, bs, rng, num_blocks):
    tables = shuffled_tables([-(-L // bs) for L, _ in runs], num_blocks, rng)
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.array([L for L, _ in runs], np.int32)
    T = int(qs[-1])
    return ForwardBatch(fake(np.zeros(T, np.int32)), fake(np.zeros(T, np.int32)), fake(np.zeros(T, np.int64)),
                        fake(tables), fake(qs), fake(lens), fake(np.zeros(0, np.int32)), qs, lens, bs,
                        int(np.diff(qs).max()), int(lens.max()))


CASES = {
    # runs (context, query run), heads, SPLIT_KEYS, the grid's context (a CUDA graph's: most clusters past the
    # contexts), the largest cluster the device runs (1: none) and the CTAs it holds at once -> the decode grid
    # (cs, clusters a sequence, partial slots)
    # one sequence over 2 clusters of 8 (the last CTAs past the keys), merged through partials
    "decode_clusters": ([(300, 1)], 16, 32, None, 8, 256, (8, 2, 2)),
    # one cluster of 8 a sequence (uneven last tiles, CTAs past a 5-key context)
    "decode_split": ([(70, 1), (5, 1), (33, 1)], 16, 128, None, 8, 256, (8, 1, 1)),
    # two row tiles
    "decode_32_heads": ([(140, 1)], 32, 128, None, 8, 256, (8, 1, 1)),
    # a GPU holding two clusters at once: one cluster of the grid takes the long sequence's 3 clusters in turn
    "decode_clusters_in_turn": ([(600, 1), (90, 1)], 16, 32, None, 8, 16, (8, 1, 3)),
    # a graph's grid: 16 clusters a sequence, the first 3 used by the long one, one by the short one
    "decode_graph_width": ([(600, 1), (37, 1)], 16, 32, 5000, 8, 256, (8, 5, 5)),
    # a device whose GPCs hold no cluster of 8: clusters of 4 merged through partials
    "decode_clusters_of_4": ([(130, 1)], 16, 32, None, 4, 256, (4, 2, 2)),
    # a GPU without clusters: splits of one CTA, every column merged by the last
    "decode_no_clusters": ([(150, 1), (64, 1)], 16, 32, None, 1, 256, (1, 4, 4)),
    # runs of several tokens whose row tiles span tokens (4 and 6 heads), an empty run
    "prefill_4_heads": ([(20, 20), (37, 5), (3, 0)], 4, 64, None, 8, 256, (1, 1, 1)),
    "prefill_6_heads": ([(9, 9), (35, 2)], 6, 64, None, 8, 256, (1, 1, 1)),
}


def _inputs(runs, nh, rng, layers=2, bs=16):
    num_blocks = sum(-(-L // bs) for L, _ in runs) + 2
    batch = _batch(runs, bs, rng, num_blocks)
    T = int(batch.query_start_host[-1])
    pool = fake(rng.standard_normal((num_blocks, layers, bs, D)), BF16)
    # q_latent rows inside a wider buffer, q_pe packed (mla_rope's output): different token strides
    ql = fake(rng.standard_normal((T, nh * R + 16)), BF16)[:, 8: 8 + nh * R].reshape(T, nh, R)
    qp = fake(rng.standard_normal((T, nh, P)), BF16)
    return ql, qp, pool[:, 1], batch


@pytest.mark.parametrize("case", list(CASES))
def test_mla_attention_emulation(case, launches, monkeypatch):
    """mla.mla_attention on a strided q_latent and a layer's view of the pool, its launch emulated, against
    numpy_mla_moe.mla_attention."""
    runs, nh, split_keys, graph_context, max_cluster, at_once, (cs, groups, slots) = CASES[case]
    monkeypatch.setattr(mla, "SPLIT_KEYS", split_keys)
    monkeypatch.setattr(mla, "MAX_CLUSTER", 8)   # the kernel merges clusters of up to 8 (MLA_MAX_CLUSTER): each width
    cluster_device(monkeypatch, mla, max_cluster, at_once)
    ql, qp, cache, batch = _inputs(runs, nh, np.random.default_rng(len(case)))
    if graph_context:
        batch = dataclasses.replace(batch, max_context_len=graph_context)
    out = mla.mla_attention(ql, qp, cache, batch, 192 ** -0.5)
    (call,) = launches
    assert call.grid[0] == cs * groups and [int(a) for a in call.args[-3:]] == [
        mla.MAX_CLUSTERS if call.name != mla.PREFILL.name else 1, slots, cs]
    assert (call.args[12] is NULL) == (slots == 1)
    run(launches, KERNELS)
    f32 = [np.asarray(a, np.float32) for a in (ql, qp, cache)]
    want = ref.mla_attention(*f32, batch, 192 ** -0.5)
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=1e-2, rtol=1e-2)


def _layout(keys, cs, groups, slots):
    """Every CTA of a sequence of `keys` keys in a decode grid of `groups` clusters of cs and `slots` partials a
    row, as emulate_attention runs it: {(cluster, rank): (kbeg, kend)} and the clusters the final merge reads."""
    used, split_len = split_rule(keys, cs, mla.SPLIT_KEYS, mla.NEAR_CLUSTERS, mla.MAX_CLUSTERS, slots)
    assert used <= slots
    ctas = {}
    for group in range(min(groups, used)):
        for c in range(group, used, groups):
            for rank in range(cs):
                x = c * cs + rank
                assert (c, rank) not in ctas
                ctas[c, rank] = (min(keys, x * split_len), min(keys, (x + 1) * split_len))
    assert sorted(ctas) == [(c, r) for c in range(used) for r in range(cs)]
    assert ctas[used - 1, 0][0] < keys == max(end for _, end in ctas.values())   # every cluster holds keys
    return ctas, used


@pytest.mark.parametrize("max_cluster", [mla.MAX_CLUSTER, 8, 4, 1])
def test_decode_split_depends_on_the_keys_alone(monkeypatch, max_cluster):
    """A sequence's CTAs, their keys and its merge are the same in the decode grid of any batch size and any
    max_context_len (a CUDA graph's model length): batching and graphs never change its bits. mla.decode_clusters
    (the host's copy of the rule) agrees."""
    shipped = mla.MAX_CLUSTER
    monkeypatch.setattr(mla, "MAX_CLUSTER", max_cluster)
    cluster_device(monkeypatch, mla, max_cluster)
    for keys in (1, 31, 127, 128, 129, 1000, 1025, 4096, 5000, 16384, 20000, 70000):
        layouts = set()
        for batch in (1, 2, 7, 32, 128, 300):
            for max_context in {keys, 4096, 20480}:
                if max_context < keys:
                    continue
                cs, groups, slots = mla.decode_grid(batch, 1, max_context)
                ctas, used = _layout(keys, cs, groups, slots)
                layouts.add((cs, used, tuple(sorted(ctas.items()))))
        ((cs, used, ctas),) = layouts
        n, split, held = mla.decode_clusters(keys, cs)
        assert held == used and dict(ctas)[0, 0] == (0, min(keys, split))
        if max_cluster == shipped == 2:   # 128 keys a CTA up to 4 clusters, then 512 up to 16, then longer
            assert cs == 2 and n == max(min(4, -(-keys // 256)), min(16, -(-keys // 1024)))
            assert split <= (128 if keys <= 1024 else 512 if keys <= 16384 else -(-keys // (32 * 32)) * 32)


def test_decode_output_bits_depend_on_the_keys_alone(monkeypatch):
    """One sequence (two clusters merged through partials) computed alone, among other sequences under a graph's
    max_context_len, on a GPU holding fewer clusters at once (its clusters taken in turn), and by the four-warp
    kernel instead of the eight-warp one small batches take: the same bits."""
    monkeypatch.setattr(mla, "SPLIT_KEYS", 64)
    counters = fake(np.zeros(module.COUNTER_SLOTS, np.int32))
    monkeypatch.setattr(mla, "arrival_counters", lambda purpose: counters)
    rng = np.random.default_rng(7)
    ql, qp, cache, batch = _inputs([(600, 1), (1, 1), (2, 1)], 16, rng)
    rows = []
    kernels = []
    for seqs, max_context, at_once, w8_tiles in ((1, None, 256, 8), (3, 4096, 256, 8), (1, 20480, 256, 8),
                                                 (3, None, 8, 8), (1, None, 256, 0), (3, 4096, 256, 0)):
        monkeypatch.setattr(mla, "W8_MAX_TILES", w8_tiles)
        sub = dataclasses.replace(batch, query_start=batch.query_start[: seqs + 1],
                                  context_lens=batch.context_lens[:seqs], block_tables=batch.block_tables[:seqs],
                                  query_start_host=batch.query_start_host[: seqs + 1],
                                  context_lens_host=batch.context_lens_host[:seqs],
                                  max_context_len=max_context or int(batch.context_lens_host[:seqs].max()))
        recorded = record_launches(monkeypatch, (mla, module))
        monkeypatch.setattr(mla, "MAX_CLUSTER", 8)
        cluster_device(monkeypatch, mla, 8, at_once)
        out = mla.mla_attention(ql[:seqs], qp[:seqs], cache, sub, 192 ** -0.5)
        run(recorded, KERNELS)
        rows.append(np.asarray(out[0], np.float32))
        kernels.append(recorded[0].name)
    assert not counters.any() and set(kernels) == {mla.DECODE.name, mla.DECODE_W8.name}
    for other in rows[1:]:
        np.testing.assert_array_equal(other, rows[0])
