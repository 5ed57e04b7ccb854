"""CPU emulation of moe.cu (no GPU), driven by moe.py's recorded launches (fake_device.py): router_logits and
moe_route_f32 (lane by lane: warp shuffles, group selection, top-k rounds), moe_align's per-lane scans and tile
lists (its scatter in a random order within each expert, as the atomics may give), the grouped GEMM blocks lane by
lane over numpy "shared memory" (ldmatrix / mma.sync fragment models of test_attention_mma_emulation, cp.async
zero-fill) and the combine, against the numpy reference ops; and row_tiles' bound on the tiles any routing gives.
Shared memory starts as NaN, so a read of a pad or of a never-written word poisons the output. Mirrors the kernels:
change both together."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fake_device import flat, run
from openinfer.kernels.cuda import module, moe
from openinfer.kernels.cuda.module import BF16, NULL
from openinfer.kernels.cuda.moe import (GEMM_BK, GEMM_BN, GEMM_STAGES, METHODS, ROUTER_TOKENS, ROUTER_WARPS, gemm_smem,
                                        row_tiles)
from openinfer.kernels.numpy_mla_moe import (moe_experts as ref_moe_experts, moe_route as ref_moe_route,
                                             router_logits as ref_router_logits)
from openinfer.layers.moe import RouterConfig
from openinfer.testing.launch_check import fake, record_launches
from test_attention_mma_emulation import LANE, bf, ldmatrix_x4, mma

NW, LD = 4, GEMM_BK + 8
GID, TQ = LANE >> 2, LANE & 3


def emulate_align(call, rng):
    """moe_align on its recorded arguments: per-lane scans of the counts, the tile lists, the scatter in a random
    order within each expert (as the atomics may give)."""
    ids, pairs, e_local, e_offset, bm, sorted_pairs, tile_expert, tile_start, tile_end, num_tiles, row_of = call.args
    pairs, e_local, bm = int(pairs), int(e_local), int(bm)
    local = flat(ids)[:pairs].astype(np.int64) - int(e_offset)
    count = np.bincount(local[(local >= 0) & (local < e_local)], minlength=e_local)
    per = (e_local + 31) // 32
    lane_rows, lane_tiles = [], []
    for lane in range(32):
        e0, e1 = min(e_local, lane * per), min(e_local, lane * per + per)
        lane_rows.append(int(count[e0:e1].sum()))
        lane_tiles.append(int(sum((c + bm - 1) // bm for c in count[e0:e1])))
    row_off = np.cumsum(lane_rows) - lane_rows     # the exclusive scans
    tile_off = np.cumsum(lane_tiles) - lane_tiles
    flat(num_tiles)[0] = sum(lane_tiles)
    te, ts, tend, srt = flat(tile_expert), flat(tile_start), flat(tile_end), flat(sorted_pairs)
    cursor = np.zeros(e_local, np.int64)
    for lane in range(32):
        ro, to = int(row_off[lane]), int(tile_off[lane])
        for e in range(min(e_local, lane * per), min(e_local, lane * per + per)):
            c = int(count[e])
            cursor[e] = ro
            for i in range(0, c, bm):
                te[to], ts[to], tend[to] = e, ro + i, ro + c
                to += 1
            ro += c
    for p in rng.permutation(pairs):
        e = int(local[p])
        if 0 <= e < e_local:
            srt[cursor[e]] = p
            if row_of is not NULL:
                flat(row_of)[p] = cursor[e]
            cursor[e] += 1


class Bf16Rows:
    """moe_gemm.cuh's Bf16Experts on one expert's flat [rows, K] matrix: a stage holds the W rows' k tile (NaN
    where nothing was copied), read there by ldmatrix."""
    group_kk = 0

    def __init__(self, w, K, stages=GEMM_STAGES):
        self.w, self.K = w, K
        self.sw = np.full((stages, GEMM_BN, LD), np.nan, np.float32)

    def load(self, stage, k0, rows):
        for i in range(GEMM_BN * GEMM_BK // 8):
            r, c = divmod(i, GEMM_BK // 8)
            k = k0 + c * 8
            ok = rows[r] >= 0 and k < self.K
            self.sw[stage, r, c * 8: c * 8 + 8] = self.w[rows[r] * self.K + k:][:8] if ok else 0

    def tile(self, stage):
        return self.sw[stage].ravel()


def emulate_gemm_block(gate_up, a, a_stride, sorted_pairs, topk, wsrc, N, K, r0, r1, bx, mt, route_w, out,
                       out_stride, stages=GEMM_STAGES):
    """One moe_gemm block (n tile bx) of one tile, its cp.async ring of `stages`; a, out flat arrays; wsrc the weight
    policy's model at the tile's expert (Bf16Rows here, the INT4 / FP8 one in test_quant_gemm_emulation):
    load(stage, k0, rows), tile(stage) -> the flat bf16 [64, LD] tile, group_kk and scale(stage, r, g)."""
    BM = 16 * mt
    m = min(BM, r1 - r0)
    n0 = bx * (GEMM_BN // 2 if gate_up else GEMM_BN)
    pair_of = [int(sorted_pairs[r0 + i]) if i < m else -1 for i in range(BM)]
    a_rows = [None if p < 0 else (p // topk) * a_stride if gate_up else (r0 + i) * a_stride
              for i, p in enumerate(pair_of)]
    w_rows = []
    for r in range(GEMM_BN):
        col = n0 + (r % (GEMM_BN // 2) if gate_up else r)
        w_rows.append(-1 if col >= N else N + col if gate_up and r >= GEMM_BN // 2 else col)
    sa = np.full((stages, BM, LD), np.nan, np.float32)

    def load(stage, k0):
        for i in range(BM * (GEMM_BK // 8)):
            r, c = divmod(i, GEMM_BK // 8)
            k = k0 + c * 8
            sa[stage, r, c * 8: c * 8 + 8] = a[a_rows[r] + k:][:8] if a_rows[r] is not None and k < K else 0
        wsrc.load(stage, k0, w_rows)

    nk = (K + GEMM_BK - 1) // GEMM_BK
    for s in range(stages - 1):
        if s < nk:
            load(s, s * GEMM_BK)
    split_m = mt >= NW
    WM, WP = (mt // NW, GEMM_BN // 16) if split_m else (mt, GEMM_BN // 16 // NW)
    acc = np.zeros((NW, WM, WP, 2, 32, 4))
    part = np.zeros_like(acc)   # a scale group's sums
    aoff = ((LANE & 7) + ((LANE >> 3) & 1) * 8) * LD + (LANE >> 4) * 8
    brow = ((LANE >> 4) * (GEMM_BN // 2) if gate_up else (LANE >> 4) * 8) + (LANE & 7)
    pstride = 8 if gate_up else 16
    gk = wsrc.group_kk
    for kt in range(nk):
        pre = kt + stages - 1
        if pre < nk:
            load(pre % stages, pre * GEMM_BK)
        st, ws = sa[kt % stages].ravel(), wsrc.tile(kt % stages)
        for warp in range(NW):
            mbase, pbase = (warp * WM, 0) if split_m else (0, warp * WP)
            for kk in range(GEMM_BK // 16):
                af = [ldmatrix_x4(st, (mbase + t) * 16 * LD + aoff + kk * 16) for t in range(WM)]
                dst = part[warp] if gk else acc[warp]
                if gk and kk % gk == 0:
                    dst[...] = 0
                for pp in range(WP):
                    b = ldmatrix_x4(ws, (pbase + pp) * pstride * LD + brow * LD + ((LANE >> 3) & 1) * 8 + kk * 16)
                    for t in range(WM):
                        mma(dst[t, pp, 0], af[t], b[:, 0], b[:, 1])
                        mma(dst[t, pp, 1], af[t], b[:, 2], b[:, 3])
                if gk and kk % gk == gk - 1:   # the group's sums times each lane's W row scale
                    for pp in range(WP):
                        for j in range(2):
                            for c in range(2):
                                r = (j * (GEMM_BN // 2) + 8 * (pbase + pp) if gate_up
                                     else 16 * (pbase + pp) + 8 * j) + 2 * TQ + c
                                sc = np.array([wsrc.scale(kt % GEMM_STAGES, int(x), kk // gk) for x in r])
                                for h in range(2):
                                    acc[warp, :, pp, j, :, 2 * h + c] += sc * part[warp, :, pp, j, :, 2 * h + c]
    for warp in range(NW):
        mbase, pbase = (warp * WM, 0) if split_m else (0, warp * WP)
        for t in range(WM):
            for h in range(2):
                for ln in range(32):
                    row = (mbase + t) * 16 + GID[ln] + 8 * h
                    if row >= m:
                        continue
                    for pp in range(WP):
                        for c in range(2):
                            if gate_up:
                                col = n0 + 8 * (pbase + pp) + 2 * TQ[ln] + c
                                if col < N:
                                    g, u = acc[warp, t, pp, 0, ln, 2 * h + c], acc[warp, t, pp, 1, ln, 2 * h + c]
                                    out[(r0 + row) * out_stride + col] = bf(g / (1 + np.exp(-g)) * u)
                            else:
                                p = pair_of[row]
                                for j in range(2):
                                    col = n0 + 16 * (pbase + pp) + 8 * j + 2 * TQ[ln] + c
                                    if col < N:
                                        out[p * out_stride + col] = route_w[p] * acc[warp, t, pp, j, ln, 2 * h + c]


def kernel_form(name):
    """(MT, stages) of a moe_gemm kernel's name: ..._m<MT>[_s<stages>]."""
    mt, _, stages = name.rsplit("_m", 1)[1].partition("_s")
    return int(mt), int(stages or GEMM_STAGES)


