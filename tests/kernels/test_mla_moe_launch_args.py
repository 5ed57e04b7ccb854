"""CPU check of the MLA and MoE launches (mla.py, moe.py) against the kernels' compiled parameter lists (no GPU),
through openinfer.testing.launch_check, and of the grids they choose: decode splits in thread-block clusters and their
partials, launches of as many sequences as the arrival counters fit, one CTA for longer runs, router and expert-GEMM
grids sized from the token count alone."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("cupy")
from openinfer.engine.batch import ForwardBatch  # noqa: E402
from openinfer.kernels.cuda import attention_decode, blas, mla, module, moe  # noqa: E402
from openinfer.testing.launch_check import aligned_empty, fake, record_launches  # noqa: E402
from test_mla_emulation import cluster_device  # noqa: E402
from test_moe_emulation import route_config  # noqa: E402

BF16 = module.BF16


@pytest.fixture
def launches(monkeypatch):
    recorded = record_launches(monkeypatch, (blas, mla, moe, module))
    monkeypatch.setattr(attention_decode, "sm_count", lambda: 132)
    cluster_device(monkeypatch, mla)
    counters = aligned_empty((module.COUNTER_SLOTS,), np.int32)
    monkeypatch.setattr(mla, "arrival_counters", lambda purpose: counters)
    monkeypatch.setattr(moe, "arrival_counters", lambda purpose: counters)
    return recorded


def _batch(q_lens, ctx, bs) -> ForwardBatch:
    qstart = np.concatenate(([0], np.cumsum(q_lens))).astype(np.int32)
    T, width = int(qstart[-1]), -(-max(ctx) // bs)
    tables = np.arange(len(ctx) * width, dtype=np.int32).reshape(len(ctx), width) + 1
    return ForwardBatch(fake(np.zeros(T, np.int32)), fake(np.arange(T, dtype=np.int32)),
                        fake(np.arange(T, dtype=np.int64)), fake(tables), fake(qstart),
                        fake(np.asarray(ctx, np.int32)), fake(qstart[1:] - 1), qstart, np.asarray(ctx, np.int32),
                        bs, int(max(q_lens)), int(max(ctx)))


def _mla_inputs(T, nh, ctx, bs):
    pool = aligned_empty((1 + len(ctx) * -(-max(ctx) // bs), 3, bs, mla.ROW), BF16)   # [blocks, layer, ...]
    wide = aligned_empty((T, nh * mla.ROW + 8), BF16)   # q_latent and q_pe: slices of one projection
    ql = wide[:, : nh * mla.LATENT].reshape(T, nh, mla.LATENT)
    qp = wide[:, nh * mla.LATENT: nh * mla.ROW].reshape(T, nh, mla.ROPE)
    return ql, qp, pool[:, 1]


@pytest.mark.parametrize("nh", [16, 64, 4])
@pytest.mark.parametrize("q_lens,ctx", [([1], [5000]), ([1], [1024]), ([1, 1, 1], [5000, 17, 900]),
                                         ([1] * 32, [1024] * 32), ([1] * 64, [30] * 64), ([1] * 128, [1024] * 128),
                                         ([1] * 300, [40] * 300), ([7, 1, 33], [7, 40, 300])])
def test_mla_attention_launch_args(launches, nh, q_lens, ctx):
    T, bs = sum(q_lens), 16
    ql, qp, cache = _mla_inputs(T, nh, ctx, bs)
    mla.mla_attention(ql, qp, cache, _batch(q_lens, ctx, bs), 192 ** -0.5)
    (call,) = launches
    x, tiles, seqs = call.grid
    kernel = mla.PREFILL if max(q_lens) > 1 else mla.DECODE_W8 if seqs * tiles <= mla.W8_MAX_TILES else mla.DECODE
    assert call.name == kernel.name and call.smem == kernel.smem and call.block == kernel.threads and seqs == len(ctx)
    assert tiles == -(-max(q_lens) * nh // kernel.rows)
    split_keys, near, cap, slots, cs = (int(a) for a in call.args[-5:])
    groups = x // cs
    assert call.cluster == ((cs, 1, 1) if cs > 1 else None) and split_keys == mla.SPLIT_KEYS
    if max(q_lens) > 1:   # runs of several tokens are never split
        assert x == 1 and call.cluster is None and (near, cap, slots) == (1, 1, 1) and call.args[12] is module.NULL
        return
    # decode: clusters of 2 whatever the batch; partial slots for the longest context's clusters (4 of 128-key CTAs
    # up to 1k keys, then of 512-key CTAs, 16 at most); no more groups than slots, nor than one wave of clusters holds
    keys = max(ctx)
    assert cs == 2 and (near, cap) == (mla.NEAR_CLUSTERS, mla.MAX_CLUSTERS)
    assert slots == max(min(4, -(-keys // 256)), min(16, -(-keys // 1024)))
    assert groups <= slots and (groups == 1 or groups * seqs * tiles <= 256 // cs)
    assert (call.args[12] is module.NULL) == (slots == 1)
    if slots > 1:   # partials: o [B, nh, slots, 512], m and l [cs, B, nh, slots] a rank, cs counters a work item
        part_o, part_m, part_l = call.args[12:15]
        assert part_o.shape == (seqs, nh, slots, mla.LATENT) and part_m.shape == part_l.shape == (cs, seqs, nh, slots)
        assert cs * seqs * tiles <= module.COUNTER_SLOTS
    if (seqs, nh) == (1, 16):   # one sequence fills the grid with its clusters
        assert (groups, slots) == ((5, 5) if keys == 5000 else (4, 4))
    if (seqs, nh, keys) in ((32, 16, 1024), (128, 16, 1024)):   # 128 clusters of 2 at once: fewer groups
        assert (groups, slots) == ((4, 4) if seqs == 32 else (1, 4))


def test_mla_decode_counters_per_launch(launches, monkeypatch):
    """A decode batch whose (rank, sequence, row tile) counters outnumber COUNTER_SLOTS runs in launches of as many
    sequences as fit them, each on its own slices of the batch's rows (the split, from the keys, is the same)."""
    monkeypatch.setattr(mla, "MAX_CLUSTER", 8)
    nh, ctx, bs = 128, [2000] * 70, 16   # 8 row tiles x clusters of 8: 64 sequences a launch
    ql, qp, cache = _mla_inputs(len(ctx), nh, ctx, bs)
    batch = _batch([1] * len(ctx), ctx, bs)
    mla.mla_attention(ql, qp, cache, batch, 192 ** -0.5)
    assert [c.grid for c in launches] == [(8, 8, 64), (8, 8, 6)]
    for call, b0 in zip(launches, (0, 64)):
        tables, qstart, ctx_arg = call.args[7], call.args[9], call.args[10]
        assert tables.data.ptr == batch.block_tables[b0:].data.ptr
        assert qstart.data.ptr == batch.query_start[b0:].data.ptr
        assert ctx_arg.data.ptr == batch.context_lens[b0:].data.ptr and int(call.args[-2]) == 2


