"""MoE on the GPU against the numpy reference ops on random inputs (skipped without one): router_logits, moe_route
(softmax greedy,
group-limited greedy, sigmoid noaux_tc; ties) and moe_experts (decode- and prefill-sized batches, an expert-parallel
shard, shapes off the tiles, routing decided on the device and replayed from a CUDA graph), in every implementation:
the grouped GEMMs (moe.py, their 128-row tiles on mma.sync and, on sm_90, on warpgroup MMA) and cuBLAS per expert
(moe_blas.py, with uneven loads and experts that get no rows)."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_cases import (  # noqa: F401  (the fixtures are used by name)
    BF16, DTYPES, after_inputs, captured, close, cp, dev, exact, host, own_stream, pdl, replayed, rnd)
from openinfer.kernels import numpy_mla_moe as ref
from openinfer.kernels.cuda import module, moe, moe_blas
from test_moe_blas_emulation import routing
from test_moe_emulation import route_config

pytestmark = pytest.mark.cuda
BF = DTYPES["bfloat16"]

ROUTERS = {
    "v2_lite_greedy": (64, route_config("softmax", "greedy")),
    "v2_group_limited": (160, route_config("softmax", "group_limited_greedy", 8, 3, scale=16.0)),
    "v3_noaux": (256, route_config("sigmoid", "noaux_tc", 8, 4, True, 2.5, 8)),
    "kimi_noaux_one_group": (384, route_config("sigmoid", "noaux_tc", 1, 1, True, 2.827, 8)),
    "glm_noaux": (256, route_config("sigmoid", "noaux_tc", 1, 1, True, 2.5, 8)),
    "qwen_style_norm": (128, route_config("softmax", "greedy", norm=True, top_k=8)),
}


@pytest.mark.parametrize("T,D,E", [(1, 2048, 64), (7, 2048, 64), (300, 64, 160), (5, 72, 384)])
def test_router_logits(T, D, E, pdl):
    """The gate in float32 from bf16 activations (a strided view, as a fused projection leaves them)."""
    rng = np.random.default_rng(T)
    wide = exact(rnd(rng, T, D + 8), BF16)
    w = rnd(rng, E, D, scale=D ** -0.5)
    got = moe.router_logits(dev(wide, BF16)[:, 4: 4 + D], cp.asarray(w))
    np.testing.assert_allclose(cp.asnumpy(got), ref.router_logits(wide[:, 4: 4 + D], w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("T", [1, 7, 300])
@pytest.mark.parametrize("case", list(ROUTERS))
def test_moe_route(case, T, pdl):
    E, cfg = ROUTERS[case]
    rng = np.random.default_rng(T + len(case))
    logits = rnd(rng, T, E, scale=2.0)
    bias = rnd(rng, E, scale=0.3) if cfg.method == "noaux_tc" else None
    want_ids, want_w = ref.moe_route(logits, bias, cfg)
    ids, w = moe.moe_route(cp.asarray(logits), None if bias is None else cp.asarray(bias), cfg)
    np.testing.assert_array_equal(cp.asnumpy(ids), want_ids)
    np.testing.assert_allclose(cp.asnumpy(w), want_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("T", [1, 7, 300])
@pytest.mark.parametrize("case", list(ROUTERS))
def test_moe_router_fused(case, T, pdl):
    """router_logits and moe_route in one launch: the two launches' ids exactly, their weights to the bit; the
    arrival counters are left zero (a CUDA graph replays it)."""
    E, cfg = ROUTERS[case]
    rng = np.random.default_rng(T + len(case))
    D = 256
    x, w = dev(exact(rnd(rng, T, D), BF16), BF16), cp.asarray(rnd(rng, E, D, scale=D ** -0.5))
    bias = cp.asarray(rnd(rng, E, scale=0.3)) if cfg.method == "noaux_tc" else None
    want_ids, want_w = moe.moe_route(moe.router_logits(x, w), bias, cfg)
    for _ in range(2):   # the second call finds the counters zero again
        ids, weights = moe.moe_router(x, w, bias, cfg)
        np.testing.assert_array_equal(cp.asnumpy(ids), cp.asnumpy(want_ids))
        np.testing.assert_array_equal(cp.asnumpy(weights), cp.asnumpy(want_w))
    assert not cp.asnumpy(module.arrival_counters("moe_router")).any()


def test_moe_router_replays_from_a_graph(pdl):
    """The fused router captured once: replays with other activations route on the device as the reference does."""
    E, cfg = ROUTERS["v3_noaux"]
    T, D = 5, 128
    rng = np.random.default_rng(9)
    w, bias = rnd(rng, E, D, scale=D ** -0.5), rnd(rng, E, scale=0.3)
    wd, bd, xd = cp.asarray(w), cp.asarray(bias), dev(exact(rnd(rng, T, D), BF16), BF16)
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with after_inputs(stream):
        moe.moe_router(xd, wd, bd, cfg)   # kernels and counters set up outside the capture
        (ids, weights), graph = captured(lambda: moe.moe_router(xd, wd, bd, cfg), stream, pool)
        for seed in range(2):
            x = exact(rnd(np.random.default_rng(100 + seed), T, D), BF16)
            xd.set(x.astype(BF16))
            graph.launch(stream)
            stream.synchronize()
            want_ids, want_w = ref.moe_router(x, w, bias, cfg)
            np.testing.assert_array_equal(cp.asnumpy(ids), want_ids)
            np.testing.assert_allclose(cp.asnumpy(weights), want_w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["v2_lite_greedy", "v2_group_limited", "v3_noaux"])
def test_moe_route_ties_go_to_the_lower_expert(case):
    """Logits from a handful of values: many exact ties among experts and among groups."""
    E, cfg = ROUTERS[case]
    rng = np.random.default_rng(3)
    logits = rng.integers(0, 3, (64, E)).astype(np.float32)
    bias = np.zeros(E, np.float32) if cfg.method == "noaux_tc" else None
    want_ids, want_w = ref.moe_route(logits, bias, cfg)
    ids, w = moe.moe_route(cp.asarray(logits), None if bias is None else cp.asarray(bias), cfg)
    np.testing.assert_array_equal(cp.asnumpy(ids), want_ids)
    np.testing.assert_allclose(cp.asnumpy(w), want_w, rtol=1e-5, atol=1e-6)


def _expert_inputs(T, D, I, E, k, n_ids, seed):
    """x, expert weights of E local experts, and a routing of T tokens over n_ids experts (k distinct each)."""
    rng = np.random.default_rng(seed)
    x = exact(rnd(rng, T, D), BF16)
    gate_up = exact(rnd(rng, E, 2 * I, D, scale=D ** -0.5), BF16)
    down = exact(rnd(rng, E, D, I, scale=I ** -0.5), BF16)
    ids = np.argsort(rng.random((T, n_ids)), axis=-1)[:, :k].astype(np.int32)
    weights = rng.random((T, k)).astype(np.float32)
    return x, gate_up, down, ids, weights


EXPERT_CASES = {
    # T, D, I, local experts, top-k, experts routed over, offset of the local ones
    "v2_lite_decode_1": (1, 2048, 1408, 8, 6, 8, 0),
    "v2_lite_decode_32": (32, 2048, 1408, 8, 6, 8, 0),
    "v2_lite_prefill": (512, 2048, 1408, 8, 6, 8, 0),
    "decode_64_experts": (4, 256, 128, 64, 6, 64, 0),
    "prefill_wide_tiles": (300, 256, 192, 16, 6, 16, 0),
    "prefill_narrow_tiles": (40, 128, 96, 16, 2, 16, 0),
    "ep_shard": (50, 256, 128, 4, 6, 12, 4),
    "ep_shard_wide": (400, 128, 64, 4, 6, 12, 8),
    "odd_shapes": (9, 72, 40, 5, 3, 5, 0),
}


@pytest.fixture(params=["grouped", "wgmma"])
def grouped(request):
    """The grouped GEMMs on mma.sync, and with their 128-row tiles on warpgroup MMA (sm_90 only)."""
    if request.param == "wgmma" and not module.hopper():
        pytest.skip("warpgroup MMA needs sm_90")
    return moe.moe_experts_wgmma if request.param == "wgmma" else moe.moe_experts


@pytest.mark.parametrize("case", list(EXPERT_CASES))
def test_moe_experts(case, grouped, pdl):
    T, D, I, E, k, n_ids, offset = EXPERT_CASES[case]
    x, gate_up, down, ids, weights = _expert_inputs(T, D, I, E, k, n_ids, len(case))
    want = ref.moe_experts(x, gate_up, down, ids, weights, offset)
    args = (dev(x, BF16), dev(gate_up, BF16), dev(down, BF16), cp.asarray(ids), cp.asarray(weights), offset)
    got = grouped(*args)
    close(got, want, BF)
    np.testing.assert_array_equal(host(grouped(*args)), host(got))   # deterministic
    shared = exact(np.random.default_rng(len(case)).standard_normal((T, D)).astype(np.float32), BF16)
    with_shared = grouped(*args, dev(shared, BF16))   # the shared experts' output, added by the combine
    close(with_shared, ref.moe_experts(x, gate_up, down, ids, weights, offset, shared), BF)


def test_moe_experts_no_token_routed_here():
    """A shard none of whose experts is chosen gives zeros."""
    x, gate_up, down, ids, weights = _expert_inputs(6, 64, 32, 4, 2, 4, 1)
    got = moe.moe_experts(dev(x, BF16), dev(gate_up, BF16), dev(down, BF16), cp.asarray(ids), cp.asarray(weights), 4)
    np.testing.assert_array_equal(host(got), np.zeros((6, 64), np.float32))


@pytest.mark.parametrize("T", [3, 200, 700])
def test_moe_route_and_experts_replay_from_a_graph(T, grouped):
    """Router and experts captured once: replays with other logits route on the device and match the reference."""
    E, cfg = ROUTERS["v2_lite_greedy"]
    D, I = 256, 128
    rng = np.random.default_rng(T)
    x, gate_up, down, _, _ = _expert_inputs(T, D, I, E, cfg.top_k, E, 11)
    xd, gud, dd = dev(x, BF16), dev(gate_up, BF16), dev(down, BF16)
    logits = cp.asarray(rnd(rng, T, E))
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with after_inputs(stream):
        def step():
            return grouped(xd, gud, dd, *moe.moe_route(logits, None, cfg), 0)
        step()   # kernels loaded outside the capture
        got, graph = captured(step, stream, pool)
        for seed in range(2):
            new = rnd(np.random.default_rng(100 + seed), T, E, scale=3.0)
            logits.set(new)
            ids, w = ref.moe_route(new, None, cfg)
            close(replayed(graph, stream, got), ref.moe_experts(x, gate_up, down, ids, w, 0), BF)


@pytest.mark.parametrize("case", list(EXPERT_CASES))
def test_moe_experts_cublas(case, pdl):
    """The cuBLAS path on the grouped kernel's cases: the reference within the same tolerance, deterministic, the
    addend added by the combine."""
    T, D, I, E, k, n_ids, offset = EXPERT_CASES[case]
    x, gate_up, down, ids, weights = _expert_inputs(T, D, I, E, k, n_ids, len(case))
    args = (dev(x, BF16), dev(gate_up, BF16), dev(down, BF16), cp.asarray(ids), cp.asarray(weights), offset)
    got = moe_blas.moe_experts_cublas(*args)
    close(got, ref.moe_experts(x, gate_up, down, ids, weights, offset), BF)
    np.testing.assert_array_equal(host(moe_blas.moe_experts_cublas(*args)), host(got))
    shared = exact(np.random.default_rng(len(case)).standard_normal((T, D)).astype(np.float32), BF16)
    close(moe_blas.moe_experts_cublas(*args, dev(shared, BF16)),
          ref.moe_experts(x, gate_up, down, ids, weights, offset, shared), BF)


@pytest.mark.parametrize("law", ["skewed", "same_experts"])
@pytest.mark.parametrize("T,E,offset", [(1024, 16, 0), (600, 8, 8), (5, 16, 0)])
def test_moe_experts_cublas_uneven(law, T, E, offset, grouped):
    """V2-Lite widths, routings that load a few experts heavily and leave others with no rows (an expert-parallel
    shard too): the reference, and the grouped GEMMs to bf16 rounding."""
    D, I, k = 2048, 1408, 6
    rng = np.random.default_rng(T + E)
    ids = routing(law, T, k, E + offset, rng).astype(np.int32)
    x, gate_up, down, _, weights = _expert_inputs(T, D, I, E, k, E, T)
    args = (dev(x, BF16), dev(gate_up, BF16), dev(down, BF16), cp.asarray(ids), cp.asarray(weights), offset)
    got = moe_blas.moe_experts_cublas(*args)
    close(got, ref.moe_experts(x, gate_up, down, ids, weights, offset), BF)
    close(got, host(grouped(*args)), BF)


def test_moe_experts_choice(monkeypatch):
    """moe_blas.moe_experts (the registry's "cublas"): cuBLAS at and above the threshold, the grouped GEMMs below it
    and inside a graph capture, where a replay with other logits still routes on the device."""
    E, cfg = ROUTERS["v2_lite_greedy"]
    T, D, I = 256, 256, 128
    for name in ("PREFILL_ROWS_PER_EXPERT", "PREFILL_ROWS_PER_EXPERT_SM90"):
        monkeypatch.setattr(moe_blas, name, T * cfg.top_k // E)   # 24 rows: T tokens exactly
    x, gate_up, down, _, _ = _expert_inputs(T, D, I, E, cfg.top_k, E, 5)
    xd, gud, dd = dev(x, BF16), dev(gate_up, BF16), dev(down, BF16)
    logits = cp.asarray(rnd(np.random.default_rng(5), T, E))
    ids, w = moe.moe_route(logits, None, cfg)
    assert moe_blas.uses_cublas(T, cfg.top_k, E) and not moe_blas.uses_cublas(T - 1, cfg.top_k, E)
    np.testing.assert_array_equal(host(moe_blas.moe_experts(xd, gud, dd, ids, w, 0)),
                                  host(moe_blas.moe_experts_cublas(xd, gud, dd, ids, w, 0)))
    below = moe.moe_experts_wgmma if module.hopper() else moe.moe_experts
    np.testing.assert_array_equal(host(moe_blas.moe_experts(xd[1:], gud, dd, ids[1:], w[1:], 0)),
                                  host(below(xd[1:], gud, dd, ids[1:], w[1:], 0)))   # also loads them
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with after_inputs(stream):
        def step():
            return moe_blas.moe_experts(xd, gud, dd, *moe.moe_route(logits, None, cfg), 0)
        got, graph = captured(step, stream, pool)   # a host read inside the capture would fail it
        new = rnd(np.random.default_rng(105), T, E, scale=3.0)
        logits.set(new)
        ids, w = ref.moe_route(new, None, cfg)
        close(replayed(graph, stream, got), ref.moe_experts(x, gate_up, down, ids, w, 0), BF)