def emulate_tiles(call, expert_weights):
    """Every used tile's blocks of a moe_gemm launch (gate_up or down, from its name), its first four and last five
    arguments as moe.cu's and quant.cu's kernels share them; expert_weights(e, N, K, stages) -> the weight model."""
    gate_up = call.name.startswith("moe_gate_up")
    mt, stages = kernel_form(call.name)
    a, a_stride, sorted_pairs, topk = call.args[:4]
    N, K, te, ts, tend, num_tiles = call.args[6:12]
    route_w, out, out_stride = (None, *call.args[12:]) if gate_up else call.args[12:]
    af, srt = flat(a).astype(np.float32), flat(sorted_pairs)
    used = int(flat(num_tiles)[0])
    assert used <= call.grid[1]
    for slot in range(used):
        e, r0, r1 = int(flat(te)[slot]), int(flat(ts)[slot]), int(flat(tend)[slot])
        for bx in range(call.grid[0]):
            emulate_gemm_block(gate_up, af, int(a_stride), srt, int(topk), expert_weights(e, int(N), int(K), stages),
                               int(N), int(K), r0, r1, bx, mt, None if route_w is None else flat(route_w), flat(out),
                               int(out_stride), stages)
    return mt


def emulate_gemm(call):
    """moe_gate_up_bf16 / moe_down_bf16 on their recorded arguments."""
    w, w_expert_stride = call.args[4:6]
    wf = flat(w).astype(np.float32)
    mt = emulate_tiles(call, lambda e, N, K, stages: Bf16Rows(wf[e * int(w_expert_stride):], K, stages))
    assert call.smem == gemm_smem(mt, stages=kernel_form(call.name)[1])