def test_mla_write_latent_launch_args(launches):
    T, bs = 5, 64
    kv = aligned_empty((T, mla.ROW + 16), BF16)   # c, k_pe and more of one projection row
    pool = aligned_empty((4, 2, bs, mla.ROW), BF16)
    mla.mla_write_latent(pool[:, 1], kv[:, : mla.LATENT], kv[:, mla.LATENT: mla.ROW], np.arange(T, dtype=np.int64))
    (call,) = launches
    assert call.grid == (T,) and int(call.args[1]) == 2 * bs * mla.ROW


def test_mla_rope_write_launch_args(launches):
    T, nh, dn, bs = 7, 16, 128, 64
    row = aligned_empty((T, nh * (dn + mla.ROPE) + mla.ROW), BF16)   # the fused q_proj + kv_a_proj_with_mqa output
    q, kv = row[:, : nh * (dn + mla.ROPE)].reshape(T, nh, dn + mla.ROPE), row[:, nh * (dn + mla.ROPE):]
    pool = aligned_empty((4, 2, bs, mla.ROW), BF16)
    tables = aligned_empty((100, mla.ROPE // 2), np.float32)
    q_pe = mla.mla_rope_write(q[:, :, dn:], kv, aligned_empty((mla.LATENT,), BF16), 1e-6,
                              fake(np.arange(T, dtype=np.int32)), tables, tables, pool[:, 1],
                              fake(np.arange(T, dtype=np.int64)))
    (call,) = launches
    assert call.name == "mla_rope_write_bf16" and call.grid == (T,) and q_pe.shape == (T, nh, mla.ROPE)
    assert int(call.args[4]) == row.shape[1] and int(call.args[13]) == 2 * bs * mla.ROW
    with pytest.raises(ValueError, match="mla_rope_write"):
        mla.mla_rope_write(q[:, :, dn:], kv[:, :-8], aligned_empty((mla.LATENT,), BF16), 1e-6,
                           fake(np.arange(T, dtype=np.int32)), tables, tables, pool[:, 1],
                           fake(np.arange(T, dtype=np.int64)))


def test_mla_rejects_a_cache_of_another_width(launches):
    ql, qp, _ = _mla_inputs(1, 16, [10], 16)
    with pytest.raises(ValueError, match="latent cache"):
        mla.mla_attention(ql, qp, aligned_empty((4, 16, 512), BF16), _batch([1], [10], 16), 0.1)


@pytest.mark.parametrize("E,cfg,bias", [(64, route_config("softmax", "greedy"), False),
                                        (160, route_config("softmax", "group_limited_greedy", 8, 3), False),
                                        (384, route_config("sigmoid", "noaux_tc", 1, 1, True, 2.8, 8), True)])
def test_moe_route_launch_args(launches, E, cfg, bias):
    T = 9
    ids, w = moe.moe_route(aligned_empty((T, E), np.float32), aligned_empty((E,), np.float32) if bias else None, cfg)
    (call,) = launches
    assert call.grid == (-(-T // moe.ROUTE_WARPS),) and ids.shape == w.shape == (T, cfg.top_k)
    launches.clear()   # the fused router: one launch on router_logits' grid
    ids, w = moe.moe_router(aligned_empty((T, 2048), BF16), aligned_empty((E, 2048), np.float32),
                            aligned_empty((E,), np.float32) if bias else None, cfg)
    (call,) = launches
    assert call.name == "moe_router_bf16" and call.grid == (-(-E // moe.ROUTER_WARPS), -(-T // moe.ROUTER_TOKENS))
    assert ids.shape == w.shape == (T, cfg.top_k)


def test_moe_router_falls_back_to_two_launches_without_counters(launches, monkeypatch):
    """A first call inside a graph capture has no arrival counters: router_logits then moe_route."""
    monkeypatch.setattr(moe, "arrival_counters", lambda purpose: None)
    moe.moe_router(aligned_empty((3, 64), BF16), aligned_empty((8, 64), np.float32), None,
                   route_config("softmax", "greedy", top_k=2))
    assert [c.name for c in launches] == ["router_logits_bf16", "moe_route_f32"]


@pytest.mark.parametrize("cfg,E", [(route_config("softmax", "beam"), 64), (route_config("softmax", "greedy"), 1024),
                                   (route_config("softmax", "group_limited_greedy", 7, 3), 64)])
def test_moe_route_rejects_what_it_cannot_compute(launches, cfg, E):
    with pytest.raises(ValueError, match="moe_route"):
        moe.moe_route(aligned_empty((2, E), np.float32), None, cfg)


@pytest.mark.parametrize("T,E,k,wide", [(1, 64, 6, False), (32, 64, 6, False), (33, 64, 6, False),
                                         (700, 64, 6, True), (512, 8, 8, True), (3, 4, 2, False)])
@pytest.mark.parametrize("impl", ["moe_experts", "moe_experts_wgmma"])
def test_moe_experts_launch_args(launches, T, E, k, wide, impl):
    D, I = 2048, 1408
    x = aligned_empty((T, D), BF16)
    gate_up, down = aligned_empty((E, 2 * I, D), BF16), aligned_empty((E, D, I), BF16)
    y = getattr(moe, impl)(x, gate_up, down, fake(np.zeros((T, k), np.int32)), fake(np.zeros((T, k), np.float32)),
                           0, aligned_empty((T, D), BF16))   # the shared experts' output, added by the combine
    assert y.shape == (T, D) and y.dtype == BF16
    align, gate, dn, combine = launches
    mt = 8 if wide else 1
    tiles = moe.row_tiles(T * k, E, mt)
    assert align.name == "moe_align" and combine.name == "moe_combine_bf16"
    if wide and impl == "moe_experts_wgmma":
        assert gate.name == "moe_gate_up_bf16_wgmma" and gate.grid == (I // 64, tiles)
        assert dn.name == "moe_down_bf16_wgmma" and dn.grid == (D // 128, tiles)
        assert gate.block == dn.block == 256 and gate.smem == dn.smem == moe.wgmma_smem() <= 227 * 1024
        return
    stages = 6 if T <= 32 and not wide else 3   # six stages for the 16-row tiles up to 32 tokens
    form = f"m{mt}" + ("_s6" if stages == 6 else "")
    assert gate.name == f"moe_gate_up_bf16_{form}" and gate.grid == (I // 32, tiles)
    assert dn.name == f"moe_down_bf16_{form}" and dn.grid == (D // 64, tiles)
    assert gate.smem == dn.smem == moe.gemm_smem(mt, stages=stages) <= 227 * 1024


def test_moe_experts_rejects_mismatched_weights(launches):
    x = aligned_empty((2, 64), BF16)
    with pytest.raises(ValueError, match="moe_experts"):
        moe.moe_experts(x, aligned_empty((4, 64, 64), BF16), aligned_empty((4, 64, 16), BF16),
                        fake(np.zeros((2, 2), np.int32)), fake(np.zeros((2, 2), np.float32)), 0)
    with pytest.raises(ValueError, match="addend"):
        moe.moe_experts(x, aligned_empty((4, 64, 64), BF16), aligned_empty((4, 64, 32), BF16),
                        fake(np.zeros((2, 2), np.int32)), fake(np.zeros((2, 2), np.float32)), 0,
                        aligned_empty((2, 64), np.float32))


def test_mla_rope_launch_args(launches):
    T, nh, dn = 7, 16, 128
    q = aligned_empty((T, nh, dn + mla.ROPE), BF16)
    kv = aligned_empty((T, mla.ROW), BF16)
    tables = aligned_empty((100, mla.ROPE // 2), np.float32)
    q_pe, k_pe = mla.mla_rope(q[:, :, dn:], kv[:, mla.LATENT:], np.arange(T, dtype=np.int32), tables, tables)
    (call,) = launches
    assert call.grid == (T,) and q_pe.shape == (T, nh, mla.ROPE) and k_pe.shape == (T, mla.ROPE)
    assert [int(a) for a in (call.args[1], call.args[2], call.args[4])] == [nh * (dn + mla.ROPE), dn + mla.ROPE,
                                                                            mla.ROW]


def test_router_logits_launch_args(launches):
    out = moe.router_logits(aligned_empty((9, 2048), BF16), aligned_empty((64, 2048), np.float32))
    (call,) = launches
    assert call.grid == (64 // moe.ROUTER_WARPS, -(-9 // moe.ROUTER_TOKENS)) and out.shape == (9, 64)


@pytest.mark.parametrize("T", [1, 3, 8])
def test_per_head_linear_gemv_launch_args(launches, T):
    """Up to GEMV_MAX_M tokens: gemv.cu's per-head GEMV, one CTA per 16 output rows of a head (grid z: the heads),
    x's token and head strides (q_nope, a slice of q), W_UV's row and head strides (a view of kv_b_proj)."""
    H, dn, P, R, dv = 16, 128, 64, 512, 128
    q = aligned_empty((T, H, dn + P), BF16)
    w_uk_t = aligned_empty((H, R, dn), BF16)
    q_latent = blas.per_head_linear(q[:, :, :dn], w_uk_t)
    kv_b = aligned_empty((H, dn + dv, R), BF16)
    out = blas.per_head_linear(aligned_empty((T, H, R), BF16), kv_b[:, dn:])
    uk, uv = launches
    assert q_latent.shape == (T, H, R) and out.shape == (T, H, dv)
    assert [(c.source, c.name) for c in launches] == [("gemv", "gemv_heads_bf16")] * 2
    assert uk.grid == (R // 16, 1, H) and uv.grid == (dv // 16, 1, H) and uk.block == 128
    assert [int(a) for a in uk.args[1:3] + uk.args[4:8] + uk.args[9:]] == [H * (dn + P), dn + P, dn, R * dn, T,
                                                                            dn // 8, H * R, R, R]
    assert [int(a) for a in uv.args[1:3] + uv.args[4:8] + uv.args[9:]] == [H * R, R, R, (dn + dv) * R, T, R // 8,
                                                                            H * dv, dv, dv]


def test_per_head_linear_cublas_arguments(launches, monkeypatch):
    """Past GEMV_MAX_M tokens: y_h^T [out, T] = op_T(w_h) [out, in] @ x_h^T: m = out, n = T, k = in; x's token and
    head strides as ldb and strideB; y [T, H, out] packed: ldc = H * out, strideC = out."""
    calls = []
    lib = SimpleNamespace(cublasGemmStridedBatchedEx=lambda *a: calls.append(a) or 0)
    handle = SimpleNamespace(lib=lib, bind=lambda stream: 1)
    monkeypatch.setattr(blas, "_handles", {(0, "default"): handle})
    monkeypatch.setattr(blas.cp, "cuda", SimpleNamespace(Device=lambda: SimpleNamespace(id=0),
                                                         get_current_stream=lambda: SimpleNamespace(ptr=0)),
                        raising=False)
    T, H, dn, P, R = blas.GEMV_MAX_M + 1, 16, 128, 64, 512
    q = aligned_empty((T, H, dn + P), BF16)
    w = aligned_empty((H, R, dn), BF16)
    out = blas.per_head_linear(q[:, :, :dn], w)
    (a,) = calls
    assert not launches
    assert out.shape == (T, H, R)
    assert a[1:6] == (1, 0, R, T, dn)                                   # op_T(w), op_N(x): m, n, k
    assert (a[9], a[10]) == (dn, R * dn)                                # lda, strideA
    assert (a[13], a[14]) == (H * (dn + P), dn + P)                     # ldb, strideB: q's token and head strides
    assert (a[18], a[19], a[20]) == (H * R, R, H)                       # ldc, strideC, heads


def test_mla_gather_latent_launch_args(launches):
    q_lens, ctx, bs = [7, 1, 33], [7, 40, 300], 16
    _, _, cache = _mla_inputs(sum(q_lens), 16, ctx, bs)
    out, tables = mla.mla_gather_latent(cache, _batch(q_lens, ctx, bs))
    (call,) = launches
    assert out.shape == (sum(ctx), mla.ROW) and tables.shape == (3, 300) and tables.dtype == np.int32
    assert call.grid == (-(-300 // mla.GATHER_ROWS), 3) and call.block == mla.GATHER_ROWS * mla.ROW // 8


def test_mla_pack_heads_launch_args(launches):
    kv = aligned_empty((40, 3, 264), BF16)
    lat = aligned_empty((40, mla.ROW), BF16)
    out = mla.mla_pack_heads([(kv[:, :, :128], lat[:, mla.LATENT:]), (kv[:, :2, 128:256], None),
                              (kv[:, :, 4:16], lat[:, :4])], 256)
    assert out.shape == (40, 8, 256) and [c.grid for c in launches] == [(40,)] * 3
    assert [c.name for c in launches] == ["mla_pack_heads_v_bf16"] * 2 + ["mla_pack_heads_bf16"]   # words where whole
    assert int(launches[0].args[6]) == 0 and launches[1].args[4] is module.NULL   # a shared row; no b
    assert int(launches[0].args[3]) == 128 // 8 and int(launches[0].args[5]) == mla.ROW // 8   # counted in words
    assert int(launches[2].args[3]) == 12 and int(launches[2].args[9]) == 8 * 256
    with pytest.raises(ValueError, match="width"):
        mla.mla_pack_heads([(kv[:, :, :200], lat[:, mla.LATENT:])], 256)