def emulate_combine(call):
    """moe_combine_bf16: the pairs' weighted rows, or (row_of and route_w given) sorted rows times their weights."""
    y, ids, topk, e_local, e_offset, D, addend, row_of, route_w, out = call.args
    assert (row_of is NULL) == (route_w is NULL)
    yf, idf, of = flat(y), flat(ids), flat(out)
    k, D = int(topk), int(D)
    for t in range(call.grid[0]):
        acc = np.zeros(D, np.float32)
        for j in range(k):
            p = t * k + j
            if not 0 <= idf[p] - int(e_offset) < int(e_local):
                continue
            if row_of is NULL:
                acc += yf[p * D:][:D]
            else:
                acc += flat(route_w)[p] * yf[int(flat(row_of)[p]) * D:][:D]
        if addend is not NULL:
            acc += flat(addend)[t * D:][:D].astype(np.float32)
        of[t * D: (t + 1) * D] = acc


def emulate_route_call(call):
    x, stride, bias, T, E, k, sigmoid, method, n_group, topk_group, norm, scale, ids, weights = call.args
    cfg = RouterConfig(int(k), "sigmoid" if sigmoid else "softmax", list(METHODS)[int(method)], int(n_group),
                       int(topk_group), bool(norm), float(scale))
    xf, idf, wf = flat(x), flat(ids), flat(weights)
    b = None if bias is NULL else flat(bias)[: int(E)]
    for t in range(int(T)):
        got_ids, got_w = emulate_route(xf[t * int(stride):][: int(E)], b, cfg)
        idf[t * int(k): (t + 1) * int(k)] = got_ids
        wf[t * int(k): (t + 1) * int(k)] = got_w


def emulate_router_logits(call):
    x, stride, w, T, E, D, out = call.args
    T, E, D = int(T), int(E), int(D)
    xf, wf = flat(x).astype(np.float32), flat(w)
    rows = np.stack([xf[t * int(stride):][:D] for t in range(T)])
    flat(out)[: T * E] = (rows @ wf[: E * D].reshape(E, D).T).ravel()
    assert call.grid == (-(-E // ROUTER_WARPS), -(-T // ROUTER_TOKENS))


def emulate_router_call(call):
    """moe_router_bf16: router_logits_bf16's blocks, then each token group's last block routes it (the counters:
    zero on entry, left zero)."""
    x, stride, w, T, E, D, logits, counters, bias, *route, ids, weights = call.args
    assert not flat(counters)[: call.grid[1]].any()
    emulate_router_logits(SimpleNamespace(args=(x, stride, w, T, E, D, logits), grid=call.grid))
    emulate_route_call(SimpleNamespace(args=(logits, E, bias, T, E, *route, ids, weights)))


@pytest.fixture
def launches(monkeypatch):
    counters = fake(np.zeros(module.COUNTER_SLOTS, np.int32))
    monkeypatch.setattr(moe, "arrival_counters", lambda purpose: counters)
    return record_launches(monkeypatch, (moe, module))


def kernels(rng):
    return {"moe_align": lambda c: emulate_align(c, rng), "moe_gate_up": emulate_gemm, "moe_down": emulate_gemm,
            "moe_combine": emulate_combine, "moe_route": emulate_route_call, "router_logits": emulate_router_logits,
            "moe_router": emulate_router_call}


# T, D, I, local experts, top-k, experts routed over, offset: two k tiles with a ragged last one (D 72 = 64 + 8,
# I 40), outputs off the n tiles, an expert-parallel shard, 128-row tiles (>= 64 rows an expert on average, two
# tiles an expert)
# T, D, I, E, k, ids' range, expert offset; the 16-row tiles at six stages up to 32 tokens, at three past them
CASES = {"narrow": (5, 72, 40, 3, 2, 3, 0), "shard": (6, 64, 32, 2, 3, 6, 2), "batch": (40, 72, 40, 4, 2, 4, 0),
         "wide": (150, 72, 40, 2, 2, 2, 0)}
FORMS = {"narrow": "m1_s6", "shard": "m1_s6", "batch": "m1", "wide": "m8"}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_addend", [False, True])
def test_moe_experts_emulation(case, with_addend, launches):
    """moe.moe_experts on a strided x (and a shared-expert addend), its four launches emulated, against
    numpy_mla_moe.moe_experts."""
    T, D, I, E, k, n_ids, offset = CASES[case]
    rng = np.random.default_rng(len(case))
    wide = fake(rng.standard_normal((T, D + 8)), BF16)
    x = wide[:, 8:]
    gate_up = fake(rng.standard_normal((E, 2 * I, D)) * D ** -0.5, BF16)
    down = fake(rng.standard_normal((E, D, I)) * I ** -0.5, BF16)
    ids = fake(np.argsort(rng.random((T, n_ids)), axis=-1)[:, :k].astype(np.int32))
    weights = fake(rng.random((T, k)).astype(np.float32))
    addend = fake(rng.standard_normal((T, D)), BF16) if with_addend else None
    y = moe.moe_experts(x, gate_up, down, ids, weights, offset, addend)
    assert [c.name for c in launches][1:3] == [f"moe_gate_up_bf16_{FORMS[case]}", f"moe_down_bf16_{FORMS[case]}"]
    run(launches, kernels(rng))
    f64 = [np.asarray(a, np.float64) for a in (x, gate_up, down)]
    want = ref_moe_experts(*f64, np.asarray(ids), np.asarray(weights), offset,
                           None if addend is None else np.asarray(addend, np.float64))
    np.testing.assert_allclose(np.asarray(y, np.float32), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("mt", [1, 8])
def test_row_tiles_bound_every_routing(mt):
    """The GEMM grids' tile count: never fewer than the tiles of skewed, spread or one-expert routings."""
    rng = np.random.default_rng(mt)
    for T, k, E in [(1, 6, 64), (5, 6, 64), (33, 8, 16), (300, 6, 64), (7, 2, 3), (1000, 8, 384)]:
        for ids in (rng.integers(0, E, (T, k)), np.zeros((T, k), int), np.arange(T * k).reshape(T, k) % E,
                    np.minimum(rng.geometric(0.3, (T, k)) - 1, E - 1)):
            tiles = sum(-(-c // (16 * mt)) for c in np.bincount(ids.ravel(), minlength=E))
            assert tiles <= row_tiles(T * k, E, mt)


def route_config(scoring, method, n_group=1, topk_group=1, norm=False, scale=1.0, top_k=6):
    return RouterConfig(top_k, scoring, method, n_group, topk_group, norm, scale)


def _butterfly(better, *vals):
    """A warp's xor-shuffle reduction: each step a lane takes its partner's values where better(partner, own)."""
    vals = [v.copy() for v in vals]
    for o in (16, 8, 4, 2, 1):
        other = [v[LANE ^ o] for v in vals]
        take = better(other, vals)
        vals = [np.where(take, ov, v) for ov, v in zip(other, vals)]
    return vals


def _route_better(a, b):
    return (a[0] > b[0]) | ((a[0] == b[0]) & (a[1] < b[1]))


def emulate_route(x, bias, cfg):
    """moe_route_f32's warp for one token, lane by lane (float32 as the kernel computes)."""
    E, k, method = len(x), cfg.top_k, {"greedy": 0, "group_limited_greedy": 1, "noaux_tc": 2}[cfg.method]
    e = LANE[:, None] + 32 * np.arange(16)[None, :]
    valid = e < E
    f32 = np.float32
    with np.errstate(over="ignore", invalid="ignore"):
        score = np.where(valid, x[np.minimum(e, E - 1)], -np.inf).astype(f32)
        if cfg.scoring == "sigmoid":
            score = (f32(1) / (f32(1) + np.exp(-score))).astype(f32)
        else:
            score = np.where(valid, np.exp(score - score.max()), f32(0)).astype(f32)
            score = (score / score.sum(dtype=f32)).astype(f32)
    choice = np.where(valid, score + (bias[np.minimum(e, E - 1)] if bias is not None else 0), -np.inf).astype(f32)
    if method and cfg.n_group > 1:
        gs = E // cfg.n_group
        gscore = np.full(32, -np.inf, f32)
        for g in range(cfg.n_group):
            a1, a2 = np.full(32, -np.inf, f32), np.full(32, -np.inf, f32)
            for j in range(16):
                v = choice[:, j]
                mine = valid[:, j] & (e[:, j] // gs == g)
                up1 = mine & (v > a1)
                up2 = mine & ~up1 & (v > a2)
                a2 = np.where(up1, a1, np.where(up2, v, a2))
                a1 = np.where(up1, v, a1)
            for o in (16, 8, 4, 2, 1):
                b1, b2 = a1[LANE ^ o], a2[LANE ^ o]
                a1, a2 = np.maximum(a1, b1), np.maximum(np.minimum(a1, b1), np.maximum(a2, b2))
            gscore[g] = a1[0] + a2[0] if method == 2 else a1[0]
        keep = 0
        for _ in range(cfg.topk_group):
            free = (LANE < cfg.n_group) & ~((keep >> LANE) & 1).astype(bool)
            v, g = _butterfly(_route_better, np.where(free, gscore[np.minimum(LANE, 31)], -np.inf),
                              np.where(free, LANE, 2**31 - 1))
            keep |= 1 << int(g[0])
        choice = np.where(valid & ~((keep >> (e // gs)) & 1).astype(bool), -np.inf if method == 2 else 0.0,
                          choice).astype(f32)
    taken = np.zeros((32, 16), bool)
    ids, ws = [], []
    for _ in range(k):
        v, best, w = np.full(32, -np.inf, f32), np.full(32, 2**31 - 1), np.zeros(32, f32)
        for j in range(16):
            ok = valid[:, j] & ~taken[:, j] & _route_better((choice[:, j], e[:, j]), (v, best))
            v, best = np.where(ok, choice[:, j], v), np.where(ok, e[:, j], best)
            w = np.where(ok, score[:, j], w)
        v, best, w = _butterfly(_route_better, v, best, w)
        taken[int(best[0]) & 31, int(best[0]) >> 5] = True
        ids.append(int(best[0]))
        ws.append(w[0])
    ws = np.array(ws, f32)
    if cfg.norm_topk_prob:
        ws = ws / (ws.sum(dtype=f32) + f32(1e-20))
    return np.array(ids, np.int32), (ws * f32(cfg.routed_scaling_factor)).astype(f32)


ROUTE_CASES = {
    "v2_lite_greedy": (64, route_config("softmax", "greedy")),
    "v2_group_limited": (160, route_config("softmax", "group_limited_greedy", 8, 3, scale=16.0)),
    "v3_noaux": (256, route_config("sigmoid", "noaux_tc", 8, 4, True, 2.5, 8)),
    "kimi_one_group": (384, route_config("sigmoid", "noaux_tc", 1, 1, True, 2.827, 8)),
    "odd_experts": (37, route_config("softmax", "greedy", norm=True, top_k=5)),
}


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("case", list(ROUTE_CASES))
def test_moe_route_emulation(case, ties, launches):
    """router_logits then moe_route through their wrappers, and moe_router (both in one launch), emulated
    (moe_route_f32 lane by lane), against the numpy references; logits from a handful of values give exact ties
    among experts and groups."""
    E, cfg = ROUTE_CASES[case]
    rng = np.random.default_rng(E)
    T, D = 6, 16
    x = fake(rng.integers(-1, 2, (T, D)) if ties else rng.standard_normal((T, D)), BF16)
    gate = fake((rng.integers(0, 2, (E, D)) if ties else rng.standard_normal((E, D))).astype(np.float32))
    bias = fake((0.3 * rng.standard_normal(E)).astype(np.float32)) if cfg.method == "noaux_tc" and not ties else None
    ids, w = moe.moe_route(moe.router_logits(x, gate), bias, cfg)
    run(launches, kernels(rng))
    logits = ref_router_logits(np.asarray(x, np.float32), np.asarray(gate))
    want_ids, want_w = ref_moe_route(logits, None if bias is None else np.asarray(bias), cfg)
    np.testing.assert_array_equal(np.asarray(ids), want_ids)
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=1e-5, atol=1e-6)
    launches.clear()
    fused_ids, fused_w = moe.moe_router(x, gate, bias, cfg)
    assert [c.name for c in launches] == ["moe_router_bf16"] and launches[0].grid == (-(-E // ROUTER_WARPS), 2)
    run(launches, kernels(rng))
    np.testing.assert_array_equal(np.asarray(fused_ids), want_ids)
    np.testing.assert_array_equal(np.asarray(fused_w), np.asarray(w))
